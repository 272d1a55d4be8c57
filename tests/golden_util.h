#pragma once
// Reading the reference files in tests/golden/ that Python scripts next to them wrote.

#include <fstream>
#include <map>
#include <stdexcept>
#include <string>

#include <nlohmann/json.hpp>

namespace mantissa_test {

/// The parsed JSON of tests/golden/<name>, read once per test binary.
inline const nlohmann::json& golden_file(const std::string& name) {
  static std::map<std::string, nlohmann::json> cache;
  auto it = cache.find(name);
  if (it == cache.end()) {
    const std::string path = std::string(MANTISSA_TEST_DATA_DIR) + "/" + name;
    std::ifstream in(path);
    if (!in) throw std::runtime_error("cannot open " + path);
    it = cache.emplace(name, nlohmann::json::parse(in)).first;
  }
  return it->second;
}

}  // namespace mantissa_test
