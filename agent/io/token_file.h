// TokenFile: a flat file of token ids for training. Two layouts (see agent/io/README.md):
//   * memplan token file: a 32-byte header — magic "MPTOKENS", u32 version (1), u32 token_bytes
//     (2 or 4), u64 num_tokens, u64 vocab_size (0 = unknown) — followed by the tokens;
//   * raw: tokens only (e.g. nanoGPT-style uint16 .bin), width given by TokenFileOptions.
// All integers little-endian. Reads are bounded pread calls; ids are checked against the vocab.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "agent/io/random_access_file.h"

namespace memplan::io {

inline constexpr char kTokenFileMagic[8] = {'M', 'P', 'T', 'O', 'K', 'E', 'N', 'S'};
inline constexpr int64_t kTokenFileHeaderBytes = 32;
inline constexpr uint32_t kTokenFileVersion = 1;

struct TokenFileOptions {
  // Width of a headerless file: 2 (uint16) or 4 (uint32). 0: the file must carry the header.
  int raw_token_bytes = 0;
  // The model's vocabulary size; 0 = unchecked. A header vocab larger than this is rejected at
  // open, and every id read must be below min(header vocab, this).
  int64_t vocab_size = 0;
};

// Thread-safe after Open (reads are positional).
class TokenFile {
 public:
  static absl::StatusOr<std::unique_ptr<TokenFile>> Open(const std::string& path,
                                                         const TokenFileOptions& options);
  static absl::StatusOr<std::unique_ptr<TokenFile>> Open(std::unique_ptr<RandomAccessFile> file,
                                                         const TokenFileOptions& options);

  int64_t num_tokens() const { return num_tokens_; }
  int token_bytes() const { return token_bytes_; }
  int64_t vocab_size() const { return vocab_size_; }  // 0 = unknown
  bool has_header() const { return data_offset_bytes_ > 0; }

  // Reads tokens [first, first + count) widened to int64. OUT_OF_RANGE outside the file,
  // INVALID_ARGUMENT (naming the position) for an id >= vocab_size().
  absl::Status Read(int64_t first, int64_t count, int64_t* out) const;
  // Reads every token once, in slices of bounded size: INVALID_ARGUMENT naming the first position
  // whose id is >= vocab_size() and that id (what Read would report only when it got there).
  // OK at once when vocab_size() is 0.
  absl::Status CheckAllIds() const;

 private:
  TokenFile(std::unique_ptr<RandomAccessFile> file, int64_t data_offset_bytes, int token_bytes,
            int64_t num_tokens, int64_t vocab_size)
      : file_(std::move(file)),
        data_offset_bytes_(data_offset_bytes),
        token_bytes_(token_bytes),
        num_tokens_(num_tokens),
        vocab_size_(vocab_size) {}

  std::unique_ptr<RandomAccessFile> file_;
  int64_t data_offset_bytes_;
  int token_bytes_;
  int64_t num_tokens_;
  int64_t vocab_size_;
};

// Encodes tokens with the memplan header (token_bytes 2 or 4; every id must fit the width and be
// below vocab_size when vocab_size > 0).
absl::StatusOr<std::string> EncodeTokenFile(const std::vector<uint32_t>& tokens, int token_bytes,
                                            int64_t vocab_size);
// EncodeTokenFile, written and fsynced to `path`.
absl::Status WriteTokenFile(const std::string& path, const std::vector<uint32_t>& tokens,
                            int token_bytes, int64_t vocab_size);

}  // namespace memplan::io
