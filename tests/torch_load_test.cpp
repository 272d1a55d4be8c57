// src/io/torch_load.h: torch.save-format files read whatever their bytes. The hostile files in
// tests/golden/torch_load/ come from tests/golden/make_hostile_torch_files.py.
#include <algorithm>
#include <fstream>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "io/atomic_file.h"
#include "io/filesystem.h"
#include "io/torch_load.h"
#include "io/torch_save.h"
#include "test_paths.h"

namespace {

using ::testing::HasSubstr;

std::vector<char> golden_bytes(const std::string& name) {
  return mantissa::io::read_file(mantissa_test::test_data_dir() + "/torch_load/" + name);
}

std::vector<char> rng_like_file() {
  c10::impl::GenericDict value(c10::StringType::get(), c10::AnyType::get());
  value.insert("cpu", at::detail::getDefaultCPUGenerator().get_state());
  value.insert("step", int64_t{7});
  return mantissa::io::torch_save_bytes(value);
}

template <class Fn>
std::string error_of(Fn&& fn) {
  try {
    fn();
  } catch (const c10::Error& e) {
    return e.what_without_backtrace();
  }
  return "(no error)";
}

TEST(TorchLoadTest, ReadsWhatTorchSaveBytesWrote) {
  const auto value = mantissa::io::load_torch_bytes(rng_like_file()).toGenericDict();
  EXPECT_EQ(value.at("step").toInt(), 7);
  EXPECT_TRUE(
      torch::equal(value.at("cpu").toTensor(), at::detail::getDefaultCPUGenerator().get_state()));
}

TEST(TorchLoadTest, RefusesEveryCutOfTheLastBytes) {
  // The end-of-central-directory record (22 bytes) and the central directory before it: a cut
  // anywhere there once made LibTorch's reader copy past the end of the buffer.
  const auto whole = rng_like_file();
  for (std::size_t cut = 1; cut <= 64; ++cut) {
    std::vector<char> bytes(whole.begin(), whole.end() - static_cast<std::ptrdiff_t>(cut));
    EXPECT_THAT(error_of([&] { mantissa::io::load_torch_bytes(bytes); }), HasSubstr("zip archive"))
        << "cut " << cut;
  }
}

TEST(TorchLoadTest, RefusesATensorBeyondItsStorage) {
  EXPECT_THAT(
      error_of([] { mantissa::io::load_torch_bytes(golden_bytes("tensor_beyond_storage.pt")); }),
      HasSubstr("the value['cpu'] (shape [255], strides [1], offset 0, Byte) reaches past "
                "the end of its storage of 4 bytes"));
}

TEST(TorchLoadTest, RefusesAStorageBeyondItsRecord) {
  EXPECT_THAT(
      error_of([] { mantissa::io::load_torch_bytes(golden_bytes("storage_beyond_record.pt")); }),
      HasSubstr("the storage '0' is declared with 255 bytes, but its record 'data/0' holds 4"));
}

TEST(TorchLoadTest, RefusesAStorageOfNegativeCount) {
  // No record is read for it; LibTorch itself refuses the byte count (and, were it to stop,
  // check_tensors_fit_storage refuses a tensor with elements and no bytes).
  EXPECT_NE(
      error_of([] { mantissa::io::load_torch_bytes(golden_bytes("storage_count_negative.pt")); }),
      "(no error)");
}

TEST(TorchLoadTest, RefusesWhatWouldAllocateMoreThanTheFileHolds) {
  // LibTorch's unpickler would grow its memo table to 2**31 entries (32 GiB), or allocate a
  // 4 GiB string, before finding out.
  EXPECT_THAT(error_of([] { mantissa::io::load_torch_bytes(golden_bytes("memo_gap.pt")); }),
              HasSubstr("the file: its record 'data.pkl' stores memo entry 2147483647 at byte 3"));
  EXPECT_THAT(
      error_of([] { mantissa::io::load_torch_bytes(golden_bytes("string_past_end.pt")); }),
      HasSubstr("its record 'data.pkl' claims 4294967280 bytes for the argument of its pickle "
                "opcode 0x58 at byte 5"));
  const auto path = mantissa_test::test_data_dir() + "/torch_load/archive_memo_gap.pt";
  torch::serialize::InputArchive archive;
  EXPECT_THAT(error_of([&] { mantissa::io::load_torch_archive(path, archive); }),
              HasSubstr("archive_memo_gap.pt': its record 'data.pkl' stores memo entry "
                        "2147483647"));
}

TEST(TorchLoadTest, RefusesACompressedRecord) {
  // The directory claims 2 GiB for the deflated record; LibTorch's reader allocates a record's
  // claim before inflating it, and reads "version" while it is being constructed.
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"deflated_pickle_claims_2gib.pt", "archive/data.pkl"},
      {"deflated_version_claims_2gib.pt", "archive/version"},
      {"deflated_version_claims_2gib_zip64.pt", "archive/version"}};
  for (const auto& entry : cases) {
    // Named copies: clang refuses a lambda that captures a structured binding in C++17.
    const std::string file = entry.first, record = entry.second;
    EXPECT_THAT(
        error_of([&] { mantissa::io::load_torch_bytes(golden_bytes(file)); }),
        HasSubstr("the file: its record '" + record + "' claims 2147483632 bytes once inflated"))
        << file;
  }
}

TEST(TorchLoadTest, RefusesARecordPastTheEndOfTheArchive) {
  // The first central-directory entry's local-header offset (bytes 42-45 of the entry) moved
  // past the end of the file.
  auto bytes = rng_like_file();
  const std::string signature = "PK\x01\x02";
  const auto entry = std::search(bytes.begin(), bytes.end(), signature.begin(), signature.end());
  ASSERT_NE(entry, bytes.end());
  const auto size = static_cast<std::uint32_t>(bytes.size());
  for (int i = 0; i < 4; ++i) entry[42 + i] = static_cast<char>((size >> (8 * i)) & 0xff);
  EXPECT_THAT(error_of([&] { mantissa::io::load_torch_bytes(bytes); }),
              HasSubstr("bytes at offset " + std::to_string(size) + ", past the end of the " +
                        std::to_string(size) + " bytes of the file"));
}

TEST(TorchLoadTest, ChecksTensorsInNestedContainers) {
  auto storage_of_two = torch::zeros({2});
  auto beyond = torch::empty({0}).set_(storage_of_two.storage(), 0, {2}, {1});
  const std::vector<int64_t> sizes{5}, strides{1};
  beyond.unsafeGetTensorImpl()->set_sizes_and_strides(sizes, strides);  // as a hostile pickle does
  c10::impl::GenericList list(c10::AnyType::get());
  list.push_back(c10::ivalue::Tuple::create({c10::IValue(int64_t{1}), c10::IValue(beyond)}));
  EXPECT_THAT(error_of([&] { mantissa::io::check_tensors_fit_storage(list, "x"); }),
              HasSubstr("x[0][1] (shape [5]"));
  list.set(0, torch::zeros({3}).as_strided({2}, {2}, 0));
  EXPECT_NO_THROW(mantissa::io::check_tensors_fit_storage(list, "x"));
}

// An archive scripted in Python holds `training` (a bool) and `_is_full_backward_hook` (None) at
// its top level, which the check once took for containers (an internal assert).
TEST(TorchLoadTest, AcceptsValuesThatHoldNoTensorAtTheTopLevel) {
  EXPECT_NO_THROW(mantissa::io::check_tensors_fit_storage(c10::IValue(true), "training"));
  EXPECT_NO_THROW(mantissa::io::check_tensors_fit_storage(c10::IValue(), "hook"));
  EXPECT_NO_THROW(mantissa::io::check_tensors_fit_storage(c10::IValue(int64_t{3}), "n"));
}

TEST(TorchLoadTest, ReadsAnOptimizerArchiveAndRefusesItCut) {
  torch::nn::Linear model(3, 2);
  torch::optim::AdamW optimizer(model->parameters(), torch::optim::AdamWOptions(1e-3));
  model->forward(torch::randn({4, 3})).sum().backward();
  optimizer.step();
  torch::serialize::OutputArchive out;
  optimizer.save(out);
  std::ostringstream bytes;
  out.save_to(bytes);
  const auto dir = mantissa::io::make_temp_directory("", "torch-load-test-");
  const auto path = mantissa::io::join_path(dir, "optimizer.pt");
  mantissa::io::write_file_atomically(path, bytes.str());
  torch::serialize::InputArchive archive;
  mantissa::io::load_torch_archive(path, archive);
  torch::optim::AdamW restored(model->parameters(), torch::optim::AdamWOptions(1e-3));
  restored.load(archive);
  EXPECT_EQ(restored.state().size(), 2u);

  const auto whole = bytes.str();
  for (std::size_t cut : {1, 2, 21, 22, 40, 64}) {
    mantissa::io::write_file_atomically(path, whole.substr(0, whole.size() - cut));
    torch::serialize::InputArchive cut_archive;
    EXPECT_THAT(error_of([&] { mantissa::io::load_torch_archive(path, cut_archive); }),
                HasSubstr("zip archive"))
        << "cut " << cut;
  }
  mantissa::io::remove_all(dir);
}

}  // namespace
