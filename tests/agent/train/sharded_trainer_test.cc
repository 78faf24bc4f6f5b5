// ZeRO-3 over chunks, end to end on the CPU: world_size processes of sharded_step_worker (Gloo on
// 127.0.0.1) run one optimizer step of every ShardCase (each block mode; persistent and offloaded
// chunks; clipping; accumulation; a tied head) on their rows of a global batch, and this test
// runs the same step in one process, unsharded, on the whole batch. What is equal:
// * the loss within 1e-5 relative and the pre-clip norm within 1e-5 relative (summation order);
// * every gradient within 1e-5 of its tensor's largest magnitude (summation order);
//   the bf16 case: 1e-2, 2e-2 and 5e-2 (bf16 rounding of activations and grads; the sharded
//   reduction sums in fp32 and rounds once);
// * the parameters after the step are bit for bit torch::optim::AdamW applied to the sharded
//   run's own (gathered) gradients, clipped by its norm: the sharded optimizer is exact;
// * and they differ from the unsharded run's only as far as the gradients do: AdamW's first step
//   moves an element by lr c g / (c |g| + eps), so element-wise |dp| <= lr c eps |dg| /
//   (c min|g| + eps)^2 + 1e-6 (min|g| = 0 where the signs differ; bf16: plus one bf16 ulp of the
//   parameter, 2^-7 of it, for the rounding of the fp32 master). Elements with tiny gradients may
//   move by up to a step; all others agree to about 1e-6;
// * every rank holds bit-identical results;
// * the reduce-scatters issued: one per offloaded chunk and micro-batch, or one per offloaded
//   chunk and step when grads accumulate on the device (accumulate_sharded_grads_on_device);
// * every persistent chunk's all-reduce started during backward (before Grads() or Step());
// * [Sharded persistent state] cases: the persistent chunks' grads reduce-scattered in backward
//   instead, and each rank's device state for them is 1/W of the replicated one (byte for byte
//   common/optimizer_bytes.h's PersistentStateBytes() of its shards);
// * each rank's host memory is, byte for byte, common/optimizer_bytes.h's OffloadedChunkHost() of
//   its shards (ceil(S / W) elements of every offloaded chunk of S elements): 1/W of the
//   unsharded run's, up to the padding.
// Then a rank killed in backward: the others exit non-zero within the collective timeout, naming
// it.
#include <signal.h>
#include <sys/wait.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/optimizer_bytes.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/agent/subprocess.h"
#include "tests/agent/train/sharded_cases.h"

namespace memplan {
namespace {

using ::testing::HasSubstr;

const bool kSingleThread = [] {
  torch::set_num_threads(1);
  return true;
}();

struct RankRun {
  int status = 0;
  std::string err;
};

// Runs world_size workers at once; returns their wait statuses and stderr. `fault` ("kill" or
// "stop") is what kill_rank does to itself in backward; *seconds is when the others had exited.
// A stopped rank is killed once the others are done.
std::vector<RankRun> RunWorkers(int world_size, const std::string& prefix, int kill_rank,
                                double* seconds, const std::string& fault = "kill",
                                int timeout_seconds = 30) {
  const int port = testing::FreeLoopbackPort();
  EXPECT_GT(port, 0);
  const auto start = std::chrono::steady_clock::now();
  std::vector<testing::Child> children;
  for (int r = 0; r < world_size; ++r) {
    std::vector<std::string> args = {MEMPLAN_SHARD_WORKER, prefix};
    if (kill_rank >= 0) {
      args.insert(args.end(), {std::to_string(kill_rank), fault, std::to_string(timeout_seconds)});
    }
    children.push_back(testing::Spawn(
        args,
        {absl::StrCat("WORLD_SIZE=", world_size), absl::StrCat("RANK=", r),
         absl::StrCat("LOCAL_RANK=", r), absl::StrCat("LOCAL_WORLD_SIZE=", world_size),
         "MASTER_ADDR=127.0.0.1", absl::StrCat("MASTER_PORT=", port)},
        absl::StrCat(prefix, ".", r)));
    EXPECT_GT(children.back().pid, 0);
  }
  std::vector<RankRun> runs(world_size);
  auto reap = [&](int r) {
    EXPECT_EQ(waitpid(children[r].pid, &runs[r].status, 0), children[r].pid);
    runs[r].err = testing::ReadFile(children[r].err_path);
    std::remove(children[r].out_path.c_str());
    std::remove(children[r].err_path.c_str());
  };
  for (int r = 0; r < world_size; ++r) {
    if (r != kill_rank) reap(r);
  }
  *seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (kill_rank >= 0) {
    if (fault == "stop") kill(children[kill_rank].pid, SIGKILL);
    reap(kill_rank);
  }
  return runs;
}

double MaxAbsDiff(const torch::Tensor& a, const torch::Tensor& b) {
  return (a.to(torch::kFloat64) - b.to(torch::kFloat64)).abs().max().item<double>();
}

struct Reference {
  double loss = 0;
  double norm = 0;
  std::vector<NamedParam> grads, params, initial;
  int64_t host_bytes = 0;  // ChunkManager::MemoryStats(): pinned + pageable
};

Reference RunReference(const testing::ShardCase& c, int world_size) {
  Reference ref;
  std::unique_ptr<LlamaModel> model = testing::MakeShardCaseModel(c);
  EXPECT_NE(model, nullptr);
  for (const NamedParam& p : model->Params()) ref.initial.push_back({p.name, p.param.clone()});
  auto trainer = Trainer::Create(model.get(), testing::ShardCaseOptions(c, model->num_blocks()));
  EXPECT_TRUE(trainer.ok()) << trainer.status();
  auto loss =
      (*trainer)->ForwardBackward(testing::GlobalBatches(c, world_size, model->spec().vocab_size));
  EXPECT_TRUE(loss.ok()) << loss.status();
  ref.loss = *loss;
  ref.grads = (*trainer)->Grads();
  auto norm = (*trainer)->OptimizerStep();
  EXPECT_TRUE(norm.ok()) << norm.status();
  ref.norm = *norm;
  ref.params = (*trainer)->Params();
  const ChunkMemoryStats stats = (*trainer)->chunk_manager()->MemoryStats();
  ref.host_bytes = stats.host_pinned_bytes + stats.host_pageable_bytes;
  return ref;
}

class ShardedTrainerTest : public ::testing::TestWithParam<int> {};

TEST_P(ShardedTrainerTest, OneStepEqualsOneProcessOnTheConcatenatedBatch) {
  const int world_size = GetParam();
  const std::string prefix =
      absl::StrCat(::testing::TempDir(), "/sharded_step_", getpid(), "_w", world_size);
  double seconds = 0;
  const std::vector<RankRun> runs = RunWorkers(world_size, prefix, /*kill_rank=*/-1, &seconds);
  for (int r = 0; r < world_size; ++r) {
    if (absl::StrContains(runs[r].err, "no Gloo process group")) GTEST_SKIP() << runs[r].err;
    ASSERT_TRUE(WIFEXITED(runs[r].status) && WEXITSTATUS(runs[r].status) == 0)
        << "rank " << r << " stderr:\n"
        << runs[r].err;
  }
  for (const testing::ShardCase& c : testing::ShardCases()) {
    SCOPED_TRACE(c.name);
    const Reference ref = RunReference(c, world_size);
    const size_t n_grads = ref.grads.size();
    const size_t n_params = ref.params.size();
    // The step moved the parameters (so equality below is not equality of the initial values).
    double moved = 0;
    for (size_t i = 0; i < n_params; ++i) {
      moved = std::max(moved, MaxAbsDiff(ref.params[i].param, ref.initial[i].param));
    }
    EXPECT_GT(moved, 1e-3);
    std::vector<torch::Tensor> rank0;
    for (int r = 0; r < world_size; ++r) {
      SCOPED_TRACE(absl::StrCat("rank ", r));
      const std::string path = absl::StrCat(prefix, ".", c.name, ".rank", r, ".pt");
      std::vector<torch::Tensor> got;
      torch::load(got, path);
      std::remove(path.c_str());
      ASSERT_EQ(got.size(), 5 + n_grads + n_params);
      const double loss_rtol = c.bf16 ? 1e-2 : 1e-5;
      const double norm_rtol = c.bf16 ? 2e-2 : 1e-5;
      const double grad_tol = c.bf16 ? 5e-2 : 1e-5;
      EXPECT_NEAR(got[0].item<double>(), ref.loss, loss_rtol * std::abs(ref.loss));
      EXPECT_NEAR(got[1].item<double>(), ref.norm, norm_rtol * std::abs(ref.norm));
      if (c.max_grad_norm > 0) {
        EXPECT_GT(ref.norm, c.max_grad_norm);  // it clipped
      }
      for (size_t i = 0; i < n_grads; ++i) {
        const torch::Tensor& g = got[2 + i];
        const torch::Tensor& e = ref.grads[i].param;
        ASSERT_EQ(g.sizes(), e.sizes()) << ref.grads[i].name;
        const double scale = e.abs().max().item<double>();
        EXPECT_LE(MaxAbsDiff(g, e), grad_tol * scale + 1e-9) << "grad " << ref.grads[i].name;
      }
      // The clip coefficient as the chunk manager computes it (fp32) from the sharded norm.
      const double norm = got[1].item<double>();
      const float coef = c.max_grad_norm > 0
                             ? std::min(1.0f, static_cast<float>(c.max_grad_norm) /
                                                  (static_cast<float>(norm) + 1e-6f))
                             : 1.0f;
      std::map<std::string, torch::Tensor> got_grads, ref_grads;
      for (size_t i = 0; i < n_grads; ++i) {
        got_grads[ref.grads[i].name] = got[2 + i];
        ref_grads[ref.grads[i].name] = ref.grads[i].param;
      }
      const AdamWOptions a = testing::ShardCaseOptions(c, 4).adamw;  // TinySpec: 4 blocks
      std::vector<torch::Tensor> leaves;
      for (size_t i = 0; i < n_params; ++i) {
        // bf16: the fp32 master starts as the bf16 values; the parameter is the master rounded.
        leaves.push_back(
            ref.initial[i].param.detach().to(torch::kFloat32).clone().set_requires_grad(true));
        ASSERT_TRUE(got_grads.count(ref.params[i].name)) << ref.params[i].name;
        torch::Tensor g = got_grads[ref.params[i].name].to(torch::kFloat32).clone();
        if (coef < 1.0f) g.mul_(coef);  // clip_grad_norm_'s grad.mul_(coef)
        leaves.back().mutable_grad() = g;
      }
      torch::optim::AdamW adamw(leaves, torch::optim::AdamWOptions(a.lr)
                                            .betas({a.beta1, a.beta2})
                                            .eps(a.eps)
                                            .weight_decay(a.weight_decay));
      adamw.step();
      for (size_t i = 0; i < n_params; ++i) {
        const std::string& name = ref.params[i].name;
        const torch::Tensor& p = got[2 + n_grads + i];
        const torch::Tensor expected = leaves[i].detach().to(p.scalar_type());
        EXPECT_TRUE(torch::equal(p, expected))
            << "param " << name << ": not AdamW of the sharded grads, max diff "
            << MaxAbsDiff(p, expected);
        const torch::Tensor g = got_grads[name].to(torch::kFloat64);
        const torch::Tensor e = ref_grads[name].to(torch::kFloat64);
        const torch::Tensor smallest =
            torch::where(g * e <= 0, torch::zeros_like(g), torch::min(g.abs(), e.abs()));
        torch::Tensor bound =
            a.lr * coef * a.eps * (g - e).abs() / (coef * smallest + a.eps).pow(2) + 1e-6;
        if (c.bf16) bound = bound + ref.params[i].param.to(torch::kFloat64).abs() / 128;
        const torch::Tensor diff =
            (p.to(torch::kFloat64) - ref.params[i].param.to(torch::kFloat64)).abs();
        EXPECT_TRUE((diff <= bound).all().item<bool>())
            << "param " << name << ": max excess " << (diff - bound).max().item<double>()
            << ", max diff " << diff.max().item<double>();
      }
      const torch::Tensor memory = got[got.size() - 2];
      const torch::Tensor counts = got[got.size() - 3];
      const int n_persist = static_cast<int>(memory[1].item<int64_t>());
      int64_t expected_host = 0, unsharded_host = 0;
      for (int64_t k = 2 + n_persist; k < memory.numel(); ++k) {
        const int64_t elem = c.bf16 ? 2 : 4;
        const int64_t chunk_elems = memory[k].item<int64_t>() / elem;
        const int64_t shard_bytes = (chunk_elems + world_size - 1) / world_size * elem;
        expected_host +=
            OffloadedChunkHost(OptimizerKind::kAdamW, elem, c.grad_accum, shard_bytes).total();
        unsharded_host +=
            OffloadedChunkHost(OptimizerKind::kAdamW, elem, c.grad_accum, chunk_elems * elem)
                .total();
      }
      if (memory.numel() > 2 + n_persist) {  // offloaded chunks
        EXPECT_GT(expected_host, 0);
      }
      EXPECT_EQ(memory[0].item<int64_t>(), expected_host);
      EXPECT_EQ(ref.host_bytes, unsharded_host);  // the one-process run, same formula
      EXPECT_LE(expected_host * world_size, unsharded_host + world_size * 64 * 8);
      // Reduce-scatters: one per offloaded chunk and micro-batch, or one per offloaded chunk
      // when the grads accumulate on the device (every chunk here has grads).
      const int64_t offloaded = memory.numel() - 2 - n_persist;
      const int64_t offloaded_scatters = offloaded * (c.grads_on_device ? 1 : c.grad_accum);
      const int64_t reduce_scatters = counts[1].item<int64_t>();
      // [Sharded persistent state]: one more per persistent chunk and step, and no all-reduce of
      // grads (the remaining all-reduces: the clipping norm's, one per step, and the trainer's).
      EXPECT_EQ(reduce_scatters, offloaded_scatters + (c.shard_state ? n_persist : 0));
      // Every persistent chunk's all-reduce (or reduce-scatter) started in backward, after the
      // group completing it in the last micro-batch, not in Step(): the overlap the planner prices.
      EXPECT_EQ(counts[3].item<int64_t>(), n_persist);
      // The offloaded chunks' reduce-scatters run beside the backward of the groups after the one
      // that issued them (all but those of the last group, finished before the step).
      const int64_t beside = counts[4].item<int64_t>();
      std::printf("%s W%d: %lld of %lld reduce-scatters beside backward\n", c.name.c_str(),
                  world_size, static_cast<long long>(beside),
                  static_cast<long long>(offloaded_scatters));
      EXPECT_LE(beside, offloaded_scatters);
      EXPECT_GE(2 * beside, offloaded_scatters);  // 9 of 10 to 10 of 10 in these cases
      // Device bytes of the persistent chunks, as common/optimizer_bytes.h defines them: the
      // parameters replicated (padded to a multiple of W when the state is sharded) and the
      // state over the span, or over this rank's shard of it: 1/W of the replicated state.
      // [Sharded persistent parameters]: this rank's shard of the parameters instead.
      int64_t persistent_params = 0, persistent_state = 0, replicated_state = 0;
      std::vector<int64_t> padded(6, 0);  // per chunk, persistent ones only
      for (int64_t k = 2; k < 2 + n_persist; ++k) {
        const int64_t elem = c.bf16 ? 2 : 4;
        const int64_t span = memory[k].item<int64_t>() / elem;
        const int64_t shard = (span + world_size - 1) / world_size;
        padded[k - 2] = shard * world_size * elem;
        persistent_params += (c.shard_params  ? shard
                              : c.shard_state ? shard * world_size
                                              : span) *
                             elem;
        persistent_state +=
            PersistentStateBytes(OptimizerKind::kAdamW, elem, c.shard_state ? shard : span);
        replicated_state += PersistentStateBytes(OptimizerKind::kAdamW, elem, span);
      }
      EXPECT_EQ(got.back()[0].item<int64_t>(), persistent_params);
      EXPECT_EQ(got.back()[1].item<int64_t>(), persistent_state);
      // Gathered at once: at most a group's persistent chunks and the next group's. Group g uses
      // chunk g here (one block per chunk); the tied head uses the embedding's chunk 0 too.
      int64_t gather_bytes = 0;
      if (c.shard_params) {
        auto used = [&](int g) {
          std::set<int> s = {g};
          if (g == 5 && c.tied) s.insert(0);
          return s;
        };
        for (int g = 0; g < 6; ++g) {
          std::set<int> held = used(g);
          if (g + 1 < 6) held.merge(used(g + 1));
          int64_t bytes = 0;
          for (int k : held) bytes += padded[k];  // 0 for an offloaded chunk
          gather_bytes = std::max(gather_bytes, bytes);
        }
        EXPECT_GT(gather_bytes, 0);
        // Forward and backward each gather every persistent chunk at least once (the head's
        // stay gathered from its forward to its backward).
        EXPECT_GE(got.back()[3].item<int64_t>(), 2 * n_persist - 1);
      } else {
        EXPECT_EQ(got.back()[3].item<int64_t>(), 0);
      }
      EXPECT_EQ(got.back()[2].item<int64_t>(), gather_bytes);
      if (c.shard_state) {
        EXPECT_LE(persistent_state * world_size,
                  replicated_state + n_persist * world_size * 16);
      }
      if (r == 0) {
        rank0 = got;
      } else {
        for (size_t i = 0; i < got.size(); ++i) {
          EXPECT_TRUE(torch::equal(got[i], rank0[i])) << "item " << i << " differs from rank 0";
        }
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(WorldSizes, ShardedTrainerTest, ::testing::Values(2, 3),
                         [](const ::testing::TestParamInfo<int>& info) {
                           return absl::StrCat("W", info.param);
                         });

struct KillCase {
  int world_size;
  int kill_rank;
  std::string fault;    // "kill": the rank exits; "stop": it hangs (SIGSTOP)
  int timeout_seconds;  // the workers' collective timeout
  std::string named;    // what every survivor's error says
};

// Readable parameters in test output and ctest.
void PrintTo(const KillCase& k, std::ostream* os) {
  *os << k.fault << " rank " << k.kill_rank << " of " << k.world_size;
}

class ShardedTrainerFailureTest : public ::testing::TestWithParam<KillCase> {};

TEST_P(ShardedTrainerFailureTest, AFailedRankMakesTheOthersExitNamingIt) {
  const KillCase& k = GetParam();
  const std::string prefix = absl::StrCat(::testing::TempDir(), "/sharded_kill_", getpid());
  double seconds = 0;
  const std::vector<RankRun> runs =
      RunWorkers(k.world_size, prefix, k.kill_rank, &seconds, k.fault, k.timeout_seconds);
  for (const RankRun& run : runs) {
    if (absl::StrContains(run.err, "no Gloo process group")) GTEST_SKIP() << run.err;
  }
  ASSERT_TRUE(WIFSIGNALED(runs[k.kill_rank].status));
  EXPECT_EQ(WTERMSIG(runs[k.kill_rank].status), SIGKILL);
  for (int r = 0; r < k.world_size; ++r) {
    if (r == k.kill_rank) continue;
    SCOPED_TRACE(absl::StrCat("rank ", r, " stderr:\n", runs[r].err));
    ASSERT_TRUE(WIFEXITED(runs[r].status));
    EXPECT_NE(WEXITSTATUS(runs[r].status), 0);
    EXPECT_THAT(runs[r].err, HasSubstr(absl::StrCat("rank ", r, ": ")));
    EXPECT_THAT(runs[r].err, HasSubstr(k.named));
  }
  if (k.fault == "kill") {
    // A dead peer's connections close: the failure is seen long before the 30 s timeout.
    EXPECT_LT(seconds, 20);
  } else {
    // A hung peer keeps its connections: the survivors' collectives time out (4 s); pending
    // prefetches time out in turn on the way out.
    EXPECT_GE(seconds, k.timeout_seconds);
    EXPECT_LT(seconds, 6 * k.timeout_seconds);
  }
}

// Rank 1 of 3 killed: the survivors see its heartbeat stop. Rank 0 of 2 killed: the store it
// served is gone. Rank 1 of 3 hung: the collectives time out and its heartbeat has stopped.
INSTANTIATE_TEST_SUITE_P(
    Faults, ShardedTrainerFailureTest,
    ::testing::Values(KillCase{3, 1, "kill", 30, "rank 1 is gone (no heartbeat for 600 ms"},
                      KillCase{2, 0, "kill", 30,
                               "rank 0 is gone (the store it served at 127.0.0.1:"},
                      KillCase{3, 1, "stop", 4, "rank 1 is gone (no heartbeat for 600 ms"}),
    [](const ::testing::TestParamInfo<KillCase>& info) {
      return absl::StrCat(info.param.fault == "kill" ? "Killed" : "Hung", "Rank",
                          info.param.kill_rank, "Of", info.param.world_size);
    });

// Rank 1 finishes every case and exits without leaving the group: rank 0, which serves the store,
// sees its heartbeat stop and exits 0 within a few heartbeats instead of waiting out the 30 s
// timeout for its [Leaving] mark.
TEST(ShardedTrainerLeavingTest, RankZeroDoesNotWaitForARankThatVanished) {
  const std::string prefix = absl::StrCat(::testing::TempDir(), "/sharded_vanish_", getpid());
  double seconds = 0;
  const std::vector<RankRun> runs =
      RunWorkers(2, prefix, /*kill_rank=*/1, &seconds, "vanish", /*timeout_seconds=*/30);
  for (const RankRun& run : runs) {
    if (absl::StrContains(run.err, "no Gloo process group")) GTEST_SKIP() << run.err;
  }
  for (int r = 0; r < 2; ++r) {
    EXPECT_TRUE(WIFEXITED(runs[r].status) && WEXITSTATUS(runs[r].status) == 0)
        << "rank " << r << ":\n"
        << runs[r].err;
    for (const testing::ShardCase& c : testing::ShardCases()) {
      std::remove(absl::StrCat(prefix, ".", c.name, ".rank", r, ".pt").c_str());
    }
  }
  EXPECT_LT(seconds, 20);
}

}  // namespace
}  // namespace memplan
