// `memplan-agent train` under torchrun's variables: two real processes on 127.0.0.1 (Gloo, CPU)
// train llama-tiny with --batch 2 each; one process with --batch 4 reads the same samples (the
// batcher gives rank r rows [2r, 2r + 2) of each global batch of 4). The per-step losses agree up
// to fp32 summation order; only rank 0 logs steps. Then checkpoints: saved by 2 ranks and resumed
// by 3, saved by 3 and resumed by 1, against one process that never stopped; OSFT's saved by 2
// and resumed by 1, saved by 1 and resumed by 3, each resume without the SVD split.
#include <sys/wait.h>

#include <cmath>
#include <cstring>
#include <cstdio>
#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_format.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/agent/subprocess.h"

namespace memplan {
namespace {

using ::testing::HasSubstr;

// The loss of every `msg="step"` log line, in order.
std::vector<double> StepLosses(const std::string& log) {
  std::vector<double> losses;
  for (absl::string_view line : absl::StrSplit(log, '\n')) {
    if (line.find("msg=\"step\"") == absl::string_view::npos) continue;
    for (absl::string_view field : absl::StrSplit(line, ' ')) {
      double v = 0;
      if (absl::ConsumePrefix(&field, "loss=") && absl::SimpleAtod(field, &v)) losses.push_back(v);
    }
  }
  return losses;
}

// `data`: a token file, or "" for --synthetic-data (whose stream, and so the sample order,
// depends on --steps). `chunk_knobs`: the chunk manager's --chunk-mib, --n-persist, --n-ckpt and
// --host-memory.
std::vector<std::string> TrainArgs(int batch, int steps = 3, const std::string& data = "",
                                   const std::string& lr = "1e-3", bool chunk_knobs = true) {
  std::vector<std::string> args = {MEMPLAN_AGENT_BINARY,
                                   "train",
                                   "--arch",
                                   "llama-tiny",
                                   "--device",
                                   "cpu",
                                   "--batch",
                                   std::to_string(batch),
                                   "--seq",
                                   "32",
                                   "--steps",
                                   std::to_string(steps),
                                   "--lr",
                                   lr,
                                   "--clip",
                                   "1.0",
                                   "--cpu-threads",
                                   "1"};
  if (chunk_knobs) {
    for (const char* knob :
         {"--chunk-mib", "4", "--n-persist", "1", "--n-ckpt", "2", "--host-memory", "pageable"}) {
      args.push_back(knob);
    }
  }
  if (data.empty()) {
    args.push_back("--synthetic-data");
  } else {
    args.push_back("--data");
    args.push_back(data);
  }
  return args;
}

struct Exit {
  int status = 0;
  std::string err;
};

Exit Wait(const testing::Child& child) {
  Exit r;
  EXPECT_EQ(waitpid(child.pid, &r.status, 0), child.pid);
  r.err = testing::ReadFile(child.err_path);
  std::remove(child.out_path.c_str());
  std::remove(child.err_path.c_str());
  return r;
}

std::vector<std::string> With(std::vector<std::string> args, const std::vector<std::string>& more) {
  args.insert(args.end(), more.begin(), more.end());
  return args;
}

// TrainArgs for an OSFT run (no chunk manager) splitting `targets` at `ratio`.
std::vector<std::string> OsftArgs(
    int batch, int steps, const std::string& data, const std::string& ratio = "0.5",
    const std::string& targets = "q_proj,v_proj,gate_proj,down_proj") {
  return With(TrainArgs(batch, steps, data, "1e-2", /*chunk_knobs=*/false),
              {"--osft-rank-ratio", ratio, "--osft-targets", targets});
}

TEST(TrainDistributedTest, TwoRanksTrainLikeOneProcessOnTheWholeBatch) {
  const std::string base = absl::StrCat(::testing::TempDir(), "/train_distributed_", getpid());
  const Exit single = Wait(testing::Spawn(TrainArgs(4), {}, base + ".single"));
  ASSERT_TRUE(WIFEXITED(single.status) && WEXITSTATUS(single.status) == 0) << single.err;
  const std::vector<double> expected = StepLosses(single.err);
  ASSERT_EQ(expected.size(), 3u) << single.err;

  const int port = testing::FreeLoopbackPort();
  ASSERT_GT(port, 0);
  std::vector<testing::Child> ranks;
  const std::string timeline = base + ".timeline.tsv";
  for (int r = 0; r < 2; ++r) {
    ranks.push_back(testing::Spawn(
        With(TrainArgs(2), {"--memory-timeline", timeline}),
        {"WORLD_SIZE=2", absl::StrCat("RANK=", r), absl::StrCat("LOCAL_RANK=", r),
         "LOCAL_WORLD_SIZE=2", "MASTER_ADDR=127.0.0.1", absl::StrCat("MASTER_PORT=", port)},
        absl::StrCat(base, ".rank", r)));
    ASSERT_GT(ranks.back().pid, 0);
  }
  const Exit rank0 = Wait(ranks[0]);
  const Exit rank1 = Wait(ranks[1]);
  if (absl::StrContains(rank0.err, "no Gloo process group")) GTEST_SKIP() << rank0.err;
  ASSERT_TRUE(WIFEXITED(rank0.status) && WEXITSTATUS(rank0.status) == 0) << rank0.err;
  ASSERT_TRUE(WIFEXITED(rank1.status) && WEXITSTATUS(rank1.status) == 0) << rank1.err;
  EXPECT_THAT(rank0.err, HasSubstr("msg=\"joined the process group\" rank=0 world_size=2"));
  EXPECT_THAT(rank0.err, HasSubstr("world_size=2"));
  const std::vector<double> got = StepLosses(rank0.err);
  ASSERT_EQ(got.size(), 3u) << rank0.err;
  EXPECT_TRUE(StepLosses(rank1.err).empty()) << "rank 1 logged steps:\n" << rank1.err;
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_NEAR(got[i], expected[i], 1e-4 * std::abs(expected[i])) << "step " << i + 1;
  }
  // The loss moved: a run that did not train would also "agree".
  EXPECT_GT(std::abs(expected[2] - expected[0]), 1e-3);
  // --memory-timeline: each rank writes its own file (rank 0 the name given), three steps each.
  for (const std::string& path : {timeline, timeline + ".rank-1"}) {
    const std::string tsv = testing::ReadFile(path);
    EXPECT_TRUE(absl::StartsWith(tsv, "step\tevent\tgroup\t")) << path << ":\n" << tsv;
    EXPECT_THAT(tsv, HasSubstr("\n3\t")) << path;
    std::remove(path.c_str());
  }
}

// Runs `args` as world_size ranks at once on a fresh loopback port; returns every rank's stderr,
// and fails the test when a rank exits non-zero.
std::vector<std::string> RunEveryRank(const std::vector<std::string>& args, int world_size,
                                      const std::string& base) {
  const int port = testing::FreeLoopbackPort();
  EXPECT_GT(port, 0);
  std::vector<testing::Child> ranks;
  for (int r = 0; r < world_size; ++r) {
    std::vector<std::string> env;
    if (world_size > 1) {
      env = {absl::StrCat("WORLD_SIZE=", world_size),
             absl::StrCat("RANK=", r),
             absl::StrCat("LOCAL_RANK=", r),
             absl::StrCat("LOCAL_WORLD_SIZE=", world_size),
             "MASTER_ADDR=127.0.0.1",
             absl::StrCat("MASTER_PORT=", port)};
    }
    ranks.push_back(testing::Spawn(args, env, absl::StrCat(base, ".rank", r)));
  }
  std::vector<std::string> logs;
  for (int r = 0; r < world_size; ++r) {
    const Exit e = Wait(ranks[r]);
    EXPECT_TRUE(WIFEXITED(e.status) && WEXITSTATUS(e.status) == 0) << "rank " << r << ":\n"
                                                                   << e.err;
    logs.push_back(e.err);
  }
  return logs;
}

// RunEveryRank, rank 0's stderr.
std::string RunRanks(const std::vector<std::string>& args, int world_size,
                     const std::string& base) {
  return RunEveryRank(args, world_size, base)[0];
}

// Writes a token file of 8192 ids below 2048 drawn with `seed` to `path`.
void MakeTokens(const std::string& path, int seed, const std::string& log_base) {
  const Exit made =
      Wait(testing::Spawn({MEMPLAN_MAKE_TOKENS_BINARY, "--out=" + path, "--tokens=8192",
                           "--vocab=2048", absl::StrCat("--seed=", seed)},
                          {}, log_base));
  ASSERT_TRUE(WIFEXITED(made.status) && WEXITSTATUS(made.status) == 0) << made.err;
}

// The issue's resume matrix on a global batch of 6 rows: 2 ranks x 3 rows save after 2 steps and
// 3 ranks x 2 rows resume; 3 ranks save and 1 process x 6 rows resumes. The first run shards the
// persistent chunk's parameters and optimizer state ([Sharded persistent parameters]: gathered
// on use, 2 shards), the second its optimizer state ([Sharded persistent state]: 3 shards), the
// others replicate them. The third step's loss is
// the uninterrupted run's (the checkpoint is layout-independent: every rank writes the pieces it
// stores, and a resuming rank reads the ranges it stores from any number of files).
TEST(TrainDistributedTest, CheckpointsResumeOnAnotherNumberOfRanks) {
  const std::string base = absl::StrCat(::testing::TempDir(), "/train_distributed_ckpt_", getpid());
  // One token file for every run: the same samples whatever --steps says.
  const std::string data = base + ".tokens";
  ASSERT_NO_FATAL_FAILURE(MakeTokens(data, 3, base + ".make"));
  const std::vector<double> straight =
      StepLosses(RunRanks(TrainArgs(6, 3, data), 1, base + ".straight"));
  ASSERT_EQ(straight.size(), 3u);

  const std::string from_two = base + ".from2";
  const std::vector<double> two =
      StepLosses(RunRanks(With(TrainArgs(3, 2, data), {"--save", from_two, "--persistent-params",
                                                       "sharded"}),
                          2, base + ".two"));
  ASSERT_EQ(two.size(), 2u);
  const std::vector<double> two_to_three =
      StepLosses(RunRanks(With(TrainArgs(2, 3, data), {"--resume", from_two, "--persistent-state",
                                                       "sharded"}),
                          3, base + ".three"));
  ASSERT_EQ(two_to_three.size(), 1u);

  const std::string from_three = base + ".from3";
  const std::vector<double> three = StepLosses(
      RunRanks(With(TrainArgs(2, 2, data), {"--save", from_three}), 3, base + ".three_s"));
  ASSERT_EQ(three.size(), 2u);
  const std::vector<double> three_to_one =
      StepLosses(RunRanks(With(TrainArgs(6, 3, data), {"--resume", from_three}), 1, base + ".one"));
  ASSERT_EQ(three_to_one.size(), 1u);
  // `memplan-agent export` assembles the 3 ranks' files into one Hugging Face-loadable
  // directory; a plain run (--plain: no chunk manager) resumed from it takes the same third step.
  const std::string exported = base + ".exported";
  const Exit export_run = Wait(
      testing::Spawn({MEMPLAN_AGENT_BINARY, "export", from_three, exported}, {}, base + ".export"));
  ASSERT_TRUE(WIFEXITED(export_run.status) && WEXITSTATUS(export_run.status) == 0)
      << export_run.err;
  EXPECT_TRUE(std::filesystem::exists(exported + "/model.safetensors"));
  EXPECT_TRUE(std::filesystem::exists(exported + "/config.json"));
  const std::vector<double> exported_to_plain = StepLosses(RunRanks(
      With(TrainArgs(6, 3, data, "1e-3", /*chunk_knobs=*/false), {"--plain", "--resume", exported}),
      1, base + ".plain"));
  ASSERT_EQ(exported_to_plain.size(), 1u);

  for (size_t i = 0; i < 2; ++i) {
    EXPECT_NEAR(two[i], straight[i], 1e-4 * straight[i]) << "step " << i + 1;
    EXPECT_NEAR(three[i], straight[i], 1e-4 * straight[i]) << "step " << i + 1;
  }
  EXPECT_NEAR(two_to_three[0], straight[2], 1e-4 * straight[2]);
  EXPECT_NEAR(three_to_one[0], straight[2], 1e-4 * straight[2]);
  EXPECT_NEAR(exported_to_plain[0], straight[2], 1e-4 * straight[2]);
  // [Per-rank checkpoints]: each rank wrote its own file; nothing was gathered into a whole-model
  // file.
  for (const auto& [dir, world] : {std::pair{from_two, 2}, std::pair{from_three, 3}}) {
    for (int r = 0; r < world; ++r) {
      EXPECT_TRUE(std::filesystem::exists(
          absl::StrCat(dir, "/rank-0000", r, "-of-0000", world, ".safetensors")))
          << dir << " rank " << r;
    }
    EXPECT_FALSE(std::filesystem::exists(dir + "/model.safetensors")) << dir;
    EXPECT_TRUE(std::filesystem::exists(dir + "/trainer.json")) << dir;
  }
  // This binary does not link Torch, so std::filesystem is safe here (docs/agent.md, gotchas).
  for (const std::string& dir : {from_two, from_three, exported}) std::filesystem::remove_all(dir);
  std::remove(data.c_str());
}

// The integer field `key` of the first log line with msg="`msg`", or -1.
int64_t LogField(const std::string& log, const std::string& msg, const std::string& key) {
  for (absl::string_view line : absl::StrSplit(log, '\n')) {
    if (line.find(absl::StrCat("msg=\"", msg, "\"")) == absl::string_view::npos) continue;
    for (absl::string_view field : absl::StrSplit(line, ' ')) {
      int64_t v = 0;
      if (absl::ConsumePrefix(&field, key + "=") && absl::SimpleAtoi(field, &v)) return v;
    }
  }
  return -1;
}

// A Hugging Face Llama checkpoint written without Torch: config.json and one model.safetensors of
// bf16 values (matrices uniform in +-0.03 from a fixed xorshift stream, norms 1).
struct CheckpointShape {
  int64_t hidden = 1024, intermediate = 2816, layers = 8, heads = 16, kv_heads = 4, vocab = 32000;
};

int64_t WriteHfCheckpoint(const std::string& dir, const CheckpointShape& m,
                          int64_t* largest_numel) {
  std::filesystem::create_directories(dir);
  std::ofstream(dir + "/config.json") << absl::StrFormat(
      R"({"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": %d,
  "num_hidden_layers": %d, "num_attention_heads": %d, "num_key_value_heads": %d,
  "intermediate_size": %d, "vocab_size": %d, "tie_word_embeddings": false, "rope_theta": 10000.0,
  "rms_norm_eps": 1e-5, "max_position_embeddings": 2048, "torch_dtype": "bfloat16"})",
      m.hidden, m.layers, m.heads, m.kv_heads, m.intermediate, m.vocab);
  const int64_t d = m.hidden / m.heads;
  std::vector<std::pair<std::string, std::vector<int64_t>>> tensors = {
      {"model.embed_tokens.weight", {m.vocab, m.hidden}}};
  for (int64_t i = 0; i < m.layers; ++i) {
    const std::string l = absl::StrCat("model.layers.", i, ".");
    tensors.push_back({l + "self_attn.q_proj.weight", {m.heads * d, m.hidden}});
    tensors.push_back({l + "self_attn.k_proj.weight", {m.kv_heads * d, m.hidden}});
    tensors.push_back({l + "self_attn.v_proj.weight", {m.kv_heads * d, m.hidden}});
    tensors.push_back({l + "self_attn.o_proj.weight", {m.hidden, m.heads * d}});
    tensors.push_back({l + "mlp.gate_proj.weight", {m.intermediate, m.hidden}});
    tensors.push_back({l + "mlp.up_proj.weight", {m.intermediate, m.hidden}});
    tensors.push_back({l + "mlp.down_proj.weight", {m.hidden, m.intermediate}});
    tensors.push_back({l + "input_layernorm.weight", {m.hidden}});
    tensors.push_back({l + "post_attention_layernorm.weight", {m.hidden}});
  }
  tensors.push_back({"model.norm.weight", {m.hidden}});
  tensors.push_back({"lm_head.weight", {m.vocab, m.hidden}});
  std::string header = "{";
  int64_t offset = 0, total = 0;
  *largest_numel = 0;
  for (const auto& [name, shape] : tensors) {
    const int64_t n = shape.size() == 1 ? shape[0] : shape[0] * shape[1];
    absl::StrAppend(&header, offset == 0 ? "" : ",", "\"", name, "\":{\"dtype\":\"BF16\",\"shape\":[",
                    absl::StrJoin(shape, ","), "],\"data_offsets\":[", offset, ",", offset + 2 * n,
                    "]}");
    offset += 2 * n;
    total += n;
    *largest_numel = std::max(*largest_numel, n);
  }
  header += "}";
  while (header.size() % 8 != 0) header += ' ';
  std::ofstream out(dir + "/model.safetensors", std::ios::binary);
  const uint64_t header_len = header.size();
  out.write(reinterpret_cast<const char*>(&header_len), 8);
  out << header;
  uint64_t state = 0x9E3779B97F4A7C15ull;
  std::vector<uint16_t> values;
  for (const auto& [name, shape] : tensors) {
    values.assign(shape.size() == 1 ? shape[0] : shape[0] * shape[1], 0x3F80);  // bf16 1.0
    if (shape.size() == 2) {
      for (uint16_t& v : values) {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        const float x = (static_cast<float>(state >> 40) / 16777216.0f - 0.5f) * 0.06f;
        uint32_t bits;
        std::memcpy(&bits, &x, 4);
        v = static_cast<uint16_t>(bits >> 16);
      }
    }
    out.write(reinterpret_cast<const char*>(values.data()),
              static_cast<std::streamsize>(values.size() * 2));
  }
  return total;
}

// [Sharded loading] Four ranks load a 155 M-parameter checkpoint (620 MB in fp32) with every chunk
// offloaded: each reads only its shards' byte ranges, so its resident set grows by what it stores
// (its quarter of the parameters and their optimizer state, the chunk buffers) plus at most one
// parameter in flight, never by the whole model; the first loss is the loss of one process that
// loads the whole checkpoint (--plain).
// --accumulate-offloaded-grads device: the offloaded chunks' grads summed over 2 micro-batches on
// the device and reduce-scattered once per step train like the default (a reduce-scatter per
// micro-batch into the host sum): the same losses up to fp32 summation order.
TEST(TrainDistributedTest, OffloadedGradsSummedOnTheDeviceTrainLikeTheHostSum) {
  const std::string base = absl::StrCat(::testing::TempDir(), "/train_distributed_acc_", getpid());
  const std::vector<std::string> args = With(TrainArgs(1), {"--grad-accum", "2"});
  const std::string host_log = RunRanks(args, 2, base + ".host");
  if (absl::StrContains(host_log, "no Gloo process group")) GTEST_SKIP() << host_log;
  const std::vector<double> host = StepLosses(host_log);
  const std::string device_log =
      RunRanks(With(args, {"--accumulate-offloaded-grads", "device"}), 2, base + ".device");
  const std::vector<double> device = StepLosses(device_log);
  ASSERT_EQ(host.size(), 3u) << host_log;
  ASSERT_EQ(device.size(), 3u) << device_log;
  for (size_t i = 0; i < host.size(); ++i) {
    EXPECT_NEAR(device[i], host[i], 1e-5 * std::abs(host[i])) << "step " << i + 1;
  }
  EXPECT_GT(std::abs(host[2] - host[0]), 1e-3);  // it trained
}

TEST(TrainDistributedTest, ShardedLoadingReadsOnlyEachRanksPartOfTheCheckpoint) {
  const std::string base = absl::StrCat(::testing::TempDir(), "/train_distributed_load_", getpid());
  const std::string model = base + ".model";
  int64_t largest = 0;
  const int64_t params = WriteHfCheckpoint(model, CheckpointShape{}, &largest);
  const int64_t model_bytes = 4 * params;  // fp32 on the CPU
  auto args = [&](int batch) {
    return std::vector<std::string>{MEMPLAN_AGENT_BINARY, "train", "--model", model, "--device",
                                    "cpu", "--batch", std::to_string(batch), "--seq", "32",
                                    "--steps", "1", "--synthetic-data", "--cpu-threads", "1"};
  };
  const std::vector<double> whole =
      StepLosses(RunRanks(With(args(4), {"--plain"}), 1, base + ".plain"));
  ASSERT_EQ(whole.size(), 1u);
  constexpr int kWorld = 4;
  const std::vector<std::string> logs =
      RunEveryRank(With(args(1), {"--chunk-mib", "32", "--n-persist", "0", "--host-memory",
                                  "pageable"}),
                   kWorld, base + ".sharded");
  if (absl::StrContains(logs[0], "no Gloo process group")) GTEST_SKIP() << logs[0];
  const std::vector<double> sharded = StepLosses(logs[0]);
  ASSERT_EQ(sharded.size(), 1u) << logs[0];
  EXPECT_NEAR(sharded[0], whole[0], 1e-4 * whole[0]);
  for (int r = 0; r < kWorld; ++r) {
    const std::string& log = logs[r];
    const int64_t peak = LogField(log, "load peak", "host_peak_rss_bytes");
    const int64_t before = LogField(log, "load peak", "host_rss_before_model_bytes");
    const int64_t stored = LogField(log, "load peak", "chunk_host_bytes");
    const int64_t buffers = LogField(log, "load peak", "chunk_device_bytes");  // the CPU's here
    ASSERT_TRUE(peak > 0 && before > 0 && stored > 0 && buffers >= 0) << log;
    // What this rank stores is its quarter of 4 arrays (parameters, grad staging, two moments).
    EXPECT_NEAR(static_cast<double>(stored), 4.0 * model_bytes / kWorld, 0.02 * model_bytes);
    const int64_t grew = peak - before;
    // One parameter in flight: read in bf16 and widened (6 bytes per element), and slack for the
    // process group's and the allocator's own growth.
    const int64_t allowed = stored + buffers + 6 * largest + (int64_t{96} << 20);
    std::printf("rank %d: resident set grew %.1f MiB while loading; stores %.1f MiB + buffers "
                "%.1f MiB (the whole model: %.1f MiB)\n",
                r, grew / 1048576.0, stored / 1048576.0, buffers / 1048576.0,
                model_bytes / 1048576.0);
    EXPECT_LE(grew, allowed) << "rank " << r << " held more than its part:\n" << log;
    // The bound is meaningful: holding the whole model as well would break it.
    EXPECT_GT(stored + buffers + model_bytes, allowed);
    const int64_t read = LogField(log, "loaded checkpoint", "bytes");
    // Its quarter of the file's bytes (bf16), nothing more.
    EXPECT_NEAR(static_cast<double>(read), 2.0 * params / kWorld, 0.02 * 2.0 * params) << log;
  }
  std::filesystem::remove_all(model);
}

// [OSFT across ranks] (agent/train/trainer.cc): each rank holds the whole model, the low factors'
// gradients are averaged in one all-reduce per step; 2 ranks x 2 rows train like 1 process x 4
// rows (clipped, 3 steps: the later losses read the updated factors).
// The `msg="osft factors"` log line (how the factors were made), or "".
std::string OsftFactorsLine(const std::string& log) {
  for (absl::string_view line : absl::StrSplit(log, '\n')) {
    if (absl::StrContains(line, "msg=\"osft factors\"")) return std::string(line);
  }
  return "";
}

// [OSFT resume without the SVD] (agent/model/osft.h): a run from weights splits them; a resume
// shapes the factors for the checkpoint's and runs no SVD.
constexpr char kSplitBySvd[] = "source=\"svd\"";
constexpr char kNoSvd[] = "source=\"checkpoint\" svd_splits=0 ";

TEST(TrainDistributedTest, OsftTwoRanksTrainLikeOneProcess) {
  const std::string base = absl::StrCat(::testing::TempDir(), "/train_distributed_osft_", getpid());
  const std::vector<double> expected =
      StepLosses(RunRanks(OsftArgs(4, 3, ""), 1, base + ".single"));
  ASSERT_EQ(expected.size(), 3u);
  const std::vector<std::string> logs = RunEveryRank(OsftArgs(2, 3, ""), 2, base + ".two");
  if (absl::StrContains(logs[0], "no Gloo process group")) GTEST_SKIP() << logs[0];
  EXPECT_THAT(logs[0], HasSubstr("managed=0"));
  // The price of the split (common/osft_cost.h), with its one all-reduce per step.
  EXPECT_THAT(logs[0], HasSubstr("osft_trainable_params="));
  EXPECT_THAT(logs[0], ::testing::Not(HasSubstr("osft_allreduce_bytes_per_step=0 ")));
  const std::vector<double> got = StepLosses(logs[0]);
  ASSERT_EQ(got.size(), 3u) << logs[0];
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_NEAR(got[i], expected[i], 1e-5 * std::abs(expected[i])) << "step " << i + 1;
  }
  EXPECT_NE(got[2], got[0]);
}

// [OSFT checkpoints] (agent/io/osft_checkpoint.h): 2 ranks x 2 rows save after 2 steps and one
// process x 4 rows resumes them to step 4, taking the uninterrupted run's steps 3 and 4; one
// process saved and resumed takes them too (the same computation: the same logged losses). The
// checkpoint is a Hugging Face model plus the factors; a resume with another rank ratio or other
// targets is refused naming the flag, before the model is built.
TEST(TrainDistributedTest, OsftCheckpointsResumeOnAnotherNumberOfRanks) {
  const std::string base =
      absl::StrCat(::testing::TempDir(), "/train_distributed_osft_ckpt_", getpid());
  const std::string data = base + ".tokens";
  ASSERT_NO_FATAL_FAILURE(MakeTokens(data, 5, base + ".make"));
  const std::string straight_log = RunRanks(OsftArgs(4, 4, data), 1, base + ".straight");
  EXPECT_THAT(OsftFactorsLine(straight_log), HasSubstr(kSplitBySvd)) << straight_log;
  const std::vector<double> straight = StepLosses(straight_log);
  ASSERT_EQ(straight.size(), 4u);

  const std::string from_two = base + ".from2";
  const std::vector<std::string> logs =
      RunEveryRank(With(OsftArgs(2, 2, data), {"--save", from_two}), 2, base + ".two");
  if (absl::StrContains(logs[0], "no Gloo process group")) GTEST_SKIP() << logs[0];
  const std::vector<double> two = StepLosses(logs[0]);
  ASSERT_EQ(two.size(), 2u) << logs[0];
  for (const char* file : {"model.safetensors", "config.json", "osft_config.json",
                           "osft_factors.safetensors", "optimizer.safetensors", "trainer.json"}) {
    EXPECT_TRUE(std::filesystem::exists(absl::StrCat(from_two, "/", file))) << file;
  }
  const std::string two_to_one_log =
      RunRanks(With(OsftArgs(4, 4, data), {"--resume", from_two}), 1, base + ".one");
  EXPECT_THAT(OsftFactorsLine(two_to_one_log), HasSubstr(kNoSvd)) << two_to_one_log;
  const std::vector<double> two_to_one = StepLosses(two_to_one_log);
  ASSERT_EQ(two_to_one.size(), 2u);
  for (size_t i = 0; i < 2; ++i) {
    EXPECT_NEAR(two[i], straight[i], 1e-5 * straight[i]) << "step " << i + 1;
    EXPECT_NEAR(two_to_one[i], straight[i + 2], 1e-5 * straight[i + 2]) << "step " << i + 3;
  }
  EXPECT_NE(straight[3], straight[0]);

  const std::string from_one = base + ".from1";
  const std::vector<double> first =
      StepLosses(RunRanks(With(OsftArgs(4, 2, data), {"--save", from_one}), 1, base + ".first"));
  const std::vector<double> second =
      StepLosses(RunRanks(With(OsftArgs(4, 4, data), {"--resume", from_one}), 1, base + ".second"));
  ASSERT_EQ(first.size(), 2u);
  ASSERT_EQ(second.size(), 2u);
  EXPECT_EQ(first[1], straight[1]);
  EXPECT_EQ(second[0], straight[2]);
  EXPECT_EQ(second[1], straight[3]);

  for (const auto& [args, flag] :
       {std::pair{OsftArgs(4, 4, data, "0.25"),
                  "--osft-rank-ratio 0.25 differs from the checkpoint's 0.5"},
        std::pair{OsftArgs(4, 4, data, "0.5", "q_proj,v_proj"),
                  "--osft-targets q_proj,v_proj differs"}}) {
    const Exit refused =
        Wait(testing::Spawn(With(args, {"--resume", from_one}), {}, base + ".bad"));
    ASSERT_TRUE(WIFEXITED(refused.status));
    EXPECT_NE(WEXITSTATUS(refused.status), 0);
    EXPECT_THAT(refused.err, HasSubstr(flag));
    // Refused before the model is built and split.
    EXPECT_THAT(refused.err, ::testing::Not(HasSubstr("msg=\"model created\""))) << refused.err;
  }
  // `memplan-agent export` copies the factors along; --params-only leaves the merged model alone.
  const std::string exported = base + ".exported", merged = base + ".merged";
  for (const auto& [out, extra] : {std::pair{exported, ""}, std::pair{merged, "--params-only"}}) {
    std::vector<std::string> args = {MEMPLAN_AGENT_BINARY, "export", from_one, out};
    if (*extra != '\0') args.push_back(extra);
    const Exit e = Wait(testing::Spawn(args, {}, base + ".export"));
    ASSERT_TRUE(WIFEXITED(e.status) && WEXITSTATUS(e.status) == 0) << e.err;
  }
  EXPECT_TRUE(std::filesystem::exists(exported + "/osft_factors.safetensors"));
  EXPECT_FALSE(std::filesystem::exists(merged + "/osft_factors.safetensors"));
  EXPECT_FALSE(std::filesystem::exists(merged + "/osft_config.json"));
  EXPECT_TRUE(std::filesystem::exists(merged + "/model.safetensors"));
  const std::vector<double> from_export = StepLosses(
      RunRanks(With(OsftArgs(4, 3, data), {"--resume", exported}), 1, base + ".from_export"));
  ASSERT_EQ(from_export.size(), 1u);
  EXPECT_EQ(from_export[0], straight[2]);
  for (const std::string& dir : {from_two, from_one, exported, merged}) {
    std::filesystem::remove_all(dir);
  }
  std::remove(data.c_str());
}

// 1 -> N: one process x 6 rows saves an OSFT run after 2 steps and 3 ranks x 2 rows resume it to
// step 3 with the uninterrupted run's third loss; no resuming rank splits its weights by SVD.
TEST(TrainDistributedTest, OsftCheckpointOfOneProcessResumesOnThreeRanks) {
  const std::string base =
      absl::StrCat(::testing::TempDir(), "/train_distributed_osft_1to3_", getpid());
  const std::string data = base + ".tokens";
  ASSERT_NO_FATAL_FAILURE(MakeTokens(data, 7, base + ".make"));
  const std::string straight_log = RunRanks(OsftArgs(6, 3, data), 1, base + ".straight");
  const std::vector<double> straight = StepLosses(straight_log);
  ASSERT_EQ(straight.size(), 3u) << straight_log;

  const std::string from_one = base + ".from1";
  const std::vector<double> first =
      StepLosses(RunRanks(With(OsftArgs(6, 2, data), {"--save", from_one}), 1, base + ".first"));
  ASSERT_EQ(first.size(), 2u);
  const std::vector<std::string> logs =
      RunEveryRank(With(OsftArgs(2, 3, data), {"--resume", from_one}), 3, base + ".three");
  if (absl::StrContains(logs[0], "no Gloo process group")) GTEST_SKIP() << logs[0];
  for (size_t r = 0; r < logs.size(); ++r) {
    EXPECT_THAT(OsftFactorsLine(logs[r]), HasSubstr(kNoSvd)) << "rank " << r << ":\n" << logs[r];
  }
  std::printf("straight: %s\nresumed:  %s\n", OsftFactorsLine(straight_log).c_str(),
              OsftFactorsLine(logs[0]).c_str());
  const std::vector<double> resumed = StepLosses(logs[0]);
  ASSERT_EQ(resumed.size(), 1u) << logs[0];
  EXPECT_EQ(first[1], straight[1]);  // the same process, the same computation
  EXPECT_NEAR(resumed[0], straight[2], 1e-5 * std::abs(straight[2]));
  EXPECT_NE(straight[2], straight[0]);
  std::filesystem::remove_all(from_one);
  std::remove(data.c_str());
}

TEST(TrainDistributedTest, WhatSeveralRanksDoNotRunYetIsRefusedNamingTheFlag) {
  const std::string base = absl::StrCat(::testing::TempDir(), "/train_distributed_bad_", getpid());
  std::vector<std::string> args = TrainArgs(2);
  for (const char* flag : {"--planner", "127.0.0.1:1", "--profile"}) args.push_back(flag);
  const Exit run = Wait(testing::Spawn(
      args, {"WORLD_SIZE=2", "RANK=1", "MASTER_ADDR=127.0.0.1", "MASTER_PORT=1"}, base));
  ASSERT_TRUE(WIFEXITED(run.status));
  EXPECT_EQ(WEXITSTATUS(run.status), 1);
  EXPECT_THAT(run.err,
              HasSubstr("rank 1: UNIMPLEMENTED: --profile is not supported with world size 2"));
  const Exit bad_env = Wait(testing::Spawn(TrainArgs(2), {"WORLD_SIZE=2"}, base + ".env"));
  ASSERT_TRUE(WIFEXITED(bad_env.status));
  EXPECT_EQ(WEXITSTATUS(bad_env.status), 2);
  EXPECT_THAT(bad_env.err, HasSubstr("RANK (environment) is required with world size 2"));
}

}  // namespace
}  // namespace memplan
