// io::save_torch_archive: a LibTorch archive streamed into its file, atomically.
#include <csignal>
#include <sstream>
#include <string>

#include <sys/resource.h>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "io/archive_file.h"
#include "io/atomic_file.h"
#include "io/filesystem.h"
#include "io/torch_load.h"
#include "io_test_util.h"

namespace {

using ::testing::HasSubstr;
using mantissa_test::TempDir;

torch::serialize::OutputArchive archive_of(const torch::Tensor& tensor) {
  torch::serialize::OutputArchive archive;
  archive.write("weight", tensor);
  archive.write("step", c10::IValue(std::int64_t{7}));
  return archive;
}

TEST(ArchiveFileTest, WritesTheBytesSaveToWritesAndReadsBack) {
  TempDir dir;
  const auto tensor = torch::arange(300000, torch::kFloat).reshape({600, 500});
  auto archive = archive_of(tensor);
  const auto path = dir.file("optimizer.pt");
  mantissa::io::save_torch_archive(path, archive);

  std::ostringstream expected;
  archive_of(tensor).save_to(expected);
  const auto written = mantissa::io::read_file(path);
  EXPECT_EQ(std::string(written.begin(), written.end()), expected.str());

  torch::serialize::InputArchive loaded;
  mantissa::io::load_torch_archive(path, loaded);
  torch::Tensor weight;
  loaded.read("weight", weight);
  EXPECT_TRUE(torch::equal(weight, tensor));
  // Only the file itself is left in the folder (no temporary one).
  EXPECT_EQ(mantissa::io::list_directory(dir.path()).size(), 1u);
}

TEST(ArchiveFileTest, AFailedWriteNamesTheFileAndKeepsTheOldOne) {
  TempDir dir;
  const auto path = dir.file("optimizer.pt");
  mantissa::io::write_file_atomically(path, "the previous checkpoint's bytes");
  auto archive = archive_of(torch::ones({1024, 1024}));  // 4 MiB, past the limit below
  // A file-size limit makes write(2) fail with EFBIG in the middle of the archive.
  rlimit saved{};
  ASSERT_EQ(::getrlimit(RLIMIT_FSIZE, &saved), 0);
  auto* old_handler = ::signal(SIGXFSZ, SIG_IGN);
  rlimit small = saved;
  small.rlim_cur = 64 * 1024;
  ASSERT_EQ(::setrlimit(RLIMIT_FSIZE, &small), 0);
  std::string message;
  try {
    mantissa::io::save_torch_archive(path, archive);
  } catch (const c10::Error& e) {
    message = e.what_without_backtrace();
  }
  ::setrlimit(RLIMIT_FSIZE, &saved);
  ::signal(SIGXFSZ, old_handler);
  EXPECT_THAT(message, HasSubstr("cannot write '"));
  EXPECT_THAT(message, HasSubstr("optimizer.pt' (write)"));
  const auto kept = mantissa::io::read_file(path);
  EXPECT_EQ(std::string(kept.begin(), kept.end()), "the previous checkpoint's bytes");
  EXPECT_EQ(mantissa::io::list_directory(dir.path()).size(), 1u);
}

}  // namespace
