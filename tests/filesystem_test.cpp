// The POSIX file-system helpers used for checkpoint folders.
#include <sys/stat.h>
#include <unistd.h>

#include <string>
#include <vector>

#include <c10/util/Exception.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "io/filesystem.h"

#include "io_test_util.h"

namespace {

using mantissa::io::create_directories;
using mantissa::io::is_directory;
using mantissa::io::join_path;
using mantissa::io::list_directory;
using mantissa::io::make_temp_directory;
using mantissa::io::path_exists;
using mantissa::io::remove_all;
using mantissa::io::rename_path;
using mantissa_test::TempDir;
using mantissa_test::write_raw_file;
using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::ThrowsMessage;

TEST(FilesystemTest, JoinPathFollowsOsPathJoin) {
  EXPECT_EQ(join_path("out", "checkpoint-10"), "out/checkpoint-10");
  EXPECT_EQ(join_path("out/", "checkpoint-10"), "out/checkpoint-10");
  EXPECT_EQ(join_path("", "model.safetensors"), "model.safetensors");
  EXPECT_EQ(join_path("out", "/abs/file"), "/abs/file");
  EXPECT_EQ(join_path("out", ""), "out/");
  EXPECT_EQ(join_path("/", "tmp"), "/tmp");
}

TEST(FilesystemTest, ExistsAndIsDirectory) {
  TempDir dir;
  const auto file = dir.file("a.txt");
  EXPECT_TRUE(path_exists(dir.path()));
  EXPECT_TRUE(is_directory(dir.path()));
  EXPECT_FALSE(path_exists(file));
  EXPECT_FALSE(is_directory(file));
  write_raw_file(file, "hello");
  EXPECT_TRUE(path_exists(file));
  EXPECT_FALSE(is_directory(file));
  EXPECT_FALSE(path_exists(""));
  // A dangling symbolic link does not exist (links are followed), like os.path.exists.
  ASSERT_EQ(::symlink(dir.file("nowhere").c_str(), dir.file("dangling").c_str()), 0);
  EXPECT_FALSE(path_exists(dir.file("dangling")));
}

TEST(FilesystemTest, CreateDirectoriesMakesParentsAndAcceptsExisting) {
  TempDir dir;
  const auto deep = join_path(dir.path(), "out/checkpoint-500/nested");
  create_directories(deep);
  EXPECT_TRUE(is_directory(deep));
  EXPECT_TRUE(is_directory(dir.file("out/checkpoint-500")));
  create_directories(deep);  // already there: nothing happens
  create_directories(deep + "/");
  EXPECT_TRUE(is_directory(deep));
  EXPECT_EQ(list_directory(dir.file("out/checkpoint-500")), std::vector<std::string>{"nested"});
}

TEST(FilesystemTest, CreateDirectoriesRefusesAFileInTheWay) {
  TempDir dir;
  write_raw_file(dir.file("blocker"), "x");
  const auto wanted = dir.file("blocker/sub");
  EXPECT_THAT([&] { create_directories(wanted); },
              ThrowsMessage<c10::Error>(AllOf(HasSubstr(wanted), HasSubstr("is not a directory"))));
  EXPECT_THAT([&] { create_directories(dir.file("blocker")); },
              ThrowsMessage<c10::Error>(HasSubstr("exists and is not a directory")));
  EXPECT_THROW(create_directories(""), c10::ValueError);
}

TEST(FilesystemTest, CreateDirectoriesReportsPermissionErrors) {
  if (::geteuid() == 0) GTEST_SKIP() << "root ignores directory permissions";
  TempDir dir;
  create_directories(dir.file("locked"));
  ASSERT_EQ(::chmod(dir.file("locked").c_str(), 0500), 0);
  const auto wanted = dir.file("locked/sub");
  EXPECT_THAT([&] { create_directories(wanted); },
              ThrowsMessage<c10::Error>(AllOf(HasSubstr(wanted), HasSubstr("Permission denied"))));
  ::chmod(dir.file("locked").c_str(), 0700);
}

TEST(FilesystemTest, RemoveAllRemovesTreesFilesAndLinksButNotLinkTargets) {
  TempDir dir;
  const auto keep = dir.file("keep");
  create_directories(keep);
  write_raw_file(join_path(keep, "precious.txt"), "do not delete");
  const auto tree = dir.file("tree");
  create_directories(join_path(tree, "a/b/c"));
  write_raw_file(join_path(tree, "a/file1"), "1");
  write_raw_file(join_path(tree, "a/b/c/file2"), "2");
  ASSERT_EQ(::symlink(keep.c_str(), join_path(tree, "link_to_keep").c_str()), 0);

  // tree, a, b, c, file1, file2, link_to_keep
  EXPECT_EQ(remove_all(tree), 7u);
  EXPECT_FALSE(path_exists(tree));
  EXPECT_TRUE(path_exists(join_path(keep, "precious.txt"))) << "a link is removed, not followed";

  EXPECT_EQ(remove_all(join_path(keep, "precious.txt")), 1u);
  EXPECT_FALSE(path_exists(join_path(keep, "precious.txt")));
  EXPECT_EQ(remove_all(dir.file("never-existed")), 0u);
  EXPECT_THROW(remove_all(""), c10::ValueError);
}

TEST(FilesystemTest, ListDirectoryIsSortedWithoutDotEntries) {
  TempDir dir;
  for (const char* name : {"checkpoint-20", "checkpoint-100", "b", "A", ".hidden"}) {
    write_raw_file(dir.file(name), "");
  }
  create_directories(dir.file("sub"));
  EXPECT_EQ(
      list_directory(dir.path()),
      (std::vector<std::string>{".hidden", "A", "b", "checkpoint-100", "checkpoint-20", "sub"}));
  EXPECT_TRUE(list_directory(dir.file("sub")).empty());
  EXPECT_THAT(
      [&] { list_directory(dir.file("missing")); },
      ThrowsMessage<c10::Error>(AllOf(HasSubstr(dir.file("missing")), HasSubstr("No such file"))));
  EXPECT_THAT([&] { list_directory(dir.file("b")); },
              ThrowsMessage<c10::Error>(HasSubstr("Not a directory")));
}

TEST(FilesystemTest, RenamePathMovesFilesAndFolders) {
  TempDir dir;
  write_raw_file(dir.file("tmp-checkpoint"), "new");
  write_raw_file(dir.file("checkpoint"), "old");
  rename_path(dir.file("tmp-checkpoint"), dir.file("checkpoint"));  // replaces, like os.replace
  EXPECT_FALSE(path_exists(dir.file("tmp-checkpoint")));
  EXPECT_EQ(list_directory(dir.path()), std::vector<std::string>{"checkpoint"});

  create_directories(dir.file("tmp-checkpoint-5/inner"));
  rename_path(dir.file("tmp-checkpoint-5"), dir.file("checkpoint-5"));
  EXPECT_TRUE(is_directory(dir.file("checkpoint-5/inner")));

  EXPECT_THAT(
      [&] { rename_path(dir.file("absent"), dir.file("target")); },
      ThrowsMessage<c10::Error>(AllOf(HasSubstr(dir.file("absent")), HasSubstr(dir.file("target")),
                                      HasSubstr("No such file"))));
}

TEST(FilesystemTest, MakeTempDirectoryCreatesUniquePrivateFolders) {
  TempDir dir;
  const auto first = make_temp_directory(dir.path(), "tmp-checkpoint-");
  const auto second = make_temp_directory(dir.path(), "tmp-checkpoint-");
  EXPECT_NE(first, second);
  EXPECT_TRUE(is_directory(first));
  EXPECT_TRUE(is_directory(second));
  EXPECT_EQ(first.rfind(dir.file("tmp-checkpoint-"), 0), 0u) << first;
  EXPECT_EQ(first.size(), dir.file("tmp-checkpoint-").size() + 6);
  struct stat info {};
  ASSERT_EQ(::stat(first.c_str(), &info), 0);
  EXPECT_EQ(info.st_mode & 0777, 0700u);
  EXPECT_THAT([&] { make_temp_directory(dir.file("missing"), "x"); },
              ThrowsMessage<c10::Error>(HasSubstr(dir.file("missing"))));
}

}  // namespace
