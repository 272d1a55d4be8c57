// Fuzz target: the torch.save-format readers (src/io/torch_load.h) that load scaler.pt,
// scheduler.pt, rng_state*.pth (load_torch_bytes) and optimizer.pt, master_weights.pt
// (load_torch_archive).
//
// The input's first byte picks the reader: even, load_torch_bytes on the rest; odd, the rest
// is written to a file and read with load_torch_archive. A refusal (any std::exception) is
// fine; a crash or a sanitizer report is a finding. The adapters that feed LibTorch's zip
// reader are compiled with the sanitizers, so a read past the input's end is reported there.
//
// With MANTISSA_FUZZ_WRITE_SEEDS=<dir> the target writes real files of each kind into <dir>,
// whole and cut at every offset of their last 64 bytes (the end-of-central-directory record
// and the central directory before it), behind their selector byte: fuzz/corpus/torch_file.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <ATen/Context.h>
#include <torch/nn/modules/linear.h>
#include <torch/optim/adamw.h>
#include <torch/serialize/output-archive.h>

#include <sstream>

#include "fuzz_util.h"
#include "io/torch_load.h"
#include "io/torch_save.h"

namespace {

std::string as_string(const std::vector<char>& bytes) { return {bytes.begin(), bytes.end()}; }

// (selector byte, name, bytes) of a real file of each kind.
std::vector<std::pair<char, std::pair<std::string, std::string>>> real_files() {
  c10::impl::GenericDict rng(c10::StringType::get(), c10::AnyType::get());
  rng.insert("cpu", at::detail::getDefaultCPUGenerator().get_state());
  rng.insert("cuda", c10::impl::GenericList(c10::AnyType::get()));

  c10::impl::GenericDict scaler(c10::StringType::get(), c10::AnyType::get());
  scaler.insert("scale", 65536.0);
  scaler.insert("growth_factor", 2.0);
  scaler.insert("backoff_factor", 0.5);
  scaler.insert("growth_interval", int64_t{2000});
  scaler.insert("_growth_tracker", int64_t{3});

  c10::impl::GenericDict scheduler(c10::StringType::get(), c10::AnyType::get());
  scheduler.insert("last_epoch", int64_t{1});
  scheduler.insert("base_lrs", c10::List<double>({1e-3}));
  scheduler.insert("_last_lr", c10::List<double>({9e-4}));

  torch::nn::Linear model(3, 2);
  torch::optim::AdamW optimizer(model->parameters(), torch::optim::AdamWOptions(1e-3));
  model->forward(torch::randn({4, 3})).pow(2).mean().backward();
  optimizer.step();
  torch::serialize::OutputArchive archive;
  optimizer.save(archive);
  std::ostringstream optimizer_bytes;
  archive.save_to(optimizer_bytes);

  return {{0, {"rng_state.pth", as_string(mantissa::io::torch_save_bytes(rng))}},
          {0, {"scaler.pt", as_string(mantissa::io::torch_save_bytes(scaler))}},
          {0, {"scheduler.pt", as_string(mantissa::io::torch_save_bytes(scheduler))}},
          {1, {"optimizer.pt", optimizer_bytes.str()}}};
}

void write_seeds(const std::string& dir) {
  mantissa::io::create_directories(dir);
  for (const auto& entry : real_files()) {
    const char selector = entry.first;
    const std::string& name = entry.second.first;
    const std::string& bytes = entry.second.second;
    const auto put = [&](const std::string& seed, std::size_t size) {
      mantissa_fuzz::write_bytes(mantissa::io::join_path(dir, seed),
                                 std::string(1, selector) + bytes.substr(0, size));
    };
    put("valid-" + name, bytes.size());
    for (std::size_t cut = 1; cut <= 64 && cut <= bytes.size(); ++cut) {
      put("cut" + std::to_string(cut) + "-" + name, bytes.size() - cut);
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static const bool seeded = [] {
    if (const char* seeds = std::getenv("MANTISSA_FUZZ_WRITE_SEEDS")) write_seeds(seeds);
    return true;
  }();
  (void)seeded;
  if (size == 0) return 0;
  const char* rest = reinterpret_cast<const char*>(data) + 1;
  if (data[0] % 2 == 0) {
    mantissa_fuzz::expect_no_crash(
        [&] { mantissa::io::load_torch_bytes(std::vector<char>(rest, rest + size - 1)); });
  } else {
    static const std::string path = mantissa::io::join_path(mantissa_fuzz::scratch_dir(), "in.pt");
    mantissa_fuzz::write_bytes(path, std::string_view(rest, size - 1));
    mantissa_fuzz::expect_no_crash([&] {
      torch::serialize::InputArchive archive;
      mantissa::io::load_torch_archive(path, archive);
    });
  }
  return 0;
}
