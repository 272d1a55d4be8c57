#include <mantissa/io/pretrained_weights.h>

#include <cctype>
#include <cstdio>
#include <map>
#include <set>

#include <c10/util/Exception.h>
#include <nlohmann/json.hpp>

#include <mantissa/io/safetensors.h>

#include "io/atomic_file.h"
#include "io/filesystem.h"

namespace mantissa::io {
namespace {

constexpr const char* kSingleFile = "model.safetensors";
constexpr const char* kIndexFile = "model.safetensors.index.json";

std::string shard_name(std::size_t index, std::size_t count) {
  char name[64];
  std::snprintf(name, sizeof name, "model-%05zu-of-%05zu.safetensors", index, count);
  return name;
}

bool is_shard_name(const std::string& name) {
  unsigned a = 0, b = 0;
  char tail[32] = {};
  return std::sscanf(name.c_str(), "model-%5u-of-%5u.%31s", &a, &b, tail) == 3 &&
         std::string(tail) == "safetensors";
}

}  // namespace

std::int64_t parse_shard_size(const std::string& text) {
  const auto refuse = [&] {
    TORCH_CHECK_VALUE(false, "max_shard_size \"", text,
                      "\" is not a positive size (a byte count, or a number with KB, MB, GB, "
                      "KiB, MiB, GiB)");
  };
  std::size_t used = 0;
  double value = 0;
  try {
    value = std::stod(text, &used);
  } catch (const std::exception&) {
    refuse();
  }
  auto unit = text.substr(used);
  for (auto& ch : unit) ch = static_cast<char>(std::toupper(static_cast<unsigned char>(ch)));
  const std::map<std::string, double> units = {
      {"", 1},     {"B", 1},        {"KB", 1e3},        {"MB", 1e6},
      {"GB", 1e9}, {"KIB", 1024.0}, {"MIB", 1048576.0}, {"GIB", 1073741824.0}};
  const auto it = units.find(unit);
  if (it == units.end() || !(value * it->second >= 1) || !(value * it->second < 9e18)) refuse();
  return static_cast<std::int64_t>(value * it->second);
}

std::vector<std::string> save_pretrained_weights(const std::string& dir,
                                                 const NamedTensors& tensors,
                                                 std::int64_t max_shard_size) {
  TORCH_CHECK_VALUE(max_shard_size > 0, "max_shard_size must be positive, got ", max_shard_size);
  TORCH_CHECK_VALUE(!tensors.empty(), "save_pretrained_weights: no tensors to save in '", dir, "'");
  create_directories(dir);
  std::vector<NamedTensors> shards(1);
  std::int64_t shard_bytes = 0, total_bytes = 0, total_numel = 0;
  for (const auto& item : tensors) {
    const auto bytes = static_cast<std::int64_t>(item.second.nbytes());
    if (!shards.back().empty() && shard_bytes + bytes > max_shard_size) {
      shards.emplace_back();
      shard_bytes = 0;
    }
    shards.back().push_back(item);
    shard_bytes += bytes;
    total_bytes += bytes;
    total_numel += item.second.numel();
  }
  // Weight files of an earlier save that this layout does not use, removed before the file a
  // loader looks for first is written (model.safetensors, or the index): stopped in between,
  // the folder holds no complete set rather than a stale one that loads.
  const auto remove_others = [&](const std::vector<std::string>& kept_names) {
    const std::set<std::string> kept(kept_names.begin(), kept_names.end());
    for (const auto& name : list_directory(dir)) {
      const bool weights = name == kSingleFile || name == kIndexFile || is_shard_name(name);
      if (weights && kept.count(name) == 0) remove_all(join_path(dir, name));
    }
  };
  std::vector<std::string> written;
  const std::map<std::string, std::string> metadata = {{"format", "pt"}};
  if (shards.size() == 1) {
    remove_others({kSingleFile});
    save_safetensors(join_path(dir, kSingleFile), tensors, metadata);
    written.push_back(kSingleFile);
    return written;
  }
  auto weight_map = nlohmann::ordered_json::object();
  for (std::size_t i = 0; i < shards.size(); ++i) {
    const auto name = shard_name(i + 1, shards.size());
    save_safetensors(join_path(dir, name), shards[i], metadata);
    for (const auto& item : shards[i]) weight_map[item.first] = name;
    written.push_back(name);
  }
  remove_others(written);
  const nlohmann::ordered_json index = {
      {"metadata", {{"total_parameters", total_numel}, {"total_size", total_bytes}}},
      {"weight_map", weight_map}};
  write_file_atomically(join_path(dir, kIndexFile), index.dump(2) + "\n");
  written.push_back(kIndexFile);
  return written;
}

}  // namespace mantissa::io
