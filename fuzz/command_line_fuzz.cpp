// Fuzz target: the command line. The input is split into arguments at NUL bytes (as the
// kernel hands argv to a program) and given to TrainingArguments::parse and parse_known.
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include <mantissa/training_arguments.h>

#include "fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  std::vector<std::string> words{"train"};
  std::string current;
  for (std::size_t i = 0; i < size; ++i) {
    if (data[i] == 0) {
      words.push_back(current);
      current.clear();
    } else {
      current.push_back(static_cast<char>(data[i]));
    }
  }
  if (!current.empty()) words.push_back(current);
  // --help prints the help and exits, as argparse does; an exit is not a finding.
  for (std::size_t i = 1; i < words.size(); ++i) {
    const auto& word = words[i];
    const bool short_flags = word.size() >= 2 && word[0] == '-' && word[1] != '-';
    if (word.rfind("--help", 0) == 0 || (short_flags && word.find('h') != std::string::npos))
      return 0;
  }
  // A lone "x.json" argument is read as a file; it names no file here, which is a refusal.
  std::vector<const char*> argv;
  for (const auto& word : words) argv.push_back(word.c_str());
  argv.push_back(nullptr);
  const int argc = static_cast<int>(words.size());
  mantissa_fuzz::expect_no_crash([&] { mantissa::TrainingArguments::parse(argc, argv.data()); });
  mantissa_fuzz::expect_no_crash(
      [&] { mantissa::TrainingArguments::parse_known(argc, argv.data()); });
  return 0;
}
