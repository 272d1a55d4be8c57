// The C++ half of the parity test against transformers (test_llama_parity.py runs it):
//
//   llama_parity MODEL_DIR BATCHES OUT [--save_dir DIR] [--max_shard_size SIZE]
//
// loads LlamaForCausalLM from MODEL_DIR (config.json and HF's weights), then, with the
// tensors of BATCHES (a safetensors file: input_ids and labels [steps, batch, time], eval_ids
// [batch, time], and 0-d learning_rate and weight_decay), writes to OUT (safetensors):
//   logits      the logits of input_ids[0] before any step
//   loss        its loss, and grad.<name> every parameter's gradient after one backward
//   losses      the loss of each of the `steps` torch::optim::AdamW steps, one per batch
//   final.<name> every parameter after them
//   eval_loss   the loss of eval_ids (labels = inputs) after them
// and, with --save_dir, saves the trained model there with save_pretrained. With
// --fused_linear_cross_entropy the losses come from mantissa::nn::linear_cross_entropy (in
// chunks of 7 rows).
#include <cstdio>
#include <iostream>
#include <map>
#include <string>
#include <vector>

#include <torch/torch.h>

#include <mantissa/io/safetensors.h>

#include "hf_checkpoint.h"
#include "llama_model.h"

namespace {

using namespace mantissa::examples::llama;

std::map<std::string, torch::Tensor> read_map(const std::string& path) {
  std::map<std::string, torch::Tensor> out;
  for (auto& item : mantissa::io::load_safetensors(path)) out.emplace(item.first, item.second);
  return out;
}

torch::Tensor loss_of(LlamaForCausalLM& model, const torch::Tensor& ids,
                      const torch::Tensor& labels) {
  return model->forward(mantissa::Batch{{"input_ids", ids}, {"labels", labels}}).loss;
}

}  // namespace

int main(int argc, char** argv) try {
  TORCH_CHECK_VALUE(argc >= 4,
                    "usage: llama_parity MODEL_DIR BATCHES OUT [--save_dir DIR] "
                    "[--max_shard_size SIZE] [--fused_linear_cross_entropy]");
  const std::string model_dir = argv[1], batches_path = argv[2], out_path = argv[3];
  std::string save_dir;
  std::int64_t max_shard_size = kDefaultMaxShardSize;
  bool fused_loss = false;
  for (int i = 4; i < argc; i += 2) {
    const std::string flag = argv[i];
    if (flag == "--fused_linear_cross_entropy") {
      fused_loss = true;
      --i;  // a flag without a value
      continue;
    }
    TORCH_CHECK_VALUE(i + 1 < argc, "flag ", flag, " needs a value");
    if (flag == "--save_dir") {
      save_dir = argv[i + 1];
    } else if (flag == "--max_shard_size") {
      max_shard_size = parse_shard_size(argv[i + 1]);
    } else {
      TORCH_CHECK_VALUE(false, "unknown flag ", flag);
    }
  }

  const auto config = LlamaConfig::from_json_file(model_dir + "/config.json");
  LlamaForCausalLM model(config);
  load_pretrained(model, model_dir);
  model->fused_linear_cross_entropy = fused_loss;
  model->linear_cross_entropy_chunk_size = fused_loss ? 7 : 0;  // several chunks, one partial
  model->train();
  auto batches = read_map(batches_path);
  const auto& input_ids = batches.at("input_ids");
  const auto& labels = batches.at("labels");
  const auto steps = input_ids.size(0);

  std::vector<std::pair<std::string, torch::Tensor>> out;
  {
    auto output =
        model->forward(mantissa::Batch{{"input_ids", input_ids[0]}, {"labels", labels[0]}});
    output.loss.backward();
    if (fused_loss) {  // the fused loss returns no logits: the plain forward gives them
      torch::NoGradGuard no_grad;
      output.logits = model->forward(input_ids[0]);
    }
    out.emplace_back("logits", output.logits.detach());
    out.emplace_back("loss", output.loss.detach());
    for (const auto& item : model->named_parameters()) {
      out.emplace_back("grad." + item.key(), item.value().grad().clone());
    }
  }

  torch::optim::AdamW optimizer(
      model->parameters(), torch::optim::AdamWOptions(batches.at("learning_rate").item<double>())
                               .weight_decay(batches.at("weight_decay").item<double>()));
  auto losses = torch::empty({steps});
  for (std::int64_t step = 0; step < steps; ++step) {
    optimizer.zero_grad();
    auto loss = loss_of(model, input_ids[step], labels[step]);
    loss.backward();
    optimizer.step();
    losses[step] = loss.detach();
  }
  out.emplace_back("losses", losses);
  for (const auto& item : model->named_parameters()) {
    out.emplace_back("final." + item.key(), item.value().detach().clone());
  }
  {
    torch::NoGradGuard no_grad;
    model->eval();
    const auto& eval_ids = batches.at("eval_ids");
    out.emplace_back("eval_loss", loss_of(model, eval_ids, eval_ids));
  }
  mantissa::io::save_safetensors(out_path, out);
  if (!save_dir.empty()) save_pretrained(model, save_dir, max_shard_size);
  std::printf("llama_parity: %lld steps, last loss %.6f\n", static_cast<long long>(steps),
              losses[steps - 1].item<double>());
  return 0;
} catch (const c10::Error& e) {
  std::cerr << "llama_parity: error: " << e.what_without_backtrace() << "\n";
  return 1;
} catch (const std::exception& e) {
  std::cerr << "llama_parity: error: " << e.what() << "\n";
  return 1;
}
