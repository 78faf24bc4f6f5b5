#include "agent/io/safetensors_writer.h"

#include <limits>
#include <set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "agent/io/writable_file.h"
#include "common/status.h"
#include "nlohmann/json.hpp"

namespace memplan::io {
namespace {

// ordered_json keeps insertion order, so the header lists tensors in data order.
using OrderedJson = nlohmann::ordered_json;

absl::StatusOr<int64_t> TensorBytes(const SafetensorsTensorView& t) {
  int64_t numel = 1;
  bool empty = false;
  bool overflow = false;
  for (int64_t d : t.shape) {
    if (d < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("tensor \"", t.name, "\": negative dimension ", d));
    }
    if (d == 0) empty = true;
    if (d != 0 && numel > std::numeric_limits<int64_t>::max() / d) overflow = true;
    if (!overflow) numel *= d;
  }
  if (empty) return 0;
  const int64_t item = SafetensorsDTypeBytes(t.dtype);
  if (overflow || numel > std::numeric_limits<int64_t>::max() / item) {
    return absl::InvalidArgumentError(absl::StrCat("tensor \"", t.name, "\": size overflows"));
  }
  return numel * item;
}

std::string Prefix(int64_t header_bytes) {
  std::string out(8, '\0');
  const uint64_t n = static_cast<uint64_t>(header_bytes);
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((n >> (8 * i)) & 0xff);
  return out;
}

absl::Status CheckData(const std::vector<SafetensorsTensorView>& tensors) {
  for (const SafetensorsTensorView& t : tensors) {
    ASSIGN_OR_RETURN(int64_t bytes, TensorBytes(t));
    if (bytes > 0 && t.data == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat("tensor \"", t.name, "\": null data"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::string> BuildSafetensorsHeader(
    const std::vector<SafetensorsTensorView>& tensors, const SafetensorsMetadata& metadata) {
  OrderedJson root = OrderedJson::object();
  if (!metadata.empty()) {
    OrderedJson meta = OrderedJson::object();
    for (const auto& [k, v] : metadata) meta[k] = v;
    root["__metadata__"] = std::move(meta);
  }
  std::set<std::string> names;
  int64_t offset = 0;
  for (const SafetensorsTensorView& t : tensors) {
    if (t.name.empty() || t.name == "__metadata__") {
      return absl::InvalidArgumentError(absl::StrCat("invalid tensor name \"", t.name, "\""));
    }
    if (!names.insert(t.name).second) {
      return absl::InvalidArgumentError(absl::StrCat("duplicate tensor name \"", t.name, "\""));
    }
    if (t.shape.size() > static_cast<size_t>(kMaxSafetensorsRank)) {
      return absl::InvalidArgumentError(absl::StrCat("tensor \"", t.name, "\": rank too large"));
    }
    ASSIGN_OR_RETURN(int64_t bytes, TensorBytes(t));
    if (offset > std::numeric_limits<int64_t>::max() - bytes) {
      return absl::InvalidArgumentError("total tensor bytes overflow");
    }
    OrderedJson entry = OrderedJson::object();
    entry["dtype"] = std::string(SafetensorsDTypeName(t.dtype));
    entry["shape"] = t.shape;
    entry["data_offsets"] = {offset, offset + bytes};
    root[t.name] = std::move(entry);
    offset += bytes;
  }
  std::string json;
  try {
    json = root.dump();
  } catch (const nlohmann::json::exception& e) {  // invalid UTF-8 in a name or metadata
    return absl::InvalidArgumentError(absl::StrCat("cannot encode safetensors header: ", e.what()));
  }
  // Pad so the data section (at 8 + N) starts 8-byte aligned, as the reference writer does.
  json.append((8 - json.size() % 8) % 8, ' ');
  // Self-check: what we write must be what we accept.
  RETURN_IF_ERROR(ParseSafetensorsHeader(json, offset).status());
  return json;
}

class SafetensorsFileWriter::Impl {
 public:
  std::unique_ptr<WritableFile> file;
  std::vector<std::string> names;
  std::vector<int64_t> sizes;
  size_t next = 0;
  bool failed = false;
};

SafetensorsFileWriter::SafetensorsFileWriter(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
SafetensorsFileWriter::~SafetensorsFileWriter() = default;

absl::StatusOr<std::unique_ptr<SafetensorsFileWriter>> SafetensorsFileWriter::Create(
    const std::string& path, const std::vector<SafetensorsTensorView>& layout,
    const SafetensorsMetadata& metadata) {
  ASSIGN_OR_RETURN(std::string header, BuildSafetensorsHeader(layout, metadata));
  auto impl = std::make_unique<Impl>();
  for (const SafetensorsTensorView& t : layout) {
    ASSIGN_OR_RETURN(int64_t bytes, TensorBytes(t));
    impl->names.push_back(t.name);
    impl->sizes.push_back(bytes);
  }
  ASSIGN_OR_RETURN(impl->file, WritableFile::Create(path));
  RETURN_IF_ERROR(impl->file->Append(Prefix(static_cast<int64_t>(header.size()))));
  RETURN_IF_ERROR(impl->file->Append(header));
  return std::unique_ptr<SafetensorsFileWriter>(new SafetensorsFileWriter(std::move(impl)));
}

absl::Status SafetensorsFileWriter::AppendTensor(const void* data, int64_t size_bytes) {
  Impl& s = *impl_;
  if (s.failed) return absl::FailedPreconditionError("an earlier write failed");
  if (s.next >= s.sizes.size()) {
    return absl::FailedPreconditionError(
        absl::StrCat(s.file->path(), ": more tensors appended than the layout has"));
  }
  if (size_bytes != s.sizes[s.next]) {
    return absl::InvalidArgumentError(absl::StrCat(s.file->path(), ": tensor \"", s.names[s.next],
                                                   "\" needs ", s.sizes[s.next], " bytes, got ",
                                                   size_bytes));
  }
  if (size_bytes > 0 && data == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat("tensor \"", s.names[s.next], "\": null data"));
  }
  if (absl::Status st = s.file->Append(data, size_bytes); !st.ok()) {
    s.failed = true;
    return st;
  }
  ++s.next;
  return absl::OkStatus();
}

absl::Status SafetensorsFileWriter::Finish() {
  Impl& s = *impl_;
  if (s.failed) return absl::FailedPreconditionError("an earlier write failed");
  if (s.next != s.sizes.size()) {
    return absl::FailedPreconditionError(
        absl::StrCat(s.file->path(), ": ", s.next, " of ", s.sizes.size(), " tensors written"));
  }
  RETURN_IF_ERROR(s.file->Sync());
  return s.file->Close();
}

absl::StatusOr<std::string> SerializeSafetensors(const std::vector<SafetensorsTensorView>& tensors,
                                                 const SafetensorsMetadata& metadata) {
  RETURN_IF_ERROR(CheckData(tensors));
  ASSIGN_OR_RETURN(std::string header, BuildSafetensorsHeader(tensors, metadata));
  std::string out = Prefix(static_cast<int64_t>(header.size()));
  out += header;
  for (const SafetensorsTensorView& t : tensors) {
    ASSIGN_OR_RETURN(int64_t bytes, TensorBytes(t));
    if (bytes > 0) out.append(static_cast<const char*>(t.data), static_cast<size_t>(bytes));
  }
  return out;
}

absl::Status WriteSafetensorsFile(const std::string& path,
                                  const std::vector<SafetensorsTensorView>& tensors,
                                  const SafetensorsMetadata& metadata) {
  RETURN_IF_ERROR(CheckData(tensors));
  ASSIGN_OR_RETURN(std::unique_ptr<SafetensorsFileWriter> writer,
                   SafetensorsFileWriter::Create(path, tensors, metadata));
  for (const SafetensorsTensorView& t : tensors) {
    ASSIGN_OR_RETURN(int64_t bytes, TensorBytes(t));
    RETURN_IF_ERROR(writer->AppendTensor(t.data, bytes));
  }
  return writer->Finish();
}

}  // namespace memplan::io
