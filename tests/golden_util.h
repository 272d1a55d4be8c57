#pragma once
// Reading the reference files in tests/golden/ that Python scripts next to them wrote.

#include <cstdint>
#include <fstream>
#include <limits>
#include <map>
#include <stdexcept>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include "test_paths.h"

namespace mantissa_test {

/// The parsed JSON of tests/golden/<name>, read once per test binary.
inline const nlohmann::json& golden_file(const std::string& name) {
  static std::map<std::string, nlohmann::json> cache;
  auto it = cache.find(name);
  if (it == cache.end()) {
    const std::string path = test_data_dir() + "/" + name;
    std::ifstream in(path);
    if (!in) throw std::runtime_error("cannot open " + path);
    it = cache.emplace(name, nlohmann::json::parse(in)).first;
  }
  return it->second;
}

/// A number of a golden file: a JSON number, or "nan", "inf" or "-inf".
inline double golden_number(const nlohmann::json& v) {
  if (v.is_string()) {
    const std::string s = v.get<std::string>();
    if (s == "nan") return std::numeric_limits<double>::quiet_NaN();
    return s == "inf" ? std::numeric_limits<double>::infinity()
                      : -std::numeric_limits<double>::infinity();
  }
  return v.get<double>();
}

/// The dtype a golden file names as Python spells it ("float32", "bfloat16", "bool", ...).
inline c10::ScalarType golden_dtype(const std::string& name) {
  if (name == "float32") return torch::kFloat;
  if (name == "bfloat16") return torch::kBFloat16;
  if (name == "float16") return torch::kHalf;
  if (name == "bool") return torch::kBool;
  throw std::runtime_error("unknown dtype " + name);
}

/// A tensor written as {"dtype", "shape", "values"} (values flattened in row-major order).
inline torch::Tensor golden_tensor(const nlohmann::json& doc) {
  std::vector<double> data;
  for (const auto& v : doc["values"]) data.push_back(golden_number(v));
  const auto shape = doc["shape"].get<std::vector<int64_t>>();
  return torch::tensor(data, torch::kDouble).reshape(shape).to(golden_dtype(doc["dtype"]));
}

}  // namespace mantissa_test
