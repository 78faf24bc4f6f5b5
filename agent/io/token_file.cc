#include "agent/io/token_file.h"

#include <algorithm>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "agent/io/writable_file.h"
#include "common/status.h"

namespace memplan::io {
namespace {

uint64_t LoadLe(const unsigned char* p, int bytes) {
  uint64_t v = 0;
  for (int i = bytes - 1; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}

void StoreLe(uint64_t v, int bytes, std::string* out) {
  for (int i = 0; i < bytes; ++i) out->push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}

// Tokens are converted in bounded slices so a huge Read never needs a huge staging buffer.
constexpr int64_t kSliceTokens = int64_t{1} << 16;

}  // namespace

absl::StatusOr<std::unique_ptr<TokenFile>> TokenFile::Open(const std::string& path,
                                                           const TokenFileOptions& options) {
  ASSIGN_OR_RETURN(std::unique_ptr<RandomAccessFile> file, OpenRandomAccessFile(path));
  return Open(std::move(file), options);
}

absl::StatusOr<std::unique_ptr<TokenFile>> TokenFile::Open(std::unique_ptr<RandomAccessFile> file,
                                                           const TokenFileOptions& options) {
  const std::string name = file->name();
  if (options.raw_token_bytes != 0 && options.raw_token_bytes != 2 &&
      options.raw_token_bytes != 4) {
    return absl::InvalidArgumentError(absl::StrCat("raw_token_bytes = ", options.raw_token_bytes,
                                                   " is not supported; allowed: 2, 4"));
  }
  if (options.vocab_size < 0) {
    return absl::InvalidArgumentError("vocab_size must be >= 0");
  }
  const int64_t size = file->size_bytes();
  bool has_magic = false;
  unsigned char header[kTokenFileHeaderBytes];
  if (size >= 8) {
    RETURN_IF_ERROR(file->ReadAt(0, 8, header));
    has_magic = std::memcmp(header, kTokenFileMagic, 8) == 0;
  }

  if (has_magic) {
    if (size < kTokenFileHeaderBytes) {
      return absl::InvalidArgumentError(
          absl::StrCat(name, ": token file header truncated (", size, " of 32 bytes)"));
    }
    RETURN_IF_ERROR(file->ReadAt(0, kTokenFileHeaderBytes, header));
    const uint64_t version = LoadLe(header + 8, 4);
    const uint64_t token_bytes = LoadLe(header + 12, 4);
    const uint64_t num_tokens = LoadLe(header + 16, 8);
    const uint64_t vocab = LoadLe(header + 24, 8);
    if (version != kTokenFileVersion) {
      return absl::InvalidArgumentError(
          absl::StrCat(name, ": token file field \"version\" = ", version, "; supported: 1"));
    }
    if (token_bytes != 2 && token_bytes != 4) {
      return absl::InvalidArgumentError(absl::StrCat(
          name, ": token file field \"token_bytes\" = ", token_bytes, "; allowed: 2, 4"));
    }
    const uint64_t payload = static_cast<uint64_t>(size - kTokenFileHeaderBytes);
    if (num_tokens > payload / token_bytes || num_tokens * token_bytes != payload) {
      return absl::InvalidArgumentError(absl::StrCat(
          name, ": token file field \"num_tokens\" = ", num_tokens, " does not match the ", payload,
          " data bytes (", token_bytes, " bytes per token)"));
    }
    if (vocab > (uint64_t{1} << (8 * token_bytes))) {
      return absl::InvalidArgumentError(
          absl::StrCat(name, ": token file field \"vocab_size\" = ", vocab, " does not fit ",
                       token_bytes, "-byte tokens"));
    }
    if (options.vocab_size > 0 && vocab > static_cast<uint64_t>(options.vocab_size)) {
      return absl::InvalidArgumentError(absl::StrCat(name, ": token file vocab_size ", vocab,
                                                     " exceeds the model's vocab_size ",
                                                     options.vocab_size));
    }
    int64_t effective_vocab = static_cast<int64_t>(vocab);
    if (options.vocab_size > 0 && (effective_vocab == 0 || options.vocab_size < effective_vocab)) {
      effective_vocab = options.vocab_size;
    }
    return std::unique_ptr<TokenFile>(
        new TokenFile(std::move(file), kTokenFileHeaderBytes, static_cast<int>(token_bytes),
                      static_cast<int64_t>(num_tokens), effective_vocab));
  }

  if (options.raw_token_bytes == 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        name, ": no MPTOKENS header; pass the token width (2 or 4 bytes) for a raw token file"));
  }
  if (size % options.raw_token_bytes != 0) {
    return absl::InvalidArgumentError(absl::StrCat(name, ": raw token file size ", size,
                                                   " is not a multiple of ",
                                                   options.raw_token_bytes, " bytes"));
  }
  return std::unique_ptr<TokenFile>(new TokenFile(std::move(file), 0, options.raw_token_bytes,
                                                  size / options.raw_token_bytes,
                                                  options.vocab_size));
}

absl::Status TokenFile::Read(int64_t first, int64_t count, int64_t* out) const {
  if (first < 0 || count < 0 || first > num_tokens_ || count > num_tokens_ - first) {
    return absl::OutOfRangeError(absl::StrCat(file_->name(), ": tokens [", first, ", +", count,
                                              ") outside the file's ", num_tokens_, " tokens"));
  }
  std::vector<unsigned char> staging(
      static_cast<size_t>(std::min(count, kSliceTokens) * token_bytes_));
  for (int64_t done = 0; done < count;) {
    const int64_t n = std::min(count - done, kSliceTokens);
    RETURN_IF_ERROR(file_->ReadAt(data_offset_bytes_ + (first + done) * token_bytes_,
                                  n * token_bytes_, staging.data()));
    for (int64_t i = 0; i < n; ++i) {
      const int64_t id = static_cast<int64_t>(LoadLe(&staging[i * token_bytes_], token_bytes_));
      if (vocab_size_ > 0 && id >= vocab_size_) {
        return absl::InvalidArgumentError(absl::StrCat(file_->name(), ": token ", first + done + i,
                                                       " = ", id, " is outside the vocabulary (",
                                                       vocab_size_, ")"));
      }
      out[done + i] = id;
    }
    done += n;
  }
  return absl::OkStatus();
}

absl::Status TokenFile::CheckAllIds() const {
  if (vocab_size_ <= 0) return absl::OkStatus();
  constexpr int64_t kScanTokens = int64_t{1} << 20;
  std::vector<unsigned char> staging(
      static_cast<size_t>(std::min(num_tokens_, kScanTokens) * token_bytes_));
  for (int64_t first = 0; first < num_tokens_;) {
    const int64_t n = std::min(num_tokens_ - first, kScanTokens);
    RETURN_IF_ERROR(file_->ReadAt(data_offset_bytes_ + first * token_bytes_, n * token_bytes_,
                                  staging.data()));
    // The slice's largest id first (a loop the compiler vectorises); the position only on failure.
    uint32_t largest = 0;
    const unsigned char* p = staging.data();
    if (token_bytes_ == 2) {
      for (int64_t i = 0; i < n; ++i) {
        largest = std::max<uint32_t>(largest, p[2 * i] | (uint32_t{p[2 * i + 1]} << 8));
      }
    } else {
      for (int64_t i = 0; i < n; ++i) {
        largest = std::max<uint32_t>(largest, static_cast<uint32_t>(LoadLe(p + 4 * i, 4)));
      }
    }
    if (static_cast<int64_t>(largest) >= vocab_size_) {
      for (int64_t i = 0; i < n; ++i) {
        const int64_t id = static_cast<int64_t>(LoadLe(p + i * token_bytes_, token_bytes_));
        if (id >= vocab_size_) {
          return absl::InvalidArgumentError(absl::StrCat(
              file_->name(), ": token ", first + i, " = ", id, " is outside the model's vocabulary (",
              vocab_size_, " ids, 0 to ", vocab_size_ - 1, "); checked before training"));
        }
      }
    }
    first += n;
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> EncodeTokenFile(const std::vector<uint32_t>& tokens, int token_bytes,
                                            int64_t vocab_size) {
  if (token_bytes != 2 && token_bytes != 4) {
    return absl::InvalidArgumentError(
        absl::StrCat("token_bytes = ", token_bytes, " is not supported; allowed: 2, 4"));
  }
  const uint64_t limit = uint64_t{1} << (8 * token_bytes);
  if (vocab_size < 0 || static_cast<uint64_t>(vocab_size) > limit) {
    return absl::InvalidArgumentError(
        absl::StrCat("vocab_size = ", vocab_size, " does not fit ", token_bytes, "-byte tokens"));
  }
  std::string out(kTokenFileMagic, 8);
  StoreLe(kTokenFileVersion, 4, &out);
  StoreLe(static_cast<uint64_t>(token_bytes), 4, &out);
  StoreLe(tokens.size(), 8, &out);
  StoreLe(static_cast<uint64_t>(vocab_size), 8, &out);
  out.reserve(out.size() + tokens.size() * token_bytes);
  for (size_t i = 0; i < tokens.size(); ++i) {
    const uint64_t id = tokens[i];
    if (id >= limit || (vocab_size > 0 && id >= static_cast<uint64_t>(vocab_size))) {
      return absl::InvalidArgumentError(
          absl::StrCat("token ", i, " = ", id, " does not fit the vocabulary / width"));
    }
    StoreLe(id, token_bytes, &out);
  }
  return out;
}

absl::Status WriteTokenFile(const std::string& path, const std::vector<uint32_t>& tokens,
                            int token_bytes, int64_t vocab_size) {
  ASSIGN_OR_RETURN(std::string bytes, EncodeTokenFile(tokens, token_bytes, vocab_size));
  return WriteFileDurably(path, bytes);
}

}  // namespace memplan::io
