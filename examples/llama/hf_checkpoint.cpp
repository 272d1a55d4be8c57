#include "hf_checkpoint.h"

#include <cctype>
#include <cstdio>
#include <map>
#include <set>
#include <sstream>
#include <utility>
#include <vector>

#include <torch/torch.h>

#include <mantissa/io/pretrained_weights.h>
#include <mantissa/io/safetensors.h>

#include "io/atomic_file.h"
#include "io/filesystem.h"
#include "io/json_reader.h"

namespace mantissa::examples::llama {
namespace {

using Json = nlohmann::ordered_json;
constexpr const char* kSingleFile = "model.safetensors";
constexpr const char* kIndexFile = "model.safetensors.index.json";

using Parameters = std::map<std::string, torch::Tensor>;

Parameters parameters_of(const LlamaForCausalLM& model) {
  Parameters out;
  for (const auto& item : model->named_parameters()) out.emplace(item.key(), item.value());
  for (const auto& item : model->named_buffers()) out.emplace(item.key(), item.value());
  return out;
}

// A stored tensor a tied model leaves out: HF drops the LM head's copy of the embedding.
bool ignored(const LlamaForCausalLM& model, const std::string& name) {
  return model->config.tie_word_embeddings && name == "lm_head.weight";
}

std::string join_names(const std::vector<std::string>& names) {
  std::ostringstream out;
  for (std::size_t i = 0; i < names.size() && i < 8; ++i)
    out << (i ? ", " : "") << '"' << names[i] << '"';
  if (names.size() > 8) out << " and " << names.size() - 8 << " more";
  return out.str();
}

// Checks that the names a checkpoint stores are exactly the model's (apart from `ignored`).
void check_names(const LlamaForCausalLM& model, const Parameters& params,
                 const std::set<std::string>& stored, const std::string& where) {
  std::vector<std::string> missing, unexpected;
  for (const auto& [name, tensor] : params) {
    if (!stored.count(name)) missing.push_back(name);
  }
  for (const auto& name : stored) {
    if (!params.count(name) && !ignored(model, name)) unexpected.push_back(name);
  }
  TORCH_CHECK(missing.empty(), where, ": the checkpoint lacks ", missing.size(),
              " tensor(s) of the model: ", join_names(missing),
              " (is config.json the one these weights were saved with?)");
  TORCH_CHECK(unexpected.empty(), where, ": the checkpoint holds ", unexpected.size(),
              " tensor(s) this LlamaForCausalLM does not have: ", join_names(unexpected),
              " (a model of another architecture, or another config.json?)");
}

// Copies one file's tensors into the parameters after checking all their shapes.
void copy_file(const LlamaForCausalLM& model, const Parameters& params, const std::string& path,
               const std::set<std::string>* expected) {
  const auto tensors = io::load_safetensors(path);
  for (const auto& [name, tensor] : tensors) {
    if (ignored(model, name)) continue;
    TORCH_CHECK(!expected || expected->count(name), path, ": holds \"", name, "\", which ",
                kIndexFile, " does not assign to this file");
    const auto it = params.find(name);
    TORCH_CHECK(it != params.end(), path, ": holds \"", name,
                "\", which this LlamaForCausalLM does not have");
    TORCH_CHECK(tensor.sizes() == it->second.sizes(), path, ": size mismatch for ", name,
                ": the checkpoint has shape ", tensor.sizes(), ", the model ", it->second.sizes(),
                " (config.json and the weights disagree)");
    TORCH_CHECK(tensor.is_floating_point(), path, ": \"", name, "\" holds ", tensor.scalar_type(),
                " values; a parameter needs floating-point ones");
  }
  torch::NoGradGuard no_grad;
  for (const auto& [name, tensor] : tensors) {
    if (!ignored(model, name)) params.at(name).copy_(tensor);
  }
}

// The index's weight_map: tensor name -> shard file name (a plain name inside the folder).
std::map<std::string, std::string> read_weight_map(const std::string& path) {
  const auto bytes = io::read_file(path, /*max_bytes=*/64u << 20);
  Json json;
  try {
    json = io::parse_json_text<Json>(std::string_view(bytes.data(), bytes.size()));
  } catch (const io::JsonTextError& e) {
    TORCH_CHECK(false, path, ": not a JSON file: ", e.what());
  }
  TORCH_CHECK(json.is_object() && json.contains("weight_map") && json["weight_map"].is_object(),
              path, ": needs an object \"weight_map\" of tensor name -> shard file");
  std::map<std::string, std::string> map;
  for (const auto& [name, file] : json["weight_map"].items()) {
    TORCH_CHECK(file.is_string(), path, ": the shard of \"", name, "\" must be a file name, got ",
                io::describe_json(file));
    const auto shard = file.get<std::string>();
    TORCH_CHECK(
        !shard.empty() && shard.find('/') == std::string::npos && shard != "." && shard != "..",
        path, ": the shard of \"", name, "\" must be a file name inside the folder, got \"", shard,
        "\"");
    map.emplace(name, shard);
  }
  return map;
}

}  // namespace

bool has_pretrained_weights(const std::string& dir) {
  return io::path_exists(io::join_path(dir, kSingleFile)) ||
         io::path_exists(io::join_path(dir, kIndexFile));
}

void load_pretrained(LlamaForCausalLM& model, const std::string& dir) {
  const auto params = parameters_of(model);
  const auto single = io::join_path(dir, kSingleFile);
  if (io::path_exists(single)) {
    std::set<std::string> stored;
    // The header alone would do for the names, but the tensors are needed next anyway.
    const auto tensors = io::load_safetensors(single);
    for (const auto& item : tensors) stored.insert(item.first);
    check_names(model, params, stored, single);
    copy_file(model, params, single, nullptr);
    return;
  }
  const auto index = io::join_path(dir, kIndexFile);
  TORCH_CHECK(io::path_exists(index), "'", dir, "' holds neither ", kSingleFile, " nor ",
              kIndexFile, " (the weights save_pretrained writes)");
  const auto weight_map = read_weight_map(index);
  std::set<std::string> stored;
  std::map<std::string, std::set<std::string>> by_shard;
  for (const auto& [name, shard] : weight_map) {
    stored.insert(name);
    by_shard[shard].insert(name);
  }
  check_names(model, params, stored, index);
  for (const auto& [shard, names] : by_shard) {
    copy_file(model, params, io::join_path(dir, shard), &names);
  }
}

void save_pretrained(const LlamaForCausalLM& model, const std::string& dir,
                     std::int64_t max_shard_size) {
  std::vector<std::pair<std::string, torch::Tensor>> tensors;
  for (const auto& item : model->named_parameters()) tensors.emplace_back(item.key(), item.value());
  save_pretrained(model->config, tensors, dir, max_shard_size);
}

void save_pretrained(const LlamaConfig& config,
                     const std::vector<std::pair<std::string, torch::Tensor>>& tensors,
                     const std::string& dir, std::int64_t max_shard_size) {
  TORCH_CHECK_VALUE(!tensors.empty(), "save_pretrained: no weights to save");
  io::save_pretrained_weights(dir, tensors, max_shard_size);
  io::write_file_atomically(io::join_path(dir, "config.json"),
                            config.to_json(tensors.front().second.scalar_type()).dump(2) + "\n");
}

}  // namespace mantissa::examples::llama
