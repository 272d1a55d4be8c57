// A character-level GPT trained on the Jargon File with mantissa's Trainer.
//
//   char_gpt --bf16 --max_steps 300 --learning_rate 1e-3 --model_size tiny
//   char_gpt --bf16 --master_weights on ...          # bf16 weights, fp32 master copies
//   char_gpt --model_size gpt2-small --bf16 ...      # the GPU benchmark's model (12 x 768, block
//   1024)
//
// The corpus: the Jargon File 4.4.7 (public domain), 1.6 M characters of English prose in one
// gzip-compressed UTF-8 file, from Debian's small `jargon-text` package (scripts/bootstrap
// installs it). The alternatives in Debian were worse fits: bible-kjv-text ships the Bible in
// its own compressed binary format (needs the `bible` program to decode), fortune-mod's
// `fortunes` spreads 2.5 MB over dozens of files with index files beside them, and the GNU
// manuals are GFDL with invariant sections (Debian's non-free). `--corpus` takes any UTF-8
// text file, plain or .gz; `--max_corpus_chars` takes a prefix of it (CI's smoke test).
//
// The vocabulary is the corpus's distinct characters (155 for the Jargon File). The last
// --val_fraction of the text is held out; training draws random windows of block_size + 1
// characters (the Trainer's seeded shuffle over every start position), evaluation scores the
// held-out text in non-overlapping windows and reports eval_loss (its exponential is the
// perplexity). Flags: Hugging Face TrainingArguments flags plus this program's own (--help lists
// both).
#include <cmath>
#include <cstdio>
#include <iostream>
#include <string>

#include <torch/torch.h>

#include <mantissa/argument_parser.h>
#include <mantissa/trainer.h>
#include <mantissa/training_arguments.h>

#include "../common/example_flags.h"
#include "corpus.h"
#include "model.h"
#include "shorten.h"  // the library's internal header (src/): a long --corpus path in messages

namespace {

using mantissa::examples::CharGpt;
using mantissa::examples::CharVocabulary;
using mantissa::examples::GptConfig;
using mantissa::examples::TokenWindows;

struct ProgramFlags {
  std::string corpus = mantissa::examples::kJargonFilePath;
  std::int64_t max_corpus_chars = 0;
  double val_fraction = 0.05;
  std::string model_size = "tiny";
  std::int64_t sample_chars = 200;
  std::string model_dtype = "fp32";
  bool fused_linear_cross_entropy = false;
  std::int64_t linear_cross_entropy_chunk_size = 0;
  GptConfig overrides;  // applied only for the flags given
  CLI::Option* n_layer = nullptr;
  CLI::Option* n_head = nullptr;
  CLI::Option* n_embd = nullptr;
  CLI::Option* block_size = nullptr;

  void add_to(CLI::App& app) {
    mantissa::examples::add_model_dtype_option(app, model_dtype);
    app.add_option("--corpus", corpus, "UTF-8 text file (plain or .gz) to train on")
        ->capture_default_str();
    app.add_option("--max_corpus_chars", max_corpus_chars,
                   "Use only the first N characters (0 = all)")
        ->capture_default_str();
    app.add_option("--val_fraction", val_fraction,
                   "Fraction of the text, at its end, held out for evaluation")
        ->capture_default_str();
    app.add_option("--model_size", model_size, "Preset: tiny, small or gpt2-small")
        ->capture_default_str();
    n_layer = app.add_option("--n_layer", overrides.n_layer,
                             "Transformer blocks (default: from --model_size)");
    n_head = app.add_option("--n_head", overrides.n_head,
                            "Attention heads (default: from --model_size)");
    n_embd = app.add_option("--n_embd", overrides.n_embd,
                            "Embedding width (default: from --model_size)");
    block_size = app.add_option("--block_size", overrides.block_size,
                                "Context length (default: from --model_size)");
    app.add_flag("--fused_linear_cross_entropy", fused_linear_cross_entropy,
                 "Compute the loss with the LM head in chunks of rows "
                 "(mantissa::nn::linear_cross_entropy), never holding all the logits");
    app.add_option("--linear_cross_entropy_chunk_size", linear_cross_entropy_chunk_size,
                   "Rows per chunk of --fused_linear_cross_entropy (0 = chosen from the sizes)")
        ->capture_default_str();
    app.add_option("--sample_chars", sample_chars,
                   "Characters to generate after training (0 = none)")
        ->capture_default_str();
  }

  GptConfig model_config(std::int64_t vocab_size) const {
    auto config = GptConfig::preset(model_size);
    if (*n_layer) config.n_layer = overrides.n_layer;
    if (*n_head) config.n_head = overrides.n_head;
    if (*n_embd) config.n_embd = overrides.n_embd;
    if (*block_size) config.block_size = overrides.block_size;
    config.vocab_size = vocab_size;
    config.validate();
    return config;
  }
};

double last_logged(const mantissa::TrainerState& state, const std::string& key) {
  for (auto it = state.log_history.rbegin(); it != state.log_history.rend(); ++it) {
    if (const auto found = it->find(key); found != it->end()) return found->second;
  }
  return std::nan("");
}

}  // namespace

int main(int argc, char** argv) try {
  mantissa::ArgumentParser parser(
      "Trains a character-level GPT on a text corpus with mantissa's Trainer.", "char_gpt");
  ProgramFlags flags;
  flags.add_to(parser.app());
  const auto args = parser.parse(argc, argv);
  TORCH_CHECK_VALUE(flags.val_fraction > 0 && flags.val_fraction < 1,
                    "val_fraction must be in (0, 1), got ", flags.val_fraction);
  TORCH_CHECK_VALUE(flags.sample_chars >= 0, "sample_chars must be >= 0, got ", flags.sample_chars);

  const auto text = mantissa::examples::read_corpus(flags.corpus, flags.max_corpus_chars);
  const auto shown_corpus = mantissa::detail::shorten_path(flags.corpus);
  const CharVocabulary vocabulary(text);
  const auto config = flags.model_config(vocabulary.size());
  const auto tokens = vocabulary.encode(text);
  const auto n_val = static_cast<std::int64_t>(
      std::ceil(static_cast<double>(tokens.numel()) * flags.val_fraction));
  TokenWindows train(tokens.narrow(0, 0, tokens.numel() - n_val), config.block_size, /*stride=*/1);
  TokenWindows validation(tokens.narrow(0, tokens.numel() - n_val, n_val), config.block_size,
                          config.block_size);
  // A window is block_size + 1 characters: "longer than block_size" says so without computing
  // block_size + 1, which overflows for a block_size near the int64 maximum.
  TORCH_CHECK_VALUE(*train.size() > 0 && *validation.size() > 0, "corpus '", shown_corpus,
                    "': ", tokens.numel(), " characters are too few for block_size ",
                    config.block_size, " (the training part, ", tokens.numel() - n_val,
                    " characters, and the held-out part, ", n_val,
                    ", must each be longer than block_size); use more text (--max_corpus_chars), a "
                    "larger --val_fraction or a smaller --block_size");

  torch::manual_seed(static_cast<std::uint64_t>(args.seed()));
  TORCH_CHECK_VALUE(flags.linear_cross_entropy_chunk_size >= 0,
                    "linear_cross_entropy_chunk_size must be >= 0, got ",
                    flags.linear_cross_entropy_chunk_size);
  CharGpt model(config);
  model->fused_linear_cross_entropy = flags.fused_linear_cross_entropy;
  model->linear_cross_entropy_chunk_size = flags.linear_cross_entropy_chunk_size;
  model->to(mantissa::examples::model_dtype_of(flags.model_dtype));
  std::int64_t n_params = 0;
  for (const auto& p : model->parameters()) n_params += p.numel();
  std::printf(
      "char_gpt: corpus %s: %lld characters, %lld distinct; train %lld, validation %lld (%zu "
      "windows)\n",
      shown_corpus.c_str(), static_cast<long long>(tokens.numel()),
      static_cast<long long>(vocabulary.size()), static_cast<long long>(tokens.numel() - n_val),
      static_cast<long long>(n_val), *validation.size());
  std::printf("char_gpt: model %lld layers, %lld heads, %lld wide, block %lld: %.2fM parameters\n",
              static_cast<long long>(config.n_layer), static_cast<long long>(config.n_head),
              static_cast<long long>(config.n_embd), static_cast<long long>(config.block_size),
              n_params / 1e6);

  // The model computes its own loss from the batch's labels (HF's causal-LM models do), so
  // the Trainer trains on it and evaluation reports it as eval_loss.
  mantissa::Trainer trainer(model, args, std::move(train), std::move(validation));

  const auto result = trainer.train();
  const auto metrics = trainer.evaluate();
  // Every example is block_size tokens: tokens/s = batch x block_size x steps / train time,
  // counting only this run's steps (not those before a resumed checkpoint).
  const double tokens_per_second =
      result.metrics.at("train_samples_per_second") * static_cast<double>(config.block_size);
  std::printf("char_gpt: %lld steps in %.1f s (%.0f tokens/s); last train loss %.4f\n",
              static_cast<long long>(result.global_step), result.metrics.at("train_runtime"),
              tokens_per_second, last_logged(trainer.state(), "loss"));
  std::printf("char_gpt: eval loss %.4f, perplexity %.3f\n", metrics.at("eval_loss"),
              std::exp(metrics.at("eval_loss")));

  if (flags.sample_chars > 0) {
    const auto prompt = tokens.narrow(0, tokens.numel() - n_val, 1)
                            .view({1, 1});  // held-out text's first character
    const auto sample = model->generate(prompt, flags.sample_chars, /*temperature=*/0.8);
    std::printf("char_gpt: sample:\n%s\n", vocabulary.decode(sample).c_str());
  }
  return 0;
} catch (const c10::Error& e) {  // the message without LibTorch's C++ backtrace
  std::cerr << "char_gpt: error: " << e.what_without_backtrace() << "\n";
  return 1;
} catch (const std::exception& e) {
  std::cerr << "char_gpt: error: " << e.what() << "\n";
  return 1;
}
