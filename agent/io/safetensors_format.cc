#include "agent/io/safetensors_format.h"

#include <algorithm>
#include <array>
#include <limits>
#include <set>
#include <tuple>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "nlohmann/json.hpp"

namespace memplan::io {
namespace {

using Json = nlohmann::json;

struct DTypeEntry {
  SafetensorsDType dtype;
  const char* name;
  int64_t bytes;
};

constexpr std::array<DTypeEntry, 15> kDTypes = {{
    {SafetensorsDType::kBool, "BOOL", 1},
    {SafetensorsDType::kU8, "U8", 1},
    {SafetensorsDType::kI8, "I8", 1},
    {SafetensorsDType::kF8E5M2, "F8_E5M2", 1},
    {SafetensorsDType::kF8E4M3, "F8_E4M3", 1},
    {SafetensorsDType::kI16, "I16", 2},
    {SafetensorsDType::kU16, "U16", 2},
    {SafetensorsDType::kF16, "F16", 2},
    {SafetensorsDType::kBF16, "BF16", 2},
    {SafetensorsDType::kI32, "I32", 4},
    {SafetensorsDType::kU32, "U32", 4},
    {SafetensorsDType::kF32, "F32", 4},
    {SafetensorsDType::kI64, "I64", 8},
    {SafetensorsDType::kU64, "U64", 8},
    {SafetensorsDType::kF64, "F64", 8},
}};

const DTypeEntry& Entry(SafetensorsDType dtype) {
  for (const DTypeEntry& e : kDTypes) {
    if (e.dtype == dtype) return e;
  }
  return kDTypes[0];  // unreachable: every enumerator is in the table
}

// Thrown from inside nlohmann's parse callback (the only way to stop its DOM parser early) and
// caught in ParseJsonStrict; it never leaves this file.
struct JsonRejected {
  std::string message;
};

// Parses with two extra rules the safetensors layout needs: no duplicate keys in any object (a
// duplicated tensor name would otherwise silently shadow another) and nesting depth <= 3 (object
// -> tensor entry -> shape array), which bounds the work an adversarial header can cause.
absl::StatusOr<Json> ParseJsonStrict(absl::string_view text) {
  std::vector<std::set<std::string>> keys_per_object;
  auto callback = [&keys_per_object](int depth, Json::parse_event_t event, Json& parsed) {
    switch (event) {
      case Json::parse_event_t::object_start:
      case Json::parse_event_t::array_start:
        if (depth >= 3) throw JsonRejected{"nesting deeper than 3 levels"};
        if (event == Json::parse_event_t::object_start) keys_per_object.emplace_back();
        break;
      case Json::parse_event_t::object_end:
        keys_per_object.pop_back();
        break;
      case Json::parse_event_t::key:
        if (!keys_per_object.back().insert(parsed.get<std::string>()).second) {
          throw JsonRejected{absl::StrCat("duplicate key \"", parsed.get<std::string>(), "\"")};
        }
        break;
      default:
        break;
    }
    return true;
  };
  try {
    return Json::parse(text.begin(), text.end(), callback);
  } catch (const JsonRejected& e) {
    return absl::InvalidArgumentError(absl::StrCat("safetensors header: ", e.message));
  } catch (const Json::exception& e) {
    return absl::InvalidArgumentError(
        absl::StrCat("safetensors header: malformed JSON: ", e.what()));
  }
}

absl::Status TensorError(const std::string& name, absl::string_view field, absl::string_view what) {
  return absl::InvalidArgumentError(
      absl::StrCat("safetensors header: tensor \"", name, "\" field \"", field, "\": ", what));
}

// A JSON number that is a non-negative integer representable as int64.
std::optional<int64_t> NonNegativeInt(const Json& v) {
  if (v.is_number_unsigned()) {
    const uint64_t u = v.get<uint64_t>();
    if (u > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) return std::nullopt;
    return static_cast<int64_t>(u);
  }
  if (v.is_number_integer()) {
    const int64_t i = v.get<int64_t>();
    if (i < 0) return std::nullopt;
    return i;
  }
  return std::nullopt;
}

absl::StatusOr<SafetensorsTensorInfo> ParseTensorEntry(const std::string& name, const Json& entry,
                                                       int64_t data_bytes) {
  if (name.empty()) {
    return absl::InvalidArgumentError("safetensors header: empty tensor name");
  }
  if (!entry.is_object()) {
    return TensorError(name, "(entry)", "must be an object with dtype, shape, data_offsets");
  }
  SafetensorsTensorInfo info;
  info.name = name;

  auto dtype_it = entry.find("dtype");
  if (dtype_it == entry.end()) return TensorError(name, "dtype", "missing");
  if (!dtype_it->is_string()) return TensorError(name, "dtype", "must be a string");
  std::optional<SafetensorsDType> dtype = ParseSafetensorsDType(dtype_it->get<std::string>());
  if (!dtype.has_value()) {
    std::vector<std::string> names;
    for (const DTypeEntry& e : kDTypes) names.push_back(e.name);
    return TensorError(name, "dtype",
                       absl::StrCat("unknown dtype \"", dtype_it->get<std::string>(),
                                    "\"; allowed: ", absl::StrJoin(names, ", ")));
  }
  info.dtype = *dtype;

  auto shape_it = entry.find("shape");
  if (shape_it == entry.end()) return TensorError(name, "shape", "missing");
  if (!shape_it->is_array()) return TensorError(name, "shape", "must be an array");
  if (shape_it->size() > static_cast<size_t>(kMaxSafetensorsRank)) {
    return TensorError(name, "shape",
                       absl::StrCat("rank ", shape_it->size(), " exceeds ", kMaxSafetensorsRank));
  }
  // The element count is computed with an overflow check per dimension; a zero dimension
  // makes the tensor empty whatever the others are, but every dimension must still be valid.
  int64_t numel = 1;
  bool overflow = false;
  for (size_t i = 0; i < shape_it->size(); ++i) {
    std::optional<int64_t> dim = NonNegativeInt((*shape_it)[i]);
    if (!dim.has_value()) {
      return TensorError(name, "shape",
                         absl::StrCat("dimension ", i, " = ", (*shape_it)[i].dump(),
                                      " is not a non-negative 64-bit integer"));
    }
    info.shape.push_back(*dim);
    if (*dim != 0 && numel > std::numeric_limits<int64_t>::max() / *dim) overflow = true;
    if (!overflow) numel *= *dim;
  }
  const bool empty = std::find(info.shape.begin(), info.shape.end(), 0) != info.shape.end();
  const int64_t item_bytes = SafetensorsDTypeBytes(info.dtype);
  if (!empty && (overflow || numel > std::numeric_limits<int64_t>::max() / item_bytes)) {
    return TensorError(name, "shape", "element count x item size overflows 64 bits");
  }
  const int64_t expected_bytes = empty ? 0 : numel * item_bytes;

  auto offsets_it = entry.find("data_offsets");
  if (offsets_it == entry.end()) return TensorError(name, "data_offsets", "missing");
  if (!offsets_it->is_array() || offsets_it->size() != 2) {
    return TensorError(name, "data_offsets", "must be an array [begin, end]");
  }
  std::optional<int64_t> begin = NonNegativeInt((*offsets_it)[0]);
  std::optional<int64_t> end = NonNegativeInt((*offsets_it)[1]);
  if (!begin.has_value() || !end.has_value()) {
    return TensorError(name, "data_offsets",
                       absl::StrCat(offsets_it->dump(), " must be non-negative 64-bit integers"));
  }
  if (*begin > *end) {
    return TensorError(name, "data_offsets", absl::StrCat(offsets_it->dump(), ": begin > end"));
  }
  if (*end > data_bytes) {
    return TensorError(
        name, "data_offsets",
        absl::StrCat(offsets_it->dump(), " ends past the data section (", data_bytes, " bytes)"));
  }
  if (*end - *begin != expected_bytes) {
    return TensorError(name, "data_offsets",
                       absl::StrCat(offsets_it->dump(), " span ", *end - *begin, " bytes but ",
                                    std::string(SafetensorsDTypeName(info.dtype)), " ",
                                    Json(info.shape).dump(), " needs ", expected_bytes));
  }
  info.begin_bytes = *begin;
  info.end_bytes = *end;
  return info;
}

}  // namespace

int64_t SafetensorsDTypeBytes(SafetensorsDType dtype) { return Entry(dtype).bytes; }

std::string_view SafetensorsDTypeName(SafetensorsDType dtype) { return Entry(dtype).name; }

std::optional<SafetensorsDType> ParseSafetensorsDType(std::string_view name) {
  for (const DTypeEntry& e : kDTypes) {
    if (name == e.name) return e.dtype;
  }
  return std::nullopt;
}

int64_t SafetensorsTensorInfo::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

const SafetensorsTensorInfo* SafetensorsHeader::Find(std::string_view name) const {
  auto it = index.find(std::string(name));
  return it == index.end() ? nullptr : &tensors[it->second];
}

absl::StatusOr<int64_t> DecodeSafetensorsHeaderLength(const unsigned char prefix[8],
                                                      int64_t file_bytes) {
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | prefix[i];
  if (n > static_cast<uint64_t>(kMaxSafetensorsHeaderBytes)) {
    return absl::InvalidArgumentError(absl::StrCat("safetensors header length ", n,
                                                   " exceeds the limit of ",
                                                   kMaxSafetensorsHeaderBytes, " bytes"));
  }
  if (static_cast<int64_t>(n) > file_bytes - kSafetensorsPrefixBytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "safetensors header length ", n, " exceeds the ", file_bytes - kSafetensorsPrefixBytes,
        " bytes that follow the length prefix (truncated file?)"));
  }
  if (n < 2) {
    return absl::InvalidArgumentError(
        absl::StrCat("safetensors header length ", n, " is too small for a JSON object"));
  }
  return static_cast<int64_t>(n);
}

absl::StatusOr<SafetensorsHeader> ParseSafetensorsHeader(absl::string_view json,
                                                         int64_t data_bytes) {
  if (static_cast<int64_t>(json.size()) > kMaxSafetensorsHeaderBytes) {
    return absl::InvalidArgumentError("safetensors header exceeds the size limit");
  }
  if (data_bytes < 0) return absl::InvalidArgumentError("negative data section size");
  // The format requires the header to start with '{' (trailing space padding is allowed).
  if (json.empty() || json.front() != '{') {
    return absl::InvalidArgumentError("safetensors header: must start with '{'");
  }
  absl::StatusOr<Json> root = ParseJsonStrict(json);
  if (!root.ok()) return root.status();
  if (!root->is_object()) {
    return absl::InvalidArgumentError("safetensors header: top level must be a JSON object");
  }

  SafetensorsHeader header;
  header.data_offset_bytes = kSafetensorsPrefixBytes + static_cast<int64_t>(json.size());
  header.data_bytes = data_bytes;
  for (const auto& [key, value] : root->items()) {
    if (key == "__metadata__") {
      if (!value.is_object()) {
        return absl::InvalidArgumentError(
            "safetensors header: \"__metadata__\" must be an object of strings");
      }
      for (const auto& [mkey, mvalue] : value.items()) {
        if (!mvalue.is_string()) {
          return absl::InvalidArgumentError(absl::StrCat(
              "safetensors header: \"__metadata__\" entry \"", mkey, "\" must be a string"));
        }
        header.metadata.emplace(mkey, mvalue.get<std::string>());
      }
      continue;
    }
    absl::StatusOr<SafetensorsTensorInfo> info = ParseTensorEntry(key, value, data_bytes);
    if (!info.ok()) return info.status();
    header.tensors.push_back(*std::move(info));
  }

  // Tile check (the format's rule): sorted by offsets, each tensor starts where the previous
  // ended, the first at 0 and the last at the end of the data section. This rules out overlap,
  // gaps and trailing bytes.
  std::sort(header.tensors.begin(), header.tensors.end(),
            [](const SafetensorsTensorInfo& a, const SafetensorsTensorInfo& b) {
              return std::tie(a.begin_bytes, a.end_bytes, a.name) <
                     std::tie(b.begin_bytes, b.end_bytes, b.name);
            });
  int64_t cursor = 0;
  const SafetensorsTensorInfo* previous = nullptr;
  for (const SafetensorsTensorInfo& t : header.tensors) {
    if (t.begin_bytes != cursor) {
      return TensorError(
          t.name, "data_offsets",
          absl::StrCat("begins at ", t.begin_bytes, " but ",
                       previous == nullptr
                           ? std::string("the data section starts at 0")
                           : absl::StrCat("\"", previous->name, "\" ends at ", cursor),
                       t.begin_bytes < cursor ? " (overlap)" : " (gap)"));
    }
    cursor = t.end_bytes;
    previous = &t;
  }
  if (cursor != data_bytes) {
    return absl::InvalidArgumentError(absl::StrCat("safetensors header: tensors cover ", cursor,
                                                   " bytes but the data section has ", data_bytes,
                                                   " (truncated or trailing bytes)"));
  }
  for (size_t i = 0; i < header.tensors.size(); ++i)
    header.index.emplace(header.tensors[i].name, i);
  return header;
}

}  // namespace memplan::io
