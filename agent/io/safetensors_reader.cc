#include "agent/io/safetensors_reader.h"

#include <bit>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status.h"

namespace memplan::io {

// Tensor bytes are handed to callers as stored; the format is little-endian.
static_assert(std::endian::native == std::endian::little, "safetensors I/O assumes little-endian");

absl::StatusOr<std::unique_ptr<SafetensorsReader>> SafetensorsReader::Open(
    const std::string& path) {
  ASSIGN_OR_RETURN(std::unique_ptr<RandomAccessFile> file, OpenRandomAccessFile(path));
  return Open(std::move(file));
}

absl::StatusOr<std::unique_ptr<SafetensorsReader>> SafetensorsReader::Open(
    std::unique_ptr<RandomAccessFile> file) {
  const int64_t file_bytes = file->size_bytes();
  auto fail = [&file](const absl::Status& s) {
    return absl::Status(s.code(), absl::StrCat(file->name(), ": ", s.message()));
  };
  if (file_bytes < kSafetensorsPrefixBytes) {
    return fail(absl::InvalidArgumentError(absl::StrCat(
        "file has ", file_bytes, " bytes, fewer than the 8-byte header length prefix")));
  }
  unsigned char prefix[kSafetensorsPrefixBytes];
  if (absl::Status s = file->ReadAt(0, kSafetensorsPrefixBytes, prefix); !s.ok()) return s;
  absl::StatusOr<int64_t> header_bytes = DecodeSafetensorsHeaderLength(prefix, file_bytes);
  if (!header_bytes.ok()) return fail(header_bytes.status());
  // Bounded by kMaxSafetensorsHeaderBytes and by the file size, both checked above.
  std::string json(static_cast<size_t>(*header_bytes), '\0');
  if (absl::Status s = file->ReadAt(kSafetensorsPrefixBytes, *header_bytes, json.data()); !s.ok()) {
    return s;
  }
  absl::StatusOr<SafetensorsHeader> header =
      ParseSafetensorsHeader(json, file_bytes - kSafetensorsPrefixBytes - *header_bytes);
  if (!header.ok()) return fail(header.status());
  return std::unique_ptr<SafetensorsReader>(
      new SafetensorsReader(std::move(file), *std::move(header)));
}

absl::Status SafetensorsReader::ReadTensorBytes(const SafetensorsTensorInfo& tensor, void* dst,
                                                int64_t dst_bytes) const {
  if (dst_bytes != tensor.size_bytes()) {
    return absl::InvalidArgumentError(absl::StrCat(name(), ": tensor \"", tensor.name, "\" has ",
                                                   tensor.size_bytes(), " bytes, buffer has ",
                                                   dst_bytes));
  }
  return file_->ReadAt(header_.data_offset_bytes + tensor.begin_bytes, tensor.size_bytes(), dst);
}

absl::Status SafetensorsReader::ReadTensorBytesAt(const SafetensorsTensorInfo& tensor,
                                                  int64_t offset_bytes, void* dst,
                                                  int64_t dst_bytes) const {
  if (offset_bytes < 0 || dst_bytes < 0 || offset_bytes > tensor.size_bytes() ||
      dst_bytes > tensor.size_bytes() - offset_bytes) {
    return absl::OutOfRangeError(absl::StrCat(name(), ": bytes [", offset_bytes, ", ",
                                              offset_bytes + dst_bytes, ") of tensor \"",
                                              tensor.name, "\" (", tensor.size_bytes(),
                                              " bytes)"));
  }
  return file_->ReadAt(header_.data_offset_bytes + tensor.begin_bytes + offset_bytes, dst_bytes,
                       dst);
}

absl::Status SafetensorsReader::ReadTensorBytes(std::string_view tensor_name, void* dst,
                                                int64_t dst_bytes) const {
  const SafetensorsTensorInfo* tensor = header_.Find(tensor_name);
  if (tensor == nullptr) {
    return absl::NotFoundError(
        absl::StrCat(name(), ": no tensor named \"", std::string(tensor_name), "\""));
  }
  return ReadTensorBytes(*tensor, dst, dst_bytes);
}

}  // namespace memplan::io
