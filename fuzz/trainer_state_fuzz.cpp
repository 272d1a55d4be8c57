// Fuzz target: trainer_state.json's text, read by TrainerState::from_json and written back.
#include <cstddef>
#include <cstdint>
#include <string>

#include <mantissa/trainer_callback.h>

#include "fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  mantissa_fuzz::expect_no_crash([&] {
    const auto state = mantissa::TrainerState::from_json(text);
    (void)mantissa::TrainerState::from_json(state.to_json());
  });
  return 0;
}
