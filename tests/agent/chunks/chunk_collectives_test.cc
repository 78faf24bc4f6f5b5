// ChunkCollectives (through a sharded ChunkManager, ranks as threads): 8-bit state over shard
// boundaries, the all-gathers' timing and their coalescing.
#include "agent/chunks/chunk_manager.h"

#include <condition_variable>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "agent/chunks/cpu_adamw.h"
#include "agent/chunks/torch_sqrt.h"
#include "agent/core/torch_pch.h"
#include "agent/dist/communicator.h"
#include "agent/dist/counting_communicator.h"
#include "common/chunk_packing.h"
#include "common/optimizer_bytes.h"
#include "gtest/gtest.h"
#include "tests/agent/chunks/chunk_test_util.h"

namespace memplan {
namespace {

using namespace chunk_test;  // NOLINT(build/namespaces): the shared toy model and helpers

// adamw8bit sharded over 2 ranks ([Sharded chunks], [8-bit optimizer state]): every rank sees the
// same batch, so the reduced gradients are exactly one process's, and the only difference from
// one rank is the blocks a shard boundary cuts (each piece has its own absmax). After one step the
// elements of every other block are bit-identical to one rank's and the cut ones close; the
// state exported by the ranks loads into one rank and back without a change.
TEST(ChunkManagerTest, AdamW8bitTwoRanksEqualOneOutsideCutBlocks) {
  constexpr int kWorld = 2;
  for (const bool bf16 : {false, true}) {
    SCOPED_TRACE(bf16 ? "bf16" : "fp32");
    const auto dtype = bf16 ? torch::kBFloat16 : torch::kFloat32;
    const Q8Case c{bf16, 1, 2, true, 0, 1, false};
    const ChunkManagerOptions options = Q8Options(c);
    const ToyModel single = ToyModel::Make(4, true, 40, 50, 21, dtype);
    std::vector<ToyModel> ranks;
    for (int r = 0; r < kWorld; ++r) ranks.push_back(single.Clone());
    std::vector<Batch> batches;
    for (int step = 0; step < 3; ++step) batches.push_back(MakeBatch(50, 400 + step, torch::kCPU));

    // Which elements sit in a block cut by a shard boundary.
    auto layout = ChunkManager::LayoutOf(single.Groups(), options);
    ASSERT_TRUE(layout.ok());
    const int64_t elem = bf16 ? 2 : 4;
    std::map<std::string, torch::Tensor> cut;  // bool per element
    int64_t cut_elems = 0, total = 0;
    for (size_t i = 0; i < layout->slots().size(); ++i) {
      const ParamSlot& slot = layout->slots()[i];
      const LayoutParam& lp = layout->params()[i];
      torch::Tensor mask = torch::zeros({lp.numel}, torch::kBool);
      if (slot.chunk >= options.n_persist) {
        const int64_t span = layout->chunks()[slot.chunk].size_bytes / elem;
        const int64_t shard = (span + kWorld - 1) / kWorld;
        const int64_t o = slot.offset_bytes / elem;
        for (int64_t b = 0; b * 256 < lp.numel; ++b) {
          const int64_t begin = o + b * 256, end = std::min(begin + 256, o + lp.numel);
          for (int j = 1; j < kWorld; ++j) {
            if (begin < j * shard && j * shard < end) {
              mask.narrow(0, b * 256, end - begin).fill_(true);
            }
          }
        }
      }
      cut_elems += mask.sum().item<int64_t>();
      total += lp.numel;
      cut[lp.name] = mask;
    }
    ASSERT_GT(cut_elems, 0) << "the layout should cut some block";
    ASSERT_LT(cut_elems, total / 4);

    auto one = ChunkManager::Create(single.Groups(), options);
    ASSERT_TRUE(one.ok()) << one.status();
    ThreadHub hub(kWorld);
    std::vector<std::unique_ptr<ThreadCommunicator>> comms;
    std::vector<std::unique_ptr<ChunkManager>> managers(kWorld);
    for (int r = 0; r < kWorld; ++r) comms.push_back(std::make_unique<ThreadCommunicator>(hub, r));
    for (int r = 0; r < kWorld; ++r) {
      auto m = ChunkManager::Create(ranks[r].Groups(), options, comms[r].get());
      ASSERT_TRUE(m.ok()) << m.status();
      managers[r] = std::move(m).value();
    }
    std::vector<std::vector<NamedParam>> rank_params(kWorld), rank_state(kWorld);
    std::vector<absl::Status> steps(kWorld);
    for (int step = 0; step < 3; ++step) {
      const Batch& batch = batches[step];
      RunMicroBatch(single, one->get(), false, batch.tokens, batch.targets);
      ASSERT_TRUE((*one)->Step(0).ok());
      RunRanks(kWorld, [&](int r) {
        RunMicroBatch(ranks[r], managers[r].get(), false, batch.tokens, batch.targets);
        steps[r] = managers[r]->Step(0);
        rank_params[r] = managers[r]->Params();
        rank_state[r] = managers[r]->OptimizerState();
      });
      for (int r = 0; r < kWorld; ++r) ASSERT_TRUE(steps[r].ok()) << steps[r];
      const std::vector<NamedParam> want = (*one)->Params();
      for (size_t i = 0; i < want.size(); ++i) {
        ASSERT_TRUE(torch::equal(rank_params[0][i].param, rank_params[1][i].param));
        const torch::Tensor got = rank_params[0][i].param.to(torch::kFloat32).reshape({-1});
        const torch::Tensor exp = want[i].param.to(torch::kFloat32).reshape({-1});
        const torch::Tensor& mask = cut.at(want[i].name);
        if (step == 0) {
          // Identical inputs: everything outside the cut blocks is bit for bit one rank's.
          EXPECT_TRUE(torch::equal(got.masked_select(~mask), exp.masked_select(~mask)))
              << want[i].name;
        }
        // The cut blocks (and, from step 2 on, everything through the forward) stay close:
        // an AdamW step moves an element by about lr.
        EXPECT_LE((got - exp).abs().max().item<double>(), 0.5 * options.adamw.lr * (step + 1))
            << want[i].name << " step " << step;
      }
    }
    // Sharded export -> one rank -> export: unchanged; one rank's state -> the ranks -> export:
    // unchanged (a cut block's pieces take the block's absmax and merge back exactly).
    auto fresh = ChunkManager::Create(single.Clone().Groups(), options);
    ASSERT_TRUE(fresh.ok());
    ASSERT_TRUE((*fresh)->LoadParamsAndState(rank_params[0], rank_state[0]).ok());
    std::map<std::string, torch::Tensor> back;
    for (const NamedParam& s : (*fresh)->OptimizerState()) back[s.name] = s.param;
    for (const NamedParam& s : rank_state[0]) {
      EXPECT_TRUE(torch::equal(back.at(s.name), s.param)) << s.name;
    }
    for (int r = 1; r < kWorld; ++r) {
      for (size_t i = 0; i < rank_state[0].size(); ++i) {
        EXPECT_TRUE(torch::equal(rank_state[r][i].param, rank_state[0][i].param));
      }
    }
    const std::vector<NamedParam> one_state = (*one)->OptimizerState();
    const std::vector<NamedParam> one_params = (*one)->Params();
    std::vector<absl::Status> loaded(kWorld);
    std::vector<std::vector<NamedParam>> reexported(kWorld);
    RunRanks(kWorld, [&](int r) {
      loaded[r] = managers[r]->LoadParamsAndState(one_params, one_state);
      reexported[r] = managers[r]->OptimizerState();
    });
    for (int r = 0; r < kWorld; ++r) {
      ASSERT_TRUE(loaded[r].ok()) << loaded[r];
      ASSERT_EQ(reexported[r].size(), one_state.size());
      for (size_t i = 0; i < one_state.size(); ++i) {
        EXPECT_EQ(reexported[r][i].name, one_state[i].name);
        EXPECT_TRUE(torch::equal(reexported[r][i].param, one_state[i].param)) << one_state[i].name;
      }
    }
  }
}

// [Collective timing] Sharded uploads are all-gathers: UploadStats() counts each with its output
// bytes and, where the communicator times collectives, sums their device time (each read once);
// an untimed communicator (Gloo) leaves the time at zero.
TEST(ChunkManagerTest, UploadStatsTimeTheShardedGathers) {
  constexpr int kWorld = 2;
  for (const double each : {0.0, 0.25}) {
    SCOPED_TRACE(each > 0 ? "timed" : "untimed");
    std::vector<ToyModel> ranks;
    for (int r = 0; r < kWorld; ++r) {
      ranks.push_back(ToyModel::Make(4, /*tied=*/false, 16, 32, 7, torch::kFloat32));
    }
    ThreadHub hub(kWorld);
    std::vector<std::unique_ptr<ThreadCommunicator>> comms;
    std::vector<std::unique_ptr<ChunkManager>> managers(kWorld);
    for (int r = 0; r < kWorld; ++r) {
      comms.push_back(std::make_unique<ThreadCommunicator>(hub, r, each));
    }
    for (int r = 0; r < kWorld; ++r) {
      auto m = ChunkManager::Create(ranks[r].Groups(), CpuOptions(/*n_persist=*/1, 2),
                                    comms[r].get());
      ASSERT_TRUE(m.ok()) << m.status();
      managers[r] = std::move(m).value();
    }
    const Batch batch = MakeBatch(32, 5, torch::kCPU);
    std::vector<ChunkUploadStats> stats(kWorld);
    std::vector<ChunkMemoryStats> memory(kWorld);
    RunRanks(kWorld, [&](int r) {
      RunMicroBatch(ranks[r], managers[r].get(), false, batch.tokens, batch.targets);
      (void)managers[r]->Step(0);
      stats[r] = managers[r]->UploadStats();
      memory[r] = managers[r]->MemoryStats();
    });
    for (int r = 0; r < kWorld; ++r) {
      const ChunkUploadStats& u = stats[r];
      EXPECT_GT(u.gathers, 0);
      EXPECT_EQ(u.gathers, u.uploads) << "every sharded upload is an all-gather";
      if (each > 0) {
        // [Coalesced gathers]: one timed collective per batch, its time the sum of its chunks'.
        EXPECT_GT(u.gathers_timed, 0);
        EXPECT_LE(u.gathers_timed, u.gathers);
        EXPECT_EQ(u.gather_output_bytes, u.bytes);
        EXPECT_DOUBLE_EQ(u.gather_seconds, each * static_cast<double>(u.gathers));
        EXPECT_EQ(u.gather_seconds_each.size(), static_cast<size_t>(u.gathers_timed));
        double sampled = 0;
        for (float t : u.gather_seconds_each) sampled += t;
        EXPECT_NEAR(sampled, u.gather_seconds, 1e-5);
        EXPECT_EQ(u.gather_sampled_bytes, u.gather_output_bytes);
      } else {
        EXPECT_EQ(u.gathers_timed, 0);
        EXPECT_EQ(u.gather_output_bytes, 0);
        EXPECT_EQ(u.gather_seconds, 0);
        EXPECT_TRUE(u.gather_seconds_each.empty());
      }
      // Each gather's output is one whole (padded) offloaded chunk.
      int64_t chunk_sum = 0;
      for (int c = 1; c < memory[r].n_chunks; ++c) chunk_sum += memory[r].chunk_bytes[c];
      EXPECT_GE(u.bytes, chunk_sum);
    }
    // Across ranks: per gather the fastest rank's time (here rank 1's, half of rank 0's).
    if (each > 0) {
      std::vector<ChunkUploadStats> skewed = stats;
      for (float& s : skewed[0].gather_seconds_each) s *= 2;
      std::vector<absl::StatusOr<std::optional<GatherBandwidth>>> across(kWorld);
      RunRanks(kWorld, [&](int r) { across[r] = CompareGatherTimes(*comms[r], skewed[r]); });
      const double bus = static_cast<double>(stats[0].gather_sampled_bytes) / 2;  // x (W-1)/W
      const double n = static_cast<double>(stats[0].gathers);
      for (int r = 0; r < kWorld; ++r) {
        ASSERT_TRUE(across[r].ok()) << across[r].status();
        ASSERT_TRUE(across[r]->has_value());
        EXPECT_EQ((*across[r])->gathers, stats[0].gathers_timed);
        EXPECT_NEAR((*across[r])->fastest_bus_bytes_per_second, bus / (n * each), 1e-6 * bus);
        EXPECT_NEAR((*across[r])->slowest_bus_bytes_per_second, bus / (n * 2 * each), 1e-6 * bus);
      }
      // A rank with another count of samples: every rank skips.
      skewed[1].gather_seconds_each.pop_back();
      RunRanks(kWorld, [&](int r) { across[r] = CompareGatherTimes(*comms[r], skewed[r]); });
      for (int r = 0; r < kWorld; ++r) {
        ASSERT_TRUE(across[r].ok());
        EXPECT_FALSE(across[r]->has_value());
      }
    }
    RunRanks(kWorld, [&](int r) { managers[r]->ResetUploadStats(); });
    EXPECT_EQ(managers[0]->UploadStats().gathers, 0);
    EXPECT_EQ(managers[0]->UploadStats().gather_seconds, 0);
  }
}

// [Coalesced gathers] With two chunks per block, a hook's uploads start as one collective: fewer
// collectives than chunk gathers, the same chunks gathered, and training bit-identical to one
// all-gather per chunk.
TEST(ChunkManagerTest, CoalescedGathersEqualOneGatherPerChunk) {
  constexpr int kWorld = 2;
  const ToyModel start = ToyModel::Make(4, /*tied=*/false, 16, 32, 11, torch::kFloat32);
  const std::vector<Batch> batches = {MakeBatch(32, 8, torch::kCPU), MakeBatch(32, 9, torch::kCPU)};
  std::map<bool, std::vector<std::vector<NamedParam>>> params;
  std::map<bool, std::vector<CollectiveCounts>> counts;
  std::map<bool, std::vector<ChunkUploadStats>> uploads;
  for (const bool coalesce : {false, true}) {
    SCOPED_TRACE(coalesce ? "coalesced" : "one per chunk");
    ChunkManagerOptions options = CpuOptions(/*n_persist=*/1, /*n_buffer=*/4);
    // A block's norm and weight do not share a chunk (256-byte alignment): two chunks per block.
    options.chunk_bytes = 1100;
    options.coalesce_gathers = coalesce;
    std::vector<ToyModel> ranks;
    for (int r = 0; r < kWorld; ++r) ranks.push_back(start.Clone());
    ThreadHub hub(kWorld);
    std::vector<std::unique_ptr<ThreadCommunicator>> threads;
    std::vector<std::unique_ptr<CountingCommunicator>> comms;
    std::vector<std::unique_ptr<ChunkManager>> managers(kWorld);
    for (int r = 0; r < kWorld; ++r) {
      threads.push_back(std::make_unique<ThreadCommunicator>(hub, r, /*gather_seconds=*/0.5));
      comms.push_back(std::make_unique<CountingCommunicator>(threads.back().get()));
    }
    for (int r = 0; r < kWorld; ++r) {
      auto m = ChunkManager::Create(ranks[r].Groups(), options, comms[r].get());
      ASSERT_TRUE(m.ok()) << m.status();
      managers[r] = std::move(m).value();
    }
    ASSERT_GE(managers[0]->MemoryStats().n_chunks, 9);
    params[coalesce].resize(kWorld);
    uploads[coalesce].resize(kWorld);
    RunRanks(kWorld, [&](int r) {
      for (const Batch& b : batches) {
        RunMicroBatch(ranks[r], managers[r].get(), false, b.tokens, b.targets);
        ASSERT_TRUE(managers[r]->Step(0).ok());
        managers[r]->ZeroGrad();
      }
      uploads[coalesce][r] = managers[r]->UploadStats();
      params[coalesce][r] = managers[r]->Params();
    });
    for (int r = 0; r < kWorld; ++r) counts[coalesce].push_back(comms[r]->counts());
  }
  for (int r = 0; r < kWorld; ++r) {
    const CollectiveCounts& off = counts[false][r];
    const CollectiveCounts& on = counts[true][r];
    EXPECT_EQ(off.coalesced_gather_calls, 0);
    EXPECT_GT(on.coalesced_gather_calls, 0);
    EXPECT_EQ(on.all_gathers, off.all_gathers) << "the same chunks are gathered";
    EXPECT_EQ(uploads[true][r].gathers, uploads[false][r].gathers);
    EXPECT_EQ(uploads[true][r].gather_output_bytes, uploads[false][r].gather_output_bytes);
    EXPECT_EQ(uploads[false][r].gathers_timed, uploads[false][r].gathers);
    EXPECT_LT(uploads[true][r].gathers_timed, uploads[true][r].gathers)
        << "fewer collectives than chunk gathers";
    EXPECT_DOUBLE_EQ(uploads[true][r].gather_seconds, uploads[false][r].gather_seconds);
    ASSERT_EQ(params[true][r].size(), params[false][r].size());
    for (size_t i = 0; i < params[true][r].size(); ++i) {
      EXPECT_TRUE(torch::equal(params[true][r][i].param, params[false][r][i].param))
          << params[true][r][i].name;
    }
  }
}

}  // namespace
}  // namespace memplan
