// The shard files of fsdp SHARDED_STATE_DICT checkpoints (src/trainer/sharded/shard_files.h):
// pieces written by several "ranks" read back by name and element range whatever the layout
// that wrote them, and each way a folder of them can be incomplete or inconsistent, named.
// The multi-process save and resume are fsdp.*sharded_state_dict* (tests/fsdp_trainer_check.cpp).
#include <cstdio>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "io/filesystem.h"
#include "io_test_util.h"
#include "trainer/sharded/shard_files.h"

namespace {

namespace sh = mantissa::detail::sharded;
using mantissa_test::TempDir;
using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::ThrowsMessage;

// `w` (3 x 4, elements 0..11) cut at `cuts` among len(cuts) + 1 ranks' files, and `b` (a 0-d
// buffer) in rank 0's.
void write_pieces(const std::string& folder, const torch::Tensor& w,
                  const std::vector<std::int64_t>& cuts) {
  const auto flat = w.reshape({-1});
  const auto world = static_cast<std::int64_t>(cuts.size()) + 1;
  std::int64_t begin = 0;
  for (std::int64_t r = 0; r < world; ++r) {
    const auto end = r + 1 < world ? cuts[r] : flat.numel();
    std::vector<sh::TensorPiece> pieces;
    if (end > begin) pieces.push_back({"w", flat.narrow(0, begin, end - begin), {3, 4}, begin});
    if (r == 0) pieces.push_back({"b", torch::tensor(7.0).reshape({-1}), {}, 0});
    sh::write_shard_file(folder, r, world, pieces);
    begin = end;
  }
}

TEST(ShardFilesTest, NamesFilesByRankAndWorldSize) {
  EXPECT_EQ(sh::shard_file_name(1, 2), "shard-00001-of-00002.safetensors");
  TempDir dir;
  EXPECT_FALSE(sh::is_sharded_checkpoint(dir.path()));
  mantissa::io::create_directories(dir.file("model_shards"));
  EXPECT_TRUE(sh::is_sharded_checkpoint(dir.path()));
}

TEST(ShardFilesTest, ReadsAnyRangeAcrossTheFilesOfAnotherLayout) {
  TempDir dir;
  const auto w = torch::arange(12, torch::kFloat).view({3, 4});
  write_pieces(dir.path(), w, {5, 9});  // ranks hold [0, 5), [5, 9), [9, 12)
  const sh::ShardFolderSource source(dir.path());
  EXPECT_EQ(source.world_size(), 3);
  EXPECT_EQ(source.names(), (std::vector<std::string>{"b", "w"}));
  EXPECT_EQ(source.shape("w"), (std::vector<std::int64_t>{3, 4}));
  EXPECT_EQ(source.dtype("w"), torch::kFloat);
  EXPECT_TRUE(torch::equal(source.read_whole("w"), w));
  // A 2-rank layout's halves, each spanning two files.
  EXPECT_TRUE(torch::equal(source.read("w", 0, 6), torch::arange(0, 6, torch::kFloat)));
  EXPECT_TRUE(torch::equal(source.read("w", 6, 6), torch::arange(6, 12, torch::kFloat)));
  EXPECT_TRUE(torch::equal(source.read("w", 4, 6), torch::arange(4, 10, torch::kFloat)));
  EXPECT_EQ(source.read_whole("b").item<float>(), 7.0F);
  EXPECT_EQ(source.read_whole("b").dim(), 0);
}

TEST(ShardFilesTest, AMissingRankFileIsNamedWithTheProcessesThatSavedIt) {
  TempDir dir;
  write_pieces(dir.path(), torch::arange(12, torch::kFloat).view({3, 4}), {6});
  const auto lost = dir.file("shard-00001-of-00002.safetensors");
  ASSERT_EQ(std::remove(lost.c_str()), 0);
  EXPECT_THAT([&] { sh::ShardFolderSource source(dir.path()); },
              ThrowsMessage<c10::Error>(AllOf(HasSubstr("'" + lost + "' is missing"),
                                              HasSubstr("2 processes saved"))));
}

TEST(ShardFilesTest, FilesOfTwoSavesMixedOrNoneAtAllAreRefused) {
  TempDir dir;
  EXPECT_THAT([&] { sh::ShardFolderSource source(dir.file("nothing")); },
              ThrowsMessage<c10::Error>(HasSubstr("is missing")));
  EXPECT_THAT([&] { sh::ShardFolderSource source(dir.path()); },
              ThrowsMessage<c10::Error>(HasSubstr("holds no shard file")));
  const auto w = torch::arange(12, torch::kFloat).view({3, 4});
  write_pieces(dir.path(), w, {6});
  write_pieces(dir.path(), w, {4, 8});
  EXPECT_THAT([&] { sh::ShardFolderSource source(dir.path()); },
              ThrowsMessage<c10::Error>(HasSubstr("the files of two different saves are mixed")));
}

TEST(ShardFilesTest, ElementsNoFileHoldsAreNamed) {
  TempDir dir;
  const auto flat = torch::arange(12, torch::kFloat);
  sh::write_shard_file(dir.path(), 0, 2, {{"w", flat.narrow(0, 0, 4), {3, 4}, 0}});
  sh::write_shard_file(dir.path(), 1, 2, {{"w", flat.narrow(0, 6, 6), {3, 4}, 6}});
  const sh::ShardFolderSource source(dir.path());
  EXPECT_TRUE(torch::equal(source.read("w", 6, 3), flat.narrow(0, 6, 3)));
  EXPECT_THAT([&] { source.read("w", 2, 6); },
              ThrowsMessage<c10::Error>(HasSubstr("no shard file holds elements [4, 6) of 'w'")));
}

TEST(ShardFilesTest, OverlappingPiecesAndBadPiecesAreRefused) {
  TempDir dir;
  const auto flat = torch::arange(12, torch::kFloat);
  sh::write_shard_file(dir.path(), 0, 2, {{"w", flat.narrow(0, 0, 7), {3, 4}, 0}});
  sh::write_shard_file(dir.path(), 1, 2, {{"w", flat.narrow(0, 6, 6), {3, 4}, 6}});
  EXPECT_THAT([&] { sh::ShardFolderSource source(dir.path()); },
              ThrowsMessage<c10::Error>(HasSubstr("two shard files hold element 6 of 'w'")));
  EXPECT_THROW(sh::write_shard_file(dir.path(), 0, 1, {{"w", flat, {3, 3}, 0}}),
               c10::ValueError);
}

TEST(ShardFilesTest, SourcesOfWholeTensorsReadRangesToo) {
  TempDir dir;
  const auto w = torch::arange(12, torch::kFloat).view({3, 4});
  mantissa::io::save_safetensors(dir.file("model.safetensors"), {{"w", w}});
  const sh::SafetensorsSource file(dir.file("model.safetensors"));
  EXPECT_TRUE(torch::equal(file.read("w", 3, 4), torch::arange(3, 7, torch::kFloat)));
  EXPECT_THAT(file.origin(), HasSubstr("model.safetensors"));
  const mantissa::io::NamedTensors state{{"w", w}};
  const sh::NamedTensorsSource memory(state, " from memory");
  EXPECT_TRUE(torch::equal(memory.read_whole("w"), w));
  EXPECT_TRUE(torch::equal(memory.read("w", 10, 2), torch::arange(10, 12, torch::kFloat)));
  EXPECT_THROW(sh::NamedTensorsSource({{"w", w}, {"w", w}}, ""), c10::ValueError);
}

}  // namespace
