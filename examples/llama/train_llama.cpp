// Trains (or evaluates) a Llama-family causal LM with mantissa's Trainer, reading and writing
// Hugging Face model folders: the C++ counterpart of transformers' examples/pytorch/
// language-modeling/run_clm.py, with its flags beside the TrainingArguments flags.
//
//   train_llama --model_name_or_path ./my-llama --train_file train.tok --validation_file val.tok
//               --block_size 512 --do_train --do_eval --bf16 --output_dir out
//   train_llama --config_name tiny.json --train_file /usr/share/doc/jargon-text/jargon.txt.gz
//               --block_size 128 --do_train --do_eval --max_steps 100 --output_dir out
//
// --model_name_or_path is a folder with config.json and model.safetensors (or the sharded
// model.safetensors.index.json layout); --config_name a config.json (or a folder holding one)
// for a fresh random model. Data files: token files from prepare_tokens.py, or any other file
// read as bytes (ids 0-255; .gz decompressed). The ids are concatenated and cut into
// --block_size rows, the remainder dropped; labels are the inputs (the model shifts them).
// Without --validation_file, the first --validation_split_percentage percent of the training
// file's ids are held out (run_clm holds out the first rows the same way).
//
// The output folder ends with what from_pretrained reads (config.json, model.safetensors or
// shards above --max_shard_size), training_args.json, and eval_results.json (eval_loss,
// perplexity) after --do_eval.
#include <cmath>
#include <cstdio>
#include <iostream>
#include <limits>
#include <memory>
#include <string>

#include <torch/torch.h>
#include <nlohmann/json.hpp>

#include <mantissa/argument_parser.h>
#include <mantissa/trainer.h>
#include <mantissa/training_arguments.h>

#include "../common/example_flags.h"
#include "hf_checkpoint.h"
#include "io/atomic_file.h"
#include "io/filesystem.h"
#include "llama_model.h"
#include "token_data.h"

namespace {

using namespace mantissa::examples::llama;

struct ClmFlags {
  std::string model_name_or_path;
  std::string config_name;
  std::string train_file;
  std::string validation_file;
  std::int64_t validation_split_percentage = 5;
  std::int64_t block_size = 0;
  std::int64_t max_train_samples = 0;
  std::int64_t max_eval_samples = 0;
  bool do_train = false;
  bool do_eval = false;
  std::string model_dtype = "fp32";
  bool fused_linear_cross_entropy = false;
  std::int64_t linear_cross_entropy_chunk_size = 0;
  std::string max_shard_size = "50GB";

  void add_to(CLI::App& app) {
    app.add_option("--model_name_or_path", model_name_or_path,
                   "Folder with config.json and model.safetensors (or its sharded index) to "
                   "start from");
    app.add_option("--config_name", config_name,
                   "config.json (or a folder holding one) for a model trained from scratch");
    app.add_option("--train_file", train_file,
                   "Token file from prepare_tokens.py, or any file read as bytes (.gz too)");
    app.add_option("--validation_file", validation_file, "The same, for evaluation");
    app.add_option("--validation_split_percentage", validation_split_percentage,
                   "Without --validation_file: the percentage of the training ids held out")
        ->capture_default_str();
    app.add_option("--block_size", block_size,
                   "Tokens per example (0: the smaller of 1024 and max_position_embeddings)")
        ->capture_default_str();
    app.add_option("--max_train_samples", max_train_samples,
                   "Keep only the first N training blocks (0: all)")
        ->capture_default_str();
    app.add_option("--max_eval_samples", max_eval_samples,
                   "Keep only the first N evaluation blocks (0: all)")
        ->capture_default_str();
    app.add_flag("--do_train", do_train, "Train on --train_file");
    app.add_flag("--do_eval", do_eval, "Evaluate: eval_loss and perplexity");
    mantissa::examples::add_model_dtype_option(app, model_dtype);
    app.add_flag("--fused_linear_cross_entropy", fused_linear_cross_entropy,
                 "Compute the loss with the LM head in chunks of rows "
                 "(mantissa::nn::linear_cross_entropy), never holding all the logits");
    app.add_option("--linear_cross_entropy_chunk_size", linear_cross_entropy_chunk_size,
                   "Rows per chunk of --fused_linear_cross_entropy (0: chosen from the sizes)")
        ->capture_default_str();
    app.add_option("--max_shard_size", max_shard_size,
                   "Largest weight file of the saved model before it is sharded (5GB, 500MB, ...)")
        ->capture_default_str();
  }
};

LlamaConfig read_config(const ClmFlags& flags) {
  TORCH_CHECK_VALUE(flags.model_name_or_path.empty() != flags.config_name.empty(),
                    "pass exactly one of --model_name_or_path (a model folder to start from) and "
                    "--config_name (a config.json for a fresh model)");
  auto path = flags.model_name_or_path.empty() ? flags.config_name : flags.model_name_or_path;
  if (mantissa::io::is_directory(path)) path = mantissa::io::join_path(path, "config.json");
  TORCH_CHECK_VALUE(mantissa::io::path_exists(path), "config file '", path, "' does not exist");
  return LlamaConfig::from_json_file(path);
}

// Checks that the ids fit the model's vocabulary (one max over the ids, on the CPU).
void check_vocabulary(const TokenIds& data, const std::string& path, const LlamaConfig& config) {
  const auto largest = data.ids.max().item<std::int64_t>();
  TORCH_CHECK_VALUE(largest < config.vocab_size, "'", path, "' holds token id ", largest,
                    ", but the model's vocab_size is ", config.vocab_size,
                    data.from_token_file ? " (was it tokenized for another model?)"
                                         : " (a file read as bytes needs vocab_size >= 256)");
}

// The metrics as HF's save_metrics writes them: sorted keys, indented by 4.
void write_metrics(const std::string& dir, const std::string& name, const mantissa::LogEntry& m) {
  nlohmann::json json = nlohmann::json::object();
  for (const auto& [key, value] : m) json[key] = value;
  mantissa::io::write_file_atomically(mantissa::io::join_path(dir, name), json.dump(4) + "\n");
}

void log_metrics(const std::string& split, const mantissa::LogEntry& metrics) {
  std::printf("***** %s metrics *****\n", split.c_str());
  for (const auto& [key, value] : metrics) std::printf("  %-24s = %.6g\n", key.c_str(), value);
}

}  // namespace

int main(int argc, char** argv) try {
  mantissa::ArgumentParser parser(
      "Trains or evaluates a Llama-family causal LM from a Hugging Face model folder or config "
      "(run_clm.py's flags beside the TrainingArguments).",
      "train_llama");
  ClmFlags flags;
  flags.add_to(parser.app());
  const auto args = parser.parse(argc, argv);
  TORCH_CHECK_VALUE(flags.do_train || flags.do_eval,
                    "nothing to do: pass --do_train and/or --do_eval (as run_clm.py)");
  TORCH_CHECK_VALUE(!flags.do_train || !flags.train_file.empty(), "--do_train needs --train_file");
  TORCH_CHECK_VALUE(!flags.train_file.empty() || !flags.validation_file.empty(),
                    "--do_eval needs --validation_file (or --train_file to hold out a part of)");
  TORCH_CHECK_VALUE(
      flags.validation_split_percentage > 0 && flags.validation_split_percentage < 100,
      "validation_split_percentage must be in 1..99, got ", flags.validation_split_percentage);
  TORCH_CHECK_VALUE(flags.max_train_samples >= 0 && flags.max_eval_samples >= 0,
                    "max_train_samples and max_eval_samples must be >= 0");
  TORCH_CHECK_VALUE(flags.linear_cross_entropy_chunk_size >= 0,
                    "linear_cross_entropy_chunk_size must be >= 0, got ",
                    flags.linear_cross_entropy_chunk_size);
  const auto max_shard_size = parse_shard_size(flags.max_shard_size);

  const auto config = read_config(flags);
  auto block_size = flags.block_size;
  if (block_size == 0) block_size = std::min<std::int64_t>(1024, config.max_position_embeddings);
  TORCH_CHECK_VALUE(block_size > 0 && block_size <= config.max_position_embeddings, "block_size ",
                    block_size, " must be in 1..max_position_embeddings (",
                    config.max_position_embeddings, ")");

  // The data: the training file's ids, and the evaluation ids (the validation file's, or the
  // first percent of the training ids).
  torch::Tensor train_ids, eval_ids;
  if (!flags.train_file.empty()) {
    const auto data = read_token_ids(flags.train_file);
    check_vocabulary(data, flags.train_file, config);
    train_ids = data.ids;
  }
  if (!flags.validation_file.empty()) {
    const auto data = read_token_ids(flags.validation_file);
    check_vocabulary(data, flags.validation_file, config);
    eval_ids = data.ids;
  } else {
    const auto held_out = train_ids.numel() * flags.validation_split_percentage / 100;
    eval_ids = train_ids.narrow(0, 0, held_out);
    train_ids = train_ids.narrow(0, held_out, train_ids.numel() - held_out);
  }
  TokenBlocks eval_blocks(eval_ids, block_size, flags.max_eval_samples);
  TokenBlocks train_blocks(train_ids.defined() ? train_ids : eval_ids, block_size,
                           flags.max_train_samples);
  TORCH_CHECK_VALUE(!flags.do_train || *train_blocks.size() > 0, "the training data (",
                    train_ids.defined() ? train_ids.numel() : 0,
                    " ids) is shorter than one block of ", block_size, " tokens");
  TORCH_CHECK_VALUE(!flags.do_eval || *eval_blocks.size() > 0, "the evaluation data (",
                    eval_ids.numel(), " ids) is shorter than one block of ", block_size,
                    " tokens; pass a longer --validation_file, a larger "
                    "--validation_split_percentage or a smaller --block_size");

  torch::manual_seed(static_cast<std::uint64_t>(args.seed()));
  LlamaForCausalLM model(config);
  if (!flags.model_name_or_path.empty()) load_pretrained(model, flags.model_name_or_path);
  model->fused_linear_cross_entropy = flags.fused_linear_cross_entropy;
  model->linear_cross_entropy_chunk_size = flags.linear_cross_entropy_chunk_size;
  model->to(mantissa::examples::model_dtype_of(flags.model_dtype));
  std::int64_t n_params = 0;
  for (const auto& p : model->parameters()) n_params += p.numel();
  std::printf(
      "train_llama: model %s: %lld layers, %lld heads (%lld key/value), %lld wide, "
      "vocab %lld, rope %s, %s embeddings: %.2fM parameters\n",
      flags.model_name_or_path.empty() ? "from config (random init)"
                                       : flags.model_name_or_path.c_str(),
      static_cast<long long>(config.num_hidden_layers),
      static_cast<long long>(config.num_attention_heads),
      static_cast<long long>(config.num_key_value_heads),
      static_cast<long long>(config.hidden_size), static_cast<long long>(config.vocab_size),
      rope_type_name(config.rope.rope_type), config.tie_word_embeddings ? "tied" : "untied",
      n_params / 1e6);
  std::printf("train_llama: block_size %lld: %zu training blocks, %zu evaluation blocks\n",
              static_cast<long long>(block_size), *train_blocks.size(), *eval_blocks.size());
  const auto eval_samples = static_cast<double>(*eval_blocks.size());
  const auto train_samples = static_cast<double>(*train_blocks.size());

  mantissa::Trainer trainer(model, args, std::move(train_blocks), std::move(eval_blocks));
  const bool saves = trainer.state().is_world_process_zero;

  mantissa::LogEntry all_results;
  if (flags.do_train) {
    const auto result = trainer.train();  // --resume_from_checkpoint is read there
    auto metrics = result.metrics;
    metrics["train_samples"] = train_samples;
    const double tokens_per_second =
        metrics.at("train_samples_per_second") * static_cast<double>(block_size);
    std::printf("train_llama: %lld steps in %.1f s (%.0f tokens/s)\n",
                static_cast<long long>(result.global_step), metrics.at("train_runtime"),
                tokens_per_second);
    log_metrics("train", metrics);
    // Every process hands over its part (under full sharding the parameters are shards).
    std::vector<std::pair<std::string, torch::Tensor>> weights;
    const auto parameters = model->named_parameters();
    for (const auto& [name, tensor] : trainer.model_state_dict()) {
      if (parameters.find(name) != nullptr) weights.emplace_back(name, tensor);
    }
    if (saves) {
      save_pretrained(model->config, weights, args.output_dir(), max_shard_size);
      args.save_json(mantissa::io::join_path(args.output_dir(), "training_args.json"));
      write_metrics(args.output_dir(), "train_results.json", metrics);
    }
    all_results.insert(metrics.begin(), metrics.end());
  }
  if (flags.do_eval) {
    auto metrics = trainer.evaluate();
    metrics["eval_samples"] = eval_samples;
    const double loss = metrics.at("eval_loss");
    // run_clm reports an overflowing exponential as infinity.
    metrics["perplexity"] = loss < std::log(std::numeric_limits<double>::max())
                                ? std::exp(loss)
                                : std::numeric_limits<double>::infinity();
    std::printf("train_llama: eval_loss %.6f, perplexity %.4f\n", loss, metrics.at("perplexity"));
    log_metrics("eval", metrics);
    if (saves) {
      mantissa::io::create_directories(args.output_dir());
      write_metrics(args.output_dir(), "eval_results.json", metrics);
    }
    all_results.insert(metrics.begin(), metrics.end());
  }
  if (saves) write_metrics(args.output_dir(), "all_results.json", all_results);
  return 0;
} catch (const c10::Error& e) {  // the message without LibTorch's C++ backtrace
  std::cerr << "train_llama: error: " << e.what_without_backtrace() << "\n";
  return 1;
} catch (const std::exception& e) {
  std::cerr << "train_llama: error: " << e.what() << "\n";
  return 1;
}
