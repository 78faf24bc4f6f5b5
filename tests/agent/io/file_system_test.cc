#include "agent/io/file_system.h"

#include <unistd.h>

#include <fstream>
#include <string>

#include "gtest/gtest.h"

namespace memplan::io {
namespace {

TEST(FileSystemTest, PathStrings) {
  EXPECT_EQ(JoinPath("a", "b"), "a/b");
  EXPECT_EQ(JoinPath("a/", "b"), "a/b");
  EXPECT_EQ(JoinPath("", "b"), "b");
  EXPECT_EQ(Basename("a/b/c"), "c");
  EXPECT_EQ(Basename("a/b/"), "b");
  EXPECT_EQ(Basename("c"), "c");
  EXPECT_EQ(Dirname("a/b/c"), "a/b");
  EXPECT_EQ(Dirname("c"), ".");
  EXPECT_EQ(Dirname("/c"), "/");
  EXPECT_EQ(AbsolutePath("/x/y/"), "/x/y");
  EXPECT_EQ(AbsolutePath("rel").front(), '/');
}

TEST(FileSystemTest, CreateListRemove) {
  const std::string root = JoinPath(::testing::TempDir(), "file_system_test");
  ASSERT_TRUE(RemoveAll(root).ok());
  const std::string deep = JoinPath(root, "a/b/c");
  ASSERT_TRUE(CreateDirectories(deep).ok());
  ASSERT_TRUE(CreateDirectories(deep).ok());  // idempotent
  EXPECT_TRUE(IsDirectory(deep));
  std::ofstream(JoinPath(root, "a/f.txt")) << "12345";
  EXPECT_TRUE(IsRegularFile(JoinPath(root, "a/f.txt")));
  absl::StatusOr<int64_t> size = FileSizeBytes(JoinPath(root, "a/f.txt"));
  ASSERT_TRUE(size.ok());
  EXPECT_EQ(*size, 5);
  EXPECT_FALSE(FileSizeBytes(deep).ok());
  EXPECT_EQ(FileSizeBytes(JoinPath(root, "none")).status().code(), absl::StatusCode::kNotFound);

  // A symlink to outside the tree is removed, not followed.
  const std::string outside = JoinPath(::testing::TempDir(), "file_system_test_outside");
  ASSERT_TRUE(CreateDirectories(outside).ok());
  std::ofstream(JoinPath(outside, "keep")) << "x";
  ASSERT_EQ(::symlink(outside.c_str(), JoinPath(root, "a/link").c_str()), 0);

  absl::StatusOr<std::vector<std::string>> names = ListDirectory(JoinPath(root, "a"));
  ASSERT_TRUE(names.ok());
  EXPECT_EQ(*names, (std::vector<std::string>{"b", "f.txt", "link"}));

  ASSERT_TRUE(RemoveAll(root).ok());
  EXPECT_FALSE(PathExists(root));
  EXPECT_TRUE(PathExists(JoinPath(outside, "keep")));
  EXPECT_TRUE(RemoveAll(root).ok());  // missing is fine
  std::ofstream(JoinPath(outside, "file")) << "x";
  EXPECT_FALSE(CreateDirectories(JoinPath(outside, "file/sub")).ok());
}

}  // namespace
}  // namespace memplan::io
