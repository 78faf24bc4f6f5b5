#include "agent/io/token_file.h"

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace memplan::io {
namespace {

using ::testing::HasSubstr;

std::string Message(const absl::Status& s) { return std::string(s.message()); }

TEST(TokenFileTest, HeaderFormatRoundTrip) {
  for (int width : {2, 4}) {
    const std::vector<uint32_t> tokens = {0, 1, 65535, 7, 300};
    absl::StatusOr<std::string> bytes = EncodeTokenFile(tokens, width, 65536);
    ASSERT_TRUE(bytes.ok()) << bytes.status();
    EXPECT_EQ(bytes->size(), 32 + tokens.size() * width);
    EXPECT_EQ(bytes->substr(0, 8), "MPTOKENS");
    absl::StatusOr<std::unique_ptr<TokenFile>> f = TokenFile::Open(NewMemoryFile(*bytes), {});
    ASSERT_TRUE(f.ok()) << f.status();
    EXPECT_TRUE((*f)->has_header());
    EXPECT_EQ((*f)->num_tokens(), 5);
    EXPECT_EQ((*f)->token_bytes(), width);
    EXPECT_EQ((*f)->vocab_size(), 65536);
    std::vector<int64_t> out(3);
    ASSERT_TRUE((*f)->Read(1, 3, out.data()).ok());
    EXPECT_EQ(out, (std::vector<int64_t>{1, 65535, 7}));
  }
}

TEST(TokenFileTest, RawFilesNeedAWidth) {
  std::string raw;
  for (uint32_t t : {5u, 70000u, 9u}) {
    for (int i = 0; i < 4; ++i) raw.push_back(static_cast<char>((t >> (8 * i)) & 0xff));
  }
  EXPECT_THAT(Message(TokenFile::Open(NewMemoryFile(raw), {}).status()),
              HasSubstr("no MPTOKENS header"));
  absl::StatusOr<std::unique_ptr<TokenFile>> f =
      TokenFile::Open(NewMemoryFile(raw), {.raw_token_bytes = 4});
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_FALSE((*f)->has_header());
  std::vector<int64_t> out(3);
  ASSERT_TRUE((*f)->Read(0, 3, out.data()).ok());
  EXPECT_EQ(out, (std::vector<int64_t>{5, 70000, 9}));
  // As uint16 the same bytes are six tokens.
  absl::StatusOr<std::unique_ptr<TokenFile>> g =
      TokenFile::Open(NewMemoryFile(raw), {.raw_token_bytes = 2});
  ASSERT_TRUE(g.ok());
  EXPECT_EQ((*g)->num_tokens(), 6);
  EXPECT_THAT(Message(TokenFile::Open(NewMemoryFile(raw + "x"), {.raw_token_bytes = 2}).status()),
              HasSubstr("not a multiple of 2"));
  EXPECT_THAT(Message(TokenFile::Open(NewMemoryFile(raw), {.raw_token_bytes = 3}).status()),
              HasSubstr("raw_token_bytes = 3"));
}

TEST(TokenFileTest, VocabularyChecks) {
  absl::StatusOr<std::string> bytes = EncodeTokenFile({1, 2, 99}, 2, 100);
  ASSERT_TRUE(bytes.ok());
  // The file's vocabulary is larger than the model's: rejected at open.
  EXPECT_THAT(Message(TokenFile::Open(NewMemoryFile(*bytes), {.vocab_size = 50}).status()),
              HasSubstr("exceeds the model's vocab_size 50"));
  // Raw file with ids beyond the model's vocabulary: found at read, with the position.
  std::string raw = {1, 0, 2, 0, 60, 0};
  absl::StatusOr<std::unique_ptr<TokenFile>> f =
      TokenFile::Open(NewMemoryFile(raw), {.raw_token_bytes = 2, .vocab_size = 50});
  ASSERT_TRUE(f.ok());
  std::vector<int64_t> out(3);
  EXPECT_THAT(Message((*f)->Read(0, 3, out.data())), HasSubstr("token 2 = 60"));
  EXPECT_TRUE((*f)->Read(0, 2, out.data()).ok());
  EXPECT_EQ((*f)->Read(2, 2, out.data()).code(), absl::StatusCode::kOutOfRange);
  EXPECT_EQ((*f)->Read(-1, 1, out.data()).code(), absl::StatusCode::kOutOfRange);

  EXPECT_FALSE(EncodeTokenFile({70000}, 2, 0).ok());
  EXPECT_FALSE(EncodeTokenFile({5}, 4, 5).ok());
  EXPECT_FALSE(EncodeTokenFile({5}, 3, 0).ok());
}

TEST(TokenFileTest, CorruptHeaders) {
  absl::StatusOr<std::string> good = EncodeTokenFile({1, 2, 3}, 2, 10);
  ASSERT_TRUE(good.ok());
  auto open = [](const std::string& b) {
    return Message(TokenFile::Open(NewMemoryFile(b), {}).status());
  };
  std::string bad_version = *good;
  bad_version[8] = 2;
  EXPECT_THAT(open(bad_version), HasSubstr("\"version\" = 2"));
  std::string bad_width = *good;
  bad_width[12] = 3;
  EXPECT_THAT(open(bad_width), HasSubstr("\"token_bytes\" = 3"));
  std::string bad_count = *good;
  bad_count[16] = 4;
  EXPECT_THAT(open(bad_count), HasSubstr("\"num_tokens\" = 4"));
  std::string huge_count = *good;
  for (int i = 16; i < 24; ++i) huge_count[i] = static_cast<char>(0xff);
  EXPECT_THAT(open(huge_count), HasSubstr("\"num_tokens\""));
  std::string bad_vocab = *good;
  bad_vocab[24 + 3] = 1;  // 2^24 + 10 > 2^16
  EXPECT_THAT(open(bad_vocab), HasSubstr("\"vocab_size\""));
  EXPECT_THAT(open(good->substr(0, 20)), HasSubstr("header truncated"));
  // Every truncation is an error (the header records the count).
  for (size_t n = 8; n < good->size(); ++n)
    EXPECT_FALSE(TokenFile::Open(NewMemoryFile(good->substr(0, n)), {}).ok()) << n;
}

TEST(TokenFileTest, WritesAndOpensRealFiles) {
  namespace fs = std::filesystem;
  const fs::path dir = fs::path(::testing::TempDir()) / "token_file_test";
  fs::create_directories(dir);
  const std::string path = (dir / "t.tokens").string();
  std::vector<uint32_t> tokens(100000);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<uint32_t>((i * 31) % 1000);
  ASSERT_TRUE(WriteTokenFile(path, tokens, 2, 1000).ok());
  absl::StatusOr<std::unique_ptr<TokenFile>> f = TokenFile::Open(path, {.vocab_size = 1000});
  ASSERT_TRUE(f.ok()) << f.status();
  // A read larger than the internal staging slice.
  std::vector<int64_t> out(tokens.size() - 10);
  ASSERT_TRUE((*f)->Read(10, static_cast<int64_t>(out.size()), out.data()).ok());
  for (size_t i = 0; i < out.size(); ++i) ASSERT_EQ(out[i], tokens[i + 10]);
  EXPECT_EQ(TokenFile::Open((dir / "missing").string(), {}).status().code(),
            absl::StatusCode::kNotFound);
}

// The whole file is scanned before training: the first id outside the vocabulary is named with its
// position even when it lies slices past the start (Read would meet it only at that batch).
TEST(TokenFileTest, CheckAllIdsNamesTheFirstBadPositionAndValue) {
  namespace fs = std::filesystem;
  const fs::path dir = fs::path(::testing::TempDir()) / "token_file_check_test";
  fs::create_directories(dir);
  const std::string path = (dir / "raw.bin").string();
  const int64_t n = (int64_t{5} << 19) + 7;  // two and a half scan slices
  const int64_t bad = n - 5;
  {
    std::string raw(static_cast<size_t>(2 * n), '\0');
    for (int64_t i = 0; i < n; ++i) {
      const uint32_t id = i == bad ? 40000 : i == bad + 2 ? 50000 : static_cast<uint32_t>(i % 2048);
      raw[2 * i] = static_cast<char>(id & 0xff);
      raw[2 * i + 1] = static_cast<char>(id >> 8);
    }
    std::ofstream(path, std::ios::binary) << raw;
  }
  absl::StatusOr<std::unique_ptr<TokenFile>> f =
      TokenFile::Open(path, {.raw_token_bytes = 2, .vocab_size = 2048});
  ASSERT_TRUE(f.ok()) << f.status();
  const absl::Status s = (*f)->CheckAllIds();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(Message(s), HasSubstr(absl::StrCat("token ", bad, " = 40000")));
  EXPECT_THAT(Message(s), HasSubstr("2048"));
  // The same file against a vocabulary that holds every id, and unchecked without one.
  EXPECT_TRUE((*TokenFile::Open(path, {.raw_token_bytes = 2, .vocab_size = 65536}))->CheckAllIds().ok());
  EXPECT_TRUE((*TokenFile::Open(path, {.raw_token_bytes = 2}))->CheckAllIds().ok());

  // 4-byte tokens with a header that names no vocabulary: the model's applies.
  std::vector<uint32_t> tokens(8000, 3);
  tokens[4000] = 70000;
  ASSERT_TRUE(WriteTokenFile((dir / "h.tokens").string(), tokens, 4, 0).ok());
  absl::StatusOr<std::unique_ptr<TokenFile>> h =
      TokenFile::Open((dir / "h.tokens").string(), {.vocab_size = 2048});
  ASSERT_TRUE(h.ok()) << h.status();
  EXPECT_THAT(Message((*h)->CheckAllIds()), HasSubstr("token 4000 = 70000"));
  fs::remove_all(dir);
}

}  // namespace
}  // namespace memplan::io
