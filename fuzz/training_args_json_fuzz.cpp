// Fuzz target: training_args.json's text, read by TrainingArguments::from_json (with and
// without validation) and written back.
#include <cstddef>
#include <cstdint>
#include <string>

#include <mantissa/training_arguments.h>

#include "fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  mantissa_fuzz::expect_no_crash([&] { mantissa::TrainingArguments::from_json(text); });
  mantissa_fuzz::expect_no_crash([&] {
    // What reads back without validation must write out and read back equal.
    const auto args = mantissa::TrainingArguments::from_json(text, /*validate=*/false);
    std::string again;
    try {
      again = args.to_json();
    } catch (const c10::ValueError&) {
      return;  // a value JSON cannot hold (non-finite, not UTF-8): to_json refuses it, fine
    }
    if (!(mantissa::TrainingArguments::from_json(again, /*validate=*/false) == args)) std::abort();
  });
  return 0;
}
