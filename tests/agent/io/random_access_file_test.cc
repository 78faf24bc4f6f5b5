#include "agent/io/random_access_file.h"

#include <filesystem>
#include <string>

#include "agent/io/writable_file.h"
#include "gtest/gtest.h"

namespace memplan::io {
namespace {

TEST(RandomAccessFileTest, MemoryFileBoundsChecked) {
  std::unique_ptr<RandomAccessFile> f = NewMemoryFile("abcdef");
  char buf[6] = {};
  ASSERT_TRUE(f->ReadAt(2, 3, buf).ok());
  EXPECT_EQ(std::string(buf, 3), "cde");
  EXPECT_TRUE(f->ReadAt(6, 0, buf).ok());
  EXPECT_EQ(f->ReadAt(4, 3, buf).code(), absl::StatusCode::kOutOfRange);
  EXPECT_EQ(f->ReadAt(-1, 1, buf).code(), absl::StatusCode::kOutOfRange);
  EXPECT_EQ(f->ReadAt(7, 0, buf).code(), absl::StatusCode::kOutOfRange);
  EXPECT_EQ(f->ReadAt(1, INT64_MAX, buf).code(), absl::StatusCode::kOutOfRange);
}

TEST(RandomAccessFileTest, PosixFileWrittenByWritableFile) {
  namespace fs = std::filesystem;
  const fs::path dir = fs::path(::testing::TempDir()) / "random_access_file_test";
  fs::create_directories(dir);
  const std::string path = (dir / "f.bin").string();
  absl::StatusOr<std::unique_ptr<WritableFile>> w = WritableFile::Create(path);
  ASSERT_TRUE(w.ok()) << w.status();
  ASSERT_TRUE((*w)->Append("hello ").ok());
  ASSERT_TRUE((*w)->Append("world").ok());
  EXPECT_EQ((*w)->written_bytes(), 11);
  ASSERT_TRUE((*w)->Sync().ok());
  ASSERT_TRUE((*w)->Close().ok());
  EXPECT_TRUE((*w)->Close().ok());
  EXPECT_EQ((*w)->Append("x").code(), absl::StatusCode::kFailedPrecondition);
  ASSERT_TRUE(SyncDirectory(dir.string()).ok());

  absl::StatusOr<std::unique_ptr<RandomAccessFile>> r = OpenRandomAccessFile(path);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ((*r)->size_bytes(), 11);
  char buf[5];
  ASSERT_TRUE((*r)->ReadAt(6, 5, buf).ok());
  EXPECT_EQ(std::string(buf, 5), "world");
  EXPECT_EQ((*r)->ReadAt(7, 5, buf).code(), absl::StatusCode::kOutOfRange);

  absl::StatusOr<std::string> all = ReadSmallFile(path, 100);
  ASSERT_TRUE(all.ok());
  EXPECT_EQ(*all, "hello world");
  EXPECT_EQ(ReadSmallFile(path, 10).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(OpenRandomAccessFile((dir / "nope").string()).status().code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ(WritableFile::Create((dir / "no" / "such" / "dir").string()).status().code(),
            absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace memplan::io
