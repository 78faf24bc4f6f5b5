// `memplan-agent train` refuses what it used to run silently: a checkpoint with NaN weights stops
// the run before any save (exit 1, the step named), a token id beyond the vocabulary is found
// before step 1 (position and value named), plan-file knobs outside the layout are refused
// instead of clamped, and --seq beyond the model's positions is refused.
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "agent/io/safetensors_format.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/agent/subprocess.h"

namespace memplan {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

struct Exit {
  int code = -1;
  std::string out;  // stderr, then stdout
};

Exit RunChild(const std::vector<std::string>& args, const std::string& base) {
  const testing::Child child = testing::Spawn(args, {}, base);
  int status = 0;
  EXPECT_EQ(waitpid(child.pid, &status, 0), child.pid);
  Exit e;
  e.code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  e.out = testing::ReadFile(child.err_path) + testing::ReadFile(child.out_path);
  std::remove(child.out_path.c_str());
  std::remove(child.err_path.c_str());
  return e;
}

std::vector<std::string> With(std::vector<std::string> args, const std::vector<std::string>& more) {
  args.insert(args.end(), more.begin(), more.end());
  return args;
}

bool Exists(const std::string& path) { return std::filesystem::exists(path); }

class TrainCommandTest : public ::testing::Test {
 protected:
  void SetUp() override {
    base_ = absl::StrCat(::testing::TempDir(), "/train_command_", getpid());
    std::filesystem::create_directories(base_);
    data_ = base_ + "/good.tokens";
    const Exit made = RunChild({MEMPLAN_MAKE_TOKENS_BINARY, "--out=" + data_, "--tokens=8192",
                           "--vocab=2048", "--seed=3"},
                          base_ + "/make");
    ASSERT_EQ(made.code, 0) << made.out;
  }
  // This binary does not link Torch, so std::filesystem is safe here.
  void TearDown() override { std::filesystem::remove_all(base_); }

  // llama-tiny (vocab 2048) on the CPU, unmanaged, a few small steps.
  std::vector<std::string> Train(int steps, const std::string& data) const {
    return {MEMPLAN_AGENT_BINARY, "train",   "--arch",  "llama-tiny", "--device",
            "cpu",                "--data",  data,      "--batch",    "2",
            "--seq",              "32",      "--steps", std::to_string(steps),
            "--cpu-threads",      "1"};
  }
  std::string WriteFile(const std::string& name, const std::string& text) const {
    const std::string path = base_ + "/" + name;
    std::ofstream(path, std::ios::binary) << text;
    return path;
  }

  std::string base_, data_;
};

// Overwrites every value of `tensor` (fp32) in a checkpoint's model.safetensors with NaN.
void PoisonCheckpoint(const std::string& dir, const std::string& tensor) {
  const std::string path = dir + "/model.safetensors";
  std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
  ASSERT_TRUE(f.good()) << path;
  unsigned char prefix[8];
  f.read(reinterpret_cast<char*>(prefix), 8);
  const int64_t file_bytes = static_cast<int64_t>(std::filesystem::file_size(path));
  absl::StatusOr<int64_t> json_bytes = io::DecodeSafetensorsHeaderLength(prefix, file_bytes);
  ASSERT_TRUE(json_bytes.ok()) << json_bytes.status();
  std::string json(static_cast<size_t>(*json_bytes), '\0');
  f.read(json.data(), *json_bytes);
  absl::StatusOr<io::SafetensorsHeader> header =
      io::ParseSafetensorsHeader(json, file_bytes - 8 - *json_bytes);
  ASSERT_TRUE(header.ok()) << header.status();
  const io::SafetensorsTensorInfo* info = header->Find(tensor);
  ASSERT_NE(info, nullptr) << tensor;
  ASSERT_EQ(info->dtype, io::SafetensorsDType::kF32);
  const float nan = std::numeric_limits<float>::quiet_NaN();
  std::string bytes;
  for (int64_t i = 0; i < info->numel(); ++i) {
    bytes.append(reinterpret_cast<const char*>(&nan), sizeof nan);
  }
  f.seekp(header->data_offset_bytes + info->begin_bytes);
  f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  ASSERT_TRUE(f.good());
}

TEST_F(TrainCommandTest, NaNWeightsInTheCheckpointStopTheRunBeforeAnySave) {
  const std::string first = base_ + "/first";
  const Exit made = RunChild(With(Train(1, data_), {"--save", first}), base_ + "/r1");
  ASSERT_EQ(made.code, 0) << made.out;
  PoisonCheckpoint(first, "model.norm.weight");

  const std::string second = base_ + "/second";
  const Exit resumed = RunChild(
      With(Train(3, data_), {"--resume", first, "--save", second, "--save-every", "1"}),
      base_ + "/r2");
  EXPECT_EQ(resumed.code, 1) << resumed.out;
  EXPECT_THAT(resumed.out, HasSubstr("step 2: the loss is nan"));
  EXPECT_THAT(resumed.out, HasSubstr("--skip-nonfinite"));
  EXPECT_FALSE(Exists(second)) << resumed.out;

  // --skip-nonfinite: each step's update is skipped and logged; the run goes on.
  const Exit skipped = RunChild(With(Train(3, data_), {"--resume", first, "--skip-nonfinite"}),
                           base_ + "/r3");
  EXPECT_EQ(skipped.code, 0) << skipped.out;
  EXPECT_THAT(skipped.out, HasSubstr("step skipped: non-finite"));
  EXPECT_THAT(skipped.out, HasSubstr("trained 3 steps"));
}

TEST_F(TrainCommandTest, ATokenOutsideTheVocabularyIsFoundBeforeTheFirstStep) {
  std::string raw;
  for (int i = 0; i < 8192; ++i) {
    const uint16_t id = i == 4000 ? 5000 : static_cast<uint16_t>((i * 7) % 2048);
    raw.push_back(static_cast<char>(id & 0xff));
    raw.push_back(static_cast<char>(id >> 8));
  }
  const std::string bad = WriteFile("bad.bin", raw);
  const std::string save = base_ + "/bad_save";
  const Exit e = RunChild(
      With(Train(3, bad), {"--raw-token-bytes", "2", "--save", save, "--save-every", "1"}),
      base_ + "/tok");
  EXPECT_EQ(e.code, 1) << e.out;
  EXPECT_THAT(e.out, HasSubstr("token 4000 = 5000 is outside the model's vocabulary (2048 ids"));
  EXPECT_THAT(e.out, Not(HasSubstr("msg=\"step\"")));
  EXPECT_FALSE(Exists(save));
}

TEST_F(TrainCommandTest, PlanFileKnobsOutsideTheLayoutAreRefusedNotClamped) {
  // One chunk of 1 GiB holds all of llama-tiny.
  const std::string persist = WriteFile(
      "persist.json", R"({"chunk_bytes": 1073741824, "n_persist": 2, "n_buffer": 0})");
  Exit e = RunChild(With(Train(1, data_), {"--plan-file", persist}), base_ + "/p1");
  EXPECT_EQ(e.code, 1) << e.out;
  EXPECT_THAT(e.out, HasSubstr("--plan-file " + persist + ": plan.n_persist = 2 is outside [0, 1]"));
  EXPECT_THAT(e.out, Not(HasSubstr("msg=\"step\"")));

  const std::string buffers = WriteFile(
      "buffers.json", R"({"chunk_bytes": 1073741824, "n_persist": 1, "n_buffer": 1000000})");
  e = RunChild(With(Train(1, data_), {"--plan-file", buffers}), base_ + "/p2");
  EXPECT_EQ(e.code, 1) << e.out;
  EXPECT_THAT(e.out, HasSubstr("plan.n_buffer = 1000000 is outside [0, 0]"));

  // The same knobs as flags are named as flags.
  e = RunChild(With(Train(1, data_), {"--chunk-mib", "1024", "--n-persist", "1", "--n-buffer", "3"}),
          base_ + "/p3");
  EXPECT_EQ(e.code, 1) << e.out;
  EXPECT_THAT(e.out, HasSubstr("--n-buffer = 3 is outside [0, 0]"));

  // What the planner writes for that layout runs.
  const std::string fits = WriteFile(
      "fits.json", R"({"chunk_bytes": 1073741824, "n_persist": 1, "n_buffer": 0})");
  e = RunChild(With(Train(1, data_), {"--plan-file", fits}), base_ + "/p4");
  EXPECT_EQ(e.code, 0) << e.out;
}

// A two-block Llama config (256 positions) for runs on the CPU.
constexpr char kTwoBlockLlama[] = R"({
      "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64,
      "intermediate_size": 96, "num_hidden_layers": 2, "num_attention_heads": 4,
      "num_key_value_heads": 2, "vocab_size": 2048, "rope_theta": 10000.0,
      "rms_norm_eps": 1e-5, "max_position_embeddings": 256})";

// [Speculative clipped updates] --speculative-clip on takes the run's own layout: with plan
// knobs (no planner) its offloaded chunks are counted, and a clipped run whose norm stays under
// the threshold trains with it. auto leaves adamw off (not measured to pay for it).
TEST_F(TrainCommandTest, SpeculativeClipFollowsTheRunsLayout) {
  const std::string config = WriteFile("spec.json", kTwoBlockLlama);
  const std::vector<std::string> args =
      With({MEMPLAN_AGENT_BINARY, "train", "--arch-file", config, "--device", "cpu",
            "--synthetic-data", "--steps", "3", "--cpu-threads", "1", "--seq", "32"},
           {"--chunk-mib", "1", "--n-persist", "0", "--n-buffer", "1", "--clip", "1000"});
  Exit e = RunChild(With(args, {"--speculative-clip", "on"}), base_ + "/on");
  EXPECT_EQ(e.code, 0) << e.out;
  EXPECT_THAT(e.out, HasSubstr("msg=\"speculative clipping\" on=1"));
  e = RunChild(args, base_ + "/auto");
  EXPECT_EQ(e.code, 0) << e.out;
  EXPECT_THAT(e.out, HasSubstr("msg=\"speculative clipping\" on=0"));
  EXPECT_THAT(e.out, HasSubstr("not measured to pay"));
}

TEST_F(TrainCommandTest, SequencesBeyondTheModelsPositionsAreRefused) {
  const std::string config = WriteFile("config.json", kTwoBlockLlama);
  const std::vector<std::string> args = {MEMPLAN_AGENT_BINARY, "train", "--arch-file", config,
                                         "--device", "cpu", "--synthetic-data", "--steps", "1",
                                         "--cpu-threads", "1"};
  Exit e = RunChild(With(args, {"--seq", "300"}), base_ + "/s1");
  EXPECT_EQ(e.code, 1) << e.out;
  EXPECT_THAT(e.out, HasSubstr("--seq 300 exceeds the model's max_position_embeddings = 256"));

  // Linear RoPE scaling by 2 extends the positions to 512.
  const std::string scaled = WriteFile("scaled.json", R"({
      "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64,
      "intermediate_size": 96, "num_hidden_layers": 2, "num_attention_heads": 4,
      "num_key_value_heads": 2, "vocab_size": 2048, "rope_theta": 10000.0,
      "rms_norm_eps": 1e-5, "max_position_embeddings": 256,
      "rope_scaling": {"rope_type": "linear", "factor": 2.0}})");
  std::vector<std::string> scaled_args = args;
  scaled_args[3] = scaled;
  e = RunChild(With(scaled_args, {"--seq", "300"}), base_ + "/s2");
  EXPECT_EQ(e.code, 0) << e.out;
  e = RunChild(With(scaled_args, {"--seq", "513"}), base_ + "/s3");
  EXPECT_EQ(e.code, 1) << e.out;
  EXPECT_THAT(e.out, HasSubstr("--seq 513 exceeds the 512 positions"));
}

}  // namespace
}  // namespace memplan
