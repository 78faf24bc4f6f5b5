// The collective benchmark: a real world-size-2 Gloo group (two threads, each its own
// ProcessGroupGloo over a TCPStore on 127.0.0.1 at an ephemeral port), the data checks against a
// one-process fake group, option validation, and NCCL on two GPUs where there are two.
#include "agent/bench/collective_bench.h"

#include <arpa/inet.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <array>
#include <string>
#include <thread>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#include <vector>

#include "agent/bench/collective_bench_testing.h"
#include "agent/bench/hardware_bench.h"
#include "agent/core/torch_pch.h"
#include "tests/agent/subprocess.h"

namespace memplan {
namespace {

using ::testing::HasSubstr;

using ::memplan::testing::ListenOnLoopback;
using ::memplan::testing::LoopbackListener;

CollectiveBenchOptions TwoRanks(int rank, const LoopbackListener& listener,
                                CollectiveBackend backend) {
  CollectiveBenchOptions o;
  o.world_size = 2;
  o.rank = rank;
  o.master_addr = "127.0.0.1";
  o.master_port = listener.port;
  o.master_listen_fd = rank == 0 ? listener.fd : -1;
  o.backend = backend;
  o.device_index = rank;
  o.message_bytes = int64_t{1} << 20;
  o.warmup_ops = 1;
  o.repetitions = 3;
  o.ops_per_run = 2;
  o.timeout_seconds = 120;
  return o;
}

// Runs `fn(rank)` for ranks 0 and 1 on two threads at once.
template <typename Result, typename Fn>
std::array<Result, 2> OnTwoRanks(Fn fn) {
  std::array<Result, 2> results;
  std::thread other([&] { results[1] = fn(1); });
  results[0] = fn(0);
  other.join();
  return results;
}

void ExpectMeasured(const CollectiveFigures& f) {
  EXPECT_TRUE(f.status.ok()) << f.status;
  EXPECT_TRUE(f.verified);
  EXPECT_GT(f.median_seconds, 0);
  EXPECT_GT(f.best_seconds, 0);
  EXPECT_LE(f.best_seconds, f.median_seconds);
  EXPECT_GT(f.algbw_bytes_per_second, 0);
  // nccl-tests' convention: busbw = algbw * (n - 1) / n, n = 2.
  EXPECT_DOUBLE_EQ(f.busbw_bytes_per_second, f.algbw_bytes_per_second / 2);
}

TEST(CollectiveBenchTest, GlooWorldSizeTwoMeasuresAndVerifiesBothCollectives) {
  const LoopbackListener listener = ListenOnLoopback();
  ASSERT_GT(listener.port, 0) << "no loopback socket";
  const auto results = OnTwoRanks<CollectiveBenchResult>([&](int rank) {
    return MeasureCollectives(TwoRanks(rank, listener, CollectiveBackend::kGloo));
  });
  for (const CollectiveBenchResult& r : results) {
    if (r.status.code() == absl::StatusCode::kFailedPrecondition) {
      GTEST_SKIP() << r.status;  // a build without Gloo's headers
    }
    ASSERT_TRUE(r.status.ok()) << r.status;
    EXPECT_EQ(r.backend, CollectiveBackend::kGloo);
    EXPECT_EQ(r.dtype, "fp32");
    EXPECT_EQ(r.world_size, 2);
    EXPECT_EQ(r.message_bytes, int64_t{1} << 20);
    ExpectMeasured(r.allgather);
    ExpectMeasured(r.reduce_scatter);
    // [Collectives under compute]: the same ops again beside a matmul load (a thread here).
    ExpectMeasured(r.allgather_under_compute);
    ExpectMeasured(r.reduce_scatter_under_compute);
  }
  // Both ranks report the slowest rank's times.
  EXPECT_EQ(results[0].allgather.median_seconds, results[1].allgather.median_seconds);
  EXPECT_EQ(results[0].reduce_scatter.best_seconds, results[1].reduce_scatter.best_seconds);
  EXPECT_EQ(results[0].allgather_under_compute.median_seconds,
            results[1].allgather_under_compute.median_seconds);
}

TEST(CollectiveBenchTest, UnderComputeOffMeasuresThePlainCollectivesOnly) {
  const LoopbackListener listener = ListenOnLoopback();
  ASSERT_GT(listener.port, 0) << "no loopback socket";
  const auto results = OnTwoRanks<CollectiveBenchResult>([&](int rank) {
    CollectiveBenchOptions o = TwoRanks(rank, listener, CollectiveBackend::kGloo);
    o.under_compute = false;
    return MeasureCollectives(o);
  });
  for (const CollectiveBenchResult& r : results) {
    if (r.status.code() == absl::StatusCode::kFailedPrecondition) GTEST_SKIP() << r.status;
    ASSERT_TRUE(r.status.ok()) << r.status;
    ExpectMeasured(r.allgather);
    EXPECT_EQ(r.allgather_under_compute.status.code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_FALSE(r.allgather_under_compute.verified);
    EXPECT_EQ(r.reduce_scatter_under_compute.busbw_bytes_per_second, 0);
  }
}

TEST(CollectiveBenchTest, UnderAStoreServedElsewhereEveryRankIsAClient) {
  // torchrun's agent serves the store (TORCHELASTIC_USE_AGENT_STORE=True); here, the test does.
  const LoopbackListener listener = ListenOnLoopback();
  ASSERT_GT(listener.port, 0) << "no loopback socket";
  c10d::TCPStoreOptions served;
  served.port = static_cast<uint16_t>(listener.port);
  served.isServer = true;
  served.waitWorkers = false;
  served.masterListenFd = listener.fd;
  auto agent_store = c10::make_intrusive<c10d::TCPStore>("127.0.0.1", served);
  agent_store->set("torchelastic/some_key", std::vector<uint8_t>{7});
  const auto results = OnTwoRanks<CollectiveBenchResult>([&](int rank) {
    CollectiveBenchOptions o = TwoRanks(rank, listener, CollectiveBackend::kGloo);
    o.master_listen_fd = -1;
    o.store_already_served = true;
    return MeasureCollectives(o);
  });
  for (const CollectiveBenchResult& r : results) {
    if (r.status.code() == absl::StatusCode::kFailedPrecondition) GTEST_SKIP() << r.status;
    ASSERT_TRUE(r.status.ok()) << r.status;
    ExpectMeasured(r.allgather);
    ExpectMeasured(r.reduce_scatter);
  }
  // The bench's keys sit under its prefix, beside the agent's own.
  EXPECT_TRUE(agent_store->check({"memplan_bench/left/0", "memplan_bench/left/1"}));
  EXPECT_EQ(agent_store->get("torchelastic/some_key"), std::vector<uint8_t>{7});
}

TEST(CollectiveBenchTest, HardwareBenchAddsTheCollectiveRowsWithWorldSizeTwo) {
  const LoopbackListener listener = ListenOnLoopback();
  ASSERT_GT(listener.port, 0) << "no loopback socket";
  std::array<std::vector<std::string>, 2> lines;
  const auto results = OnTwoRanks<HardwareBenchResult>([&](int rank) {
    HardwareBenchOptions o;
    o.adam_params = int64_t{1} << 18;
    o.adam_repetitions = 1;
    o.adam_min_seconds = 0;
    o.adam_threads = 1;
    o.transfer_bytes = int64_t{2} << 20;  // also the collectives' message size
    o.transfer_repetitions = 1;
    o.hbm_copy_bytes = int64_t{16} << 20;
    o.matmul_size = 512;
    o.matmul_repetitions = 1;
    o.collective = TwoRanks(rank, listener, CollectiveBackend::kGloo);
    o.collective.message_bytes = 0;
    o.progress = [&lines, rank](const std::string& line) { lines[rank].push_back(line); };
    return MeasureHardware(o);
  });
  for (int rank = 0; rank < 2; ++rank) {
    const HardwareBenchResult& r = results[rank];
    if (r.collectives.status.code() == absl::StatusCode::kFailedPrecondition) {
      GTEST_SKIP() << r.collectives.status;
    }
    ASSERT_TRUE(r.collective_status.ok()) << r.collective_status;
    EXPECT_EQ(r.collectives.message_bytes, int64_t{2} << 20);
    EXPECT_TRUE(r.collectives.allgather.verified);
    EXPECT_TRUE(r.collectives.reduce_scatter.verified);
    auto figure = [&r](absl::string_view name) -> const BenchFigure* {
      for (const BenchFigure& g : r.figures) {
        if (g.name == name) return &g;
      }
      return nullptr;
    };
    for (const char* name :
         {"allgather_algbw", "allgather_busbw", "reduce_scatter_algbw", "reduce_scatter_busbw",
          "allgather_under_compute_busbw", "reduce_scatter_under_compute_busbw"}) {
      const BenchFigure* f = figure(name);
      ASSERT_NE(f, nullptr) << name;
      EXPECT_GT(f->value, 0) << name;
      EXPECT_EQ(f->unit, "GB/s");
      EXPECT_THAT(FormatBenchTable(r), HasSubstr(name));
    }
    EXPECT_DOUBLE_EQ(figure("reduce_scatter_busbw")->value,
                     r.collectives.reduce_scatter.busbw_bytes_per_second / 1e9);
    EXPECT_DOUBLE_EQ(figure("reduce_scatter_under_compute_busbw")->value,
                     r.collectives.reduce_scatter_under_compute.busbw_bytes_per_second / 1e9);
    EXPECT_EQ(r.figures.back().name, "reduce_scatter_under_compute_busbw");
    EXPECT_EQ(lines[rank].size(), r.figures.size()) << "one progress line per figure";
    // Gloo's figures are not NCCL's: the profile's NCCL fields stay "not measured".
    EXPECT_EQ(r.spec.nccl_allgather_bytes_per_second, 0);
    EXPECT_EQ(r.spec.nccl_reduce_scatter_bytes_per_second, 0);
    EXPECT_EQ(r.spec.nccl_allgather_under_compute_bytes_per_second, 0);
  }
}

TEST(CollectiveBenchTest, NcclWorldSizeTwoOnTwoGpus) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  if (torch::cuda::device_count() < 2) GTEST_SKIP() << "NCCL needs two CUDA devices";
  const LoopbackListener listener = ListenOnLoopback();
  ASSERT_GT(listener.port, 0);
  const auto results = OnTwoRanks<CollectiveBenchResult>([&](int rank) {
    CollectiveBenchOptions o = TwoRanks(rank, listener, CollectiveBackend::kNccl);
    o.message_bytes = int64_t{64} << 20;
    return MeasureCollectives(o);
  });
  for (const CollectiveBenchResult& r : results) {
    if (r.status.code() == absl::StatusCode::kFailedPrecondition) GTEST_SKIP() << r.status;
    ASSERT_TRUE(r.status.ok()) << r.status;
    EXPECT_EQ(r.dtype, "bf16");
    ExpectMeasured(r.allgather);
    ExpectMeasured(r.reduce_scatter);
  }
}

TEST(CollectiveBenchTest, NcclWithoutCudaSaysSo) {
  if (torch::cuda::is_available()) GTEST_SKIP() << "a CUDA device is present";
  CollectiveBenchOptions o;
  o.world_size = 2;
  o.backend = CollectiveBackend::kNccl;
  const CollectiveBenchResult r = MeasureCollectives(o);
  EXPECT_EQ(r.status.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(r.status.message()), HasSubstr("nccl"));
}

// One rank of a `size`-rank group played by a single process: it writes what the other ranks
// would have sent (or, as told, wrong data, or refuses the reduce-scatter as a backend without
// one would). Its all-reduce leaves the values alone, as a MAX over identical ranks would.
class OneProcessGroup : public c10d::Backend {
 public:
  enum class Mode { kCorrect, kAllGatherCopiesOwnShard, kNoReduceScatter };

  OneProcessGroup(int rank, int size, Mode mode) : Backend(rank, size), mode_(mode) {}

  const std::string getBackendName() const override { return "one-process"; }

  c10::intrusive_ptr<c10d::Work> allreduce(std::vector<at::Tensor>&,
                                           const c10d::AllreduceOptions&) override {
    return Done();
  }
  c10::intrusive_ptr<c10d::Work> _allgather_base(at::Tensor& out, at::Tensor& in,
                                                 const c10d::AllgatherOptions&) override {
    std::vector<at::Tensor> shards = out.chunk(getSize());
    for (int i = 0; i < getSize(); ++i) {
      if (mode_ == Mode::kAllGatherCopiesOwnShard) {
        shards[i].copy_(in);
      } else {
        shards[i].fill_(i + 1);
      }
    }
    return Done();
  }
  c10::intrusive_ptr<c10d::Work> _reduce_scatter_base(at::Tensor& out, at::Tensor& in,
                                                      const c10d::ReduceScatterOptions&) override {
    TORCH_CHECK(mode_ != Mode::kNoReduceScatter,
                "this backend does not support _reduce_scatter_base");
    out.fill_(getSize());
    return Done();
  }

 private:
  class DoneWork : public c10d::Work {
   public:
    bool wait(std::chrono::milliseconds) override { return true; }
  };
  static c10::intrusive_ptr<c10d::Work> Done() { return c10::make_intrusive<DoneWork>(); }

  const Mode mode_;
};

c10::intrusive_ptr<c10d::Backend> OneProcess(int size, OneProcessGroup::Mode mode) {
  return c10::make_intrusive<OneProcessGroup>(0, size, mode);
}

TEST(CollectiveBenchTest, AGroupThatMovesTheRightDataIsMeasured) {
  CollectiveBenchOptions o;
  o.world_size = 4;
  o.message_bytes = 4096;
  o.repetitions = 2;
  const CollectiveBenchResult r = MeasureCollectivesOn(
      o, CollectiveBackend::kGloo, OneProcess(4, OneProcessGroup::Mode::kCorrect));
  ASSERT_TRUE(r.status.ok()) << r.status;
  for (const CollectiveFigures* f : {&r.allgather, &r.reduce_scatter}) {
    EXPECT_TRUE(f->status.ok()) << f->status;
    EXPECT_TRUE(f->verified);
    EXPECT_GT(f->algbw_bytes_per_second, 0);
    EXPECT_DOUBLE_EQ(f->busbw_bytes_per_second, f->algbw_bytes_per_second * 3 / 4);
  }
}

TEST(CollectiveBenchTest, WrongAllGatherDataIsAnErrorAndStopsTheRun) {
  // Copying this rank's shard into every slot leaves 1 where rank 1's 2 belongs.
  CollectiveBenchOptions o;
  o.world_size = 2;
  o.message_bytes = 4096;
  const CollectiveBenchResult r = MeasureCollectivesOn(
      o, CollectiveBackend::kGloo, OneProcess(2, OneProcessGroup::Mode::kAllGatherCopiesOwnShard));
  ASSERT_TRUE(r.status.ok()) << r.status;
  EXPECT_FALSE(r.allgather.verified);
  EXPECT_EQ(r.allgather.status.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(std::string(r.allgather.status.message()),
              HasSubstr("all-gather returned wrong data on rank 0: output element 512 is 1, "
                        "expected 2"));
  EXPECT_EQ(r.allgather.busbw_bytes_per_second, 0);
  EXPECT_FALSE(r.reduce_scatter.status.ok());
  EXPECT_FALSE(r.reduce_scatter.verified);
}

TEST(CollectiveBenchTest, AnUnsupportedReduceScatterIsNotMeasuredWithTheReason) {
  CollectiveBenchOptions o;
  o.world_size = 4;
  o.message_bytes = 4096;
  o.repetitions = 2;
  const CollectiveBenchResult r = MeasureCollectivesOn(
      o, CollectiveBackend::kGloo, OneProcess(4, OneProcessGroup::Mode::kNoReduceScatter));
  ASSERT_TRUE(r.status.ok()) << r.status;
  EXPECT_TRUE(r.allgather.verified);
  EXPECT_GT(r.allgather.busbw_bytes_per_second, 0);
  EXPECT_FALSE(r.reduce_scatter.verified);
  EXPECT_EQ(r.reduce_scatter.busbw_bytes_per_second, 0);
  EXPECT_THAT(std::string(r.reduce_scatter.status.message()),
              HasSubstr("does not support _reduce_scatter_base"));
}

TEST(CollectiveBenchTest, MessageBytesRoundDownToWholeElementsPerRank) {
  CollectiveBenchOptions o;
  o.world_size = 3;
  o.message_bytes = 1000;  // 83 fp32 elements per rank
  const CollectiveBenchResult r = MeasureCollectivesOn(
      o, CollectiveBackend::kGloo, OneProcess(3, OneProcessGroup::Mode::kCorrect));
  EXPECT_EQ(r.message_bytes, 3 * 83 * 4);
  EXPECT_TRUE(r.allgather.verified);
  EXPECT_TRUE(r.reduce_scatter.verified);
}

TEST(CollectiveBenchTest, OptionsAreValidatedWithTheFieldAndItsRange) {
  CollectiveBenchOptions o;
  EXPECT_TRUE(ValidateCollectiveBenchOptions(o).ok());
  o.world_size = 2;
  o.rank = 2;
  absl::Status s = ValidateCollectiveBenchOptions(o);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), HasSubstr("rank = 2 is out of range [0, 1]"));
  o.rank = 1;
  o.master_port = 70000;
  EXPECT_THAT(std::string(ValidateCollectiveBenchOptions(o).message()),
              HasSubstr("master_port = 70000 is out of range [1, 65535]"));
  o.master_port = 29500;
  o.world_size = 300;
  EXPECT_THAT(std::string(ValidateCollectiveBenchOptions(o).message()),
              HasSubstr("world_size = 300 is out of range [1, 256]"));
  o.world_size = 4;
  o.message_bytes = 8;
  EXPECT_THAT(std::string(ValidateCollectiveBenchOptions(o).message()),
              HasSubstr("message_bytes = 8 is out of range [16, "));
  o.message_bytes = 0;
  o.master_addr.clear();
  EXPECT_THAT(std::string(ValidateCollectiveBenchOptions(o).message()), HasSubstr("master_addr"));
  // MeasureCollectives refuses the same options without touching the network.
  const CollectiveBenchResult r = MeasureCollectives(o);
  EXPECT_EQ(r.status.code(), absl::StatusCode::kInvalidArgument);
}

TEST(CollectiveBenchTest, WorldSizeOneMeasuresNothing) {
  std::vector<std::string> lines;
  HardwareBenchOptions o;
  o.adam_params = int64_t{1} << 16;
  o.adam_repetitions = 1;
  o.adam_min_seconds = 0;
  o.adam_threads = 1;
  o.transfer_bytes = int64_t{1} << 20;
  o.transfer_repetitions = 1;
  o.hbm_copy_bytes = int64_t{4} << 20;
  o.matmul_size = 256;
  o.matmul_repetitions = 1;
  o.progress = [&lines](const std::string& line) { lines.push_back(line); };
  const HardwareBenchResult r = MeasureHardware(o);
  EXPECT_TRUE(r.collective_status.ok());
  for (const BenchFigure& f : r.figures) {
    EXPECT_THAT(f.name, ::testing::Not(HasSubstr("allgather")));
    EXPECT_THAT(f.name, ::testing::Not(HasSubstr("reduce_scatter")));
  }
  EXPECT_EQ(r.spec.nccl_allgather_bytes_per_second, 0);
}

}  // namespace
}  // namespace memplan
