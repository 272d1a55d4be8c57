// A user's program built against the installed package: (1) one overflowing step through
// GradScaler must halve the scale and leave the weights alone; (2) the Trainer trains a model
// with two inputs (token ids and an attention mask, padded by a collator) whose forward
// returns its own loss, with padding-masked attention (mantissa::nn::MultiheadAttention) under
// --bf16, keeps the best checkpoint and loads it at the end, and predicts.
#include <cmath>
#include <cstdio>
#include <iostream>
#include <limits>
#include <vector>

#include <torch/torch.h>

#include <mantissa/mantissa.h>

namespace {

bool scaler_skips_an_overflow() {
  torch::nn::Linear model(4, 2);
  torch::optim::SGD optimizer(model->parameters(), torch::optim::SGDOptions(0.1));
  mantissa::amp::GradScaler scaler;
  const auto before = model->weight.clone();
  auto loss = model->forward(torch::ones({3, 4})).sum();
  scaler.scale(loss).backward();
  model->weight.mutable_grad()[0][0].fill_(std::numeric_limits<float>::infinity());
  scaler.step(optimizer);
  scaler.update();
  const bool unchanged = torch::equal(before, model->weight);
  std::cout << "consumer: scale " << scaler.get_scale() << " after an overflow, weights "
            << (unchanged ? "unchanged" : "CHANGED") << ", mantissa " << MANTISSA_VERSION << "\n";
  return unchanged && scaler.get_scale() == 32768.0;
}

// Sentences of token ids 1..5 (0 pads); the class says whether token 1 outnumbers token 2.
struct Sentence {
  std::vector<int64_t> ids;
  int64_t label = 0;
};

struct Sentences : torch::data::datasets::Dataset<Sentences, Sentence> {
  Sentences(int64_t n, uint64_t seed) {
    auto gen = at::detail::createCPUGenerator(seed);
    for (int64_t i = 0; i < n; ++i) {
      const auto ids = torch::randint(1, 6, {2 + i % 9}, gen);
      Sentence s;
      s.ids.assign(ids.data_ptr<int64_t>(), ids.data_ptr<int64_t>() + ids.numel());
      s.label = (ids == 1).sum().item<int64_t>() > (ids == 2).sum().item<int64_t>() ? 1 : 0;
      all.push_back(std::move(s));
    }
  }
  Sentence get(size_t i) override { return all.at(i); }
  torch::optional<size_t> size() const override { return all.size(); }
  std::vector<Sentence> all;
};

mantissa::Batch pad(const std::vector<Sentence>& sentences) {
  int64_t longest = 0;
  for (const auto& s : sentences) longest = std::max<int64_t>(longest, s.ids.size());
  const auto n = static_cast<int64_t>(sentences.size());
  auto ids = torch::zeros({n, longest}, torch::kLong);
  auto mask = torch::zeros({n, longest}, torch::kLong);
  auto labels = torch::empty({n}, torch::kLong);
  for (int64_t i = 0; i < n; ++i) {
    const auto& s = sentences[static_cast<size_t>(i)];
    const auto length = static_cast<int64_t>(s.ids.size());
    ids[i].narrow(0, 0, length).copy_(torch::tensor(s.ids));
    mask[i].narrow(0, 0, length).fill_(1);
    labels[i] = s.label;
  }
  return {{"input_ids", ids}, {"attention_mask", mask}, {"labels", labels}};
}

// Embedding, one padding-masked attention block (residual), masked mean pool, linear head.
struct ClassifierImpl : torch::nn::Module {
  torch::nn::Embedding embed{register_module("embed", torch::nn::Embedding(6, 16))};
  mantissa::nn::MultiheadAttention attention{register_module(
      "attention", mantissa::nn::MultiheadAttention(torch::nn::MultiheadAttentionOptions(16, 2),
                                                    /*batch_first=*/true))};
  torch::nn::Linear head{register_module("head", torch::nn::Linear(16, 2))};

  mantissa::ModelOutput forward(const mantissa::Batch& batch) {
    const auto& attention_mask = batch["attention_mask"];
    const auto x = embed(batch["input_ids"]);
    const auto h = x + std::get<0>(attention(x, x, x, attention_mask == 0, false));
    const auto mask = attention_mask.unsqueeze(-1).to(h.dtype());
    const auto logits = head((h * mask).sum(1) / mask.sum(1));
    if (!batch.contains("labels")) return logits;
    return {torch::nn::functional::cross_entropy(logits, batch["labels"]), logits};
  }
};
TORCH_MODULE(Classifier);

bool trainer_trains_a_two_input_model(const char* output_dir) {
  auto args = mantissa::TrainingArguments()
                  .output_dir(output_dir)
                  .overwrite_output_dir(true)
                  .use_cpu(true)
                  .bf16(true)
                  .max_steps(40)
                  .learning_rate(3e-2)
                  .per_device_train_batch_size(16)
                  .per_device_eval_batch_size(32)
                  .eval_strategy("steps")
                  .eval_steps(10)
                  .save_strategy("steps")
                  .save_steps(10)
                  .save_total_limit(1)
                  .load_best_model_at_end(true)
                  .metric_for_best_model("accuracy")
                  .logging_steps(10)
                  .disable_tqdm(true);
  mantissa::set_seed(args.seed());
  Classifier model;
  mantissa::Trainer trainer(model, args, mantissa::make_batch_source(Sentences(320, 1), pad),
                            mantissa::make_batch_source(Sentences(96, 2), pad));
  trainer.train();
  const auto best = trainer.state().best_metric.value_or(-1);
  const auto out = trainer.predict(mantissa::make_batch_source(Sentences(96, 2), pad), "check");
  const auto accuracy = out.metrics.at("check_accuracy");
  std::printf("consumer: trainer best eval_accuracy %.4f at step %lld, predict %s accuracy %.4f\n",
              best, static_cast<long long>(trainer.state().best_global_step.value_or(-1)),
              c10::str(out.predictions.sizes()).c_str(), accuracy);
  // The best checkpoint's weights are loaded: predicting its eval set gives its accuracy.
  return std::abs(accuracy - best) < 1e-9 && best > 0.6 && out.predictions.size(0) == 96;
}

}  // namespace

int main(int argc, char** argv) {
  const bool scaler_ok = scaler_skips_an_overflow();
  const bool trainer_ok = trainer_trains_a_two_input_model(argc > 1 ? argv[1] : "consumer_output");
  if (scaler_ok && trainer_ok) std::cout << "consumer: all checks passed\n";
  return scaler_ok && trainer_ok ? 0 : 1;
}
