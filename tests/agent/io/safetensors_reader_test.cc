#include "agent/io/safetensors_reader.h"

#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "agent/io/safetensors_writer.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace memplan::io {
namespace {

using ::testing::HasSubstr;

// A small file exercising every feature: metadata, several dtypes, a scalar and an empty tensor.
struct SmallFile {
  std::vector<float> a = {1.5f, -2.0f, 3.25f, 0.0f, 7.0f, -8.5f};
  std::vector<int64_t> step = {42};
  std::vector<uint16_t> half = {0x3c00, 0xc000};
  std::string bytes;

  SmallFile() {
    absl::StatusOr<std::string> s =
        SerializeSafetensors({{"model.a", SafetensorsDType::kF32, {2, 3}, a.data()},
                              {"step", SafetensorsDType::kI64, {}, step.data()},
                              {"empty", SafetensorsDType::kBF16, {0, 4}, nullptr},
                              {"h", SafetensorsDType::kF16, {2}, half.data()}},
                             {{"format", "pt"}});
    EXPECT_TRUE(s.ok()) << s.status();
    bytes = *s;
  }
};

absl::StatusOr<std::unique_ptr<SafetensorsReader>> OpenBytes(const std::string& bytes) {
  return SafetensorsReader::Open(NewMemoryFile(bytes));
}

// splitmix64: a fixed generator, so the fuzz loop is the same on every run.
struct Rng {
  uint64_t state;
  uint64_t Next() {
    uint64_t z = (state += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
  }
  uint64_t Below(uint64_t n) { return Next() % n; }
};

// Every accepted file must be internally consistent and every tensor readable.
void CheckAcceptedFile(const SafetensorsReader& reader, int64_t file_bytes) {
  const SafetensorsHeader& h = reader.header();
  int64_t cursor = 0;
  for (const SafetensorsTensorInfo& t : h.tensors) {
    ASSERT_EQ(t.begin_bytes, cursor);
    ASSERT_GE(t.size_bytes(), 0);
    cursor = t.end_bytes;
    std::vector<char> buffer(static_cast<size_t>(t.size_bytes()));
    ASSERT_TRUE(reader.ReadTensorBytes(t, buffer.data(), t.size_bytes()).ok()) << t.name;
  }
  ASSERT_EQ(h.data_offset_bytes + cursor, file_bytes);
}

TEST(SafetensorsReaderTest, ReadsBackWhatWasWritten) {
  SmallFile f;
  absl::StatusOr<std::unique_ptr<SafetensorsReader>> r = OpenBytes(f.bytes);
  ASSERT_TRUE(r.ok()) << r.status();
  const SafetensorsHeader& h = (*r)->header();
  ASSERT_EQ(h.tensors.size(), 4u);
  EXPECT_EQ(h.metadata.at("format"), "pt");
  EXPECT_EQ(h.data_offset_bytes % 8, 0);  // the writer pads the header

  std::vector<float> a(6);
  ASSERT_TRUE((*r)->ReadTensorBytes("model.a", a.data(), 24).ok());
  EXPECT_EQ(a, f.a);
  int64_t step = 0;
  ASSERT_TRUE((*r)->ReadTensorBytes("step", &step, 8).ok());
  EXPECT_EQ(step, 42);
  std::vector<uint16_t> half(2);
  ASSERT_TRUE((*r)->ReadTensorBytes("h", half.data(), 4).ok());
  EXPECT_EQ(half, f.half);
  EXPECT_TRUE((*r)->ReadTensorBytes("empty", nullptr, 0).ok());

  EXPECT_EQ((*r)->ReadTensorBytes("nope", a.data(), 24).code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string((*r)->ReadTensorBytes("model.a", a.data(), 20).message()),
              HasSubstr("has 24 bytes, buffer has 20"));
}

// Bytes laid out by hand from the format description (not by our writer): the header as the
// reference implementation emits it, space-padded, then little-endian float32 data.
TEST(SafetensorsReaderTest, ReadsAHandBuiltFile) {
  std::string header =
      R"({"__metadata__":{"format":"pt"},"bias":{"dtype":"F32","shape":[2],"data_offsets":[16,24]},)"
      R"("weight":{"dtype":"F32","shape":[2,2],"data_offsets":[0,16]}})";
  header.append((8 - header.size() % 8) % 8, ' ');
  std::string file;
  for (int i = 0; i < 8; ++i) file.push_back(static_cast<char>((header.size() >> (8 * i)) & 0xff));
  file += header;
  for (float v : {1.0f, 2.0f, 3.0f, 4.0f, 5.0f, 6.0f}) {
    uint32_t bits;
    std::memcpy(&bits, &v, 4);
    for (int i = 0; i < 4; ++i) file.push_back(static_cast<char>((bits >> (8 * i)) & 0xff));
  }
  absl::StatusOr<std::unique_ptr<SafetensorsReader>> r = OpenBytes(file);
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ((*r)->header().tensors.size(), 2u);
  EXPECT_EQ((*r)->header().tensors[0].name, "weight");  // data order, not key order
  float bias[2];
  ASSERT_TRUE((*r)->ReadTensorBytes("bias", bias, 8).ok());
  EXPECT_EQ(bias[0], 5.0f);
  EXPECT_EQ(bias[1], 6.0f);
}

TEST(SafetensorsReaderTest, EveryTruncationIsAnErrorNotACrash) {
  SmallFile f;
  for (size_t length = 0; length < f.bytes.size(); ++length) {
    absl::StatusOr<std::unique_ptr<SafetensorsReader>> r = OpenBytes(f.bytes.substr(0, length));
    ASSERT_FALSE(r.ok()) << "prefix of " << length << " bytes was accepted";
    EXPECT_FALSE(r.status().message().empty());
  }
  EXPECT_TRUE(OpenBytes(f.bytes).ok());
}

TEST(SafetensorsReaderTest, TrailingBytesRejected) {
  SmallFile f;
  absl::StatusOr<std::unique_ptr<SafetensorsReader>> r = OpenBytes(f.bytes + "x");
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(std::string(r.status().message()), HasSubstr("trailing"));
}

TEST(SafetensorsReaderTest, MutationFuzz) {
  SmallFile f;
  Rng rng{12345};
  const int64_t header_end = static_cast<int64_t>(f.bytes.size()) - 36;  // 36 data bytes
  int accepted = 0;
  for (int iteration = 0; iteration < 20000; ++iteration) {
    std::string m = f.bytes;
    const int edits = 1 + static_cast<int>(rng.Below(4));
    for (int e = 0; e < edits && !m.empty(); ++e) {
      // Mostly the length prefix and the JSON header, where the parser's decisions are made.
      const size_t span = rng.Below(10) < 8 ? static_cast<size_t>(header_end) : m.size();
      const size_t pos = rng.Below(std::min(span, m.size()));
      switch (rng.Below(5)) {
        case 0:
          m[pos] = static_cast<char>(rng.Next());
          break;
        case 1:
          m[pos] = static_cast<char>(m[pos] ^ (1 << rng.Below(8)));
          break;
        case 2:
          m.erase(pos, 1);
          break;
        case 3:
          m.insert(pos, 1, "{}[]\",:0123456789-e."[rng.Below(20)]);
          break;
        default:
          m[pos] = "0123456789"[rng.Below(10)];
          break;
      }
    }
    absl::StatusOr<std::unique_ptr<SafetensorsReader>> r = OpenBytes(m);
    if (r.ok()) {
      ++accepted;
      CheckAcceptedFile(**r, static_cast<int64_t>(m.size()));
    } else {
      ASSERT_FALSE(r.status().message().empty());
    }
  }
  // Some mutations (e.g. in tensor data) keep the file valid; most must not.
  EXPECT_GT(accepted, 0);
  EXPECT_LT(accepted, 20000);
}

TEST(SafetensorsReaderTest, HostileNumbersInHeader) {
  for (const char* offsets : {"[0, 18446744073709551615]", "[18446744073709551615, 0]",
                              "[9223372036854775807, 9223372036854775807]", "[0, 1e400]", "[0, -0]",
                              "[0.0, 4]", "[null, 4]", "[0, 4, 8]"}) {
    const std::string json =
        std::string(R"({"t": {"dtype": "F32", "shape": [1], "data_offsets": )") + offsets + "}}";
    std::string file(8, '\0');
    for (int i = 0; i < 8; ++i) file[i] = static_cast<char>((json.size() >> (8 * i)) & 0xff);
    file += json;
    file += std::string(4, '\0');
    absl::StatusOr<std::unique_ptr<SafetensorsReader>> r = OpenBytes(file);
    EXPECT_FALSE(r.ok()) << offsets;
  }
}

TEST(SafetensorsReaderTest, OpensRealFilesAndNamesThemInErrors) {
  namespace fs = std::filesystem;
  SmallFile f;
  const fs::path dir = fs::path(::testing::TempDir()) / "safetensors_reader_test";
  fs::create_directories(dir);
  const std::string good = (dir / "good.safetensors").string();
  const std::string bad = (dir / "bad.safetensors").string();
  std::ofstream(good, std::ios::binary) << f.bytes;
  std::ofstream(bad, std::ios::binary) << f.bytes.substr(0, f.bytes.size() - 3);

  absl::StatusOr<std::unique_ptr<SafetensorsReader>> r = SafetensorsReader::Open(good);
  ASSERT_TRUE(r.ok()) << r.status();
  std::vector<float> a(6);
  ASSERT_TRUE((*r)->ReadTensorBytes("model.a", a.data(), 24).ok());
  EXPECT_EQ(a, f.a);

  absl::StatusOr<std::unique_ptr<SafetensorsReader>> t = SafetensorsReader::Open(bad);
  ASSERT_FALSE(t.ok());
  EXPECT_THAT(std::string(t.status().message()), HasSubstr("bad.safetensors"));

  EXPECT_EQ(SafetensorsReader::Open((dir / "missing").string()).status().code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ(SafetensorsReader::Open(dir.string()).status().code(),
            absl::StatusCode::kFailedPrecondition);
}

}  // namespace
}  // namespace memplan::io
