// ProcessGroup over Gloo on 127.0.0.1: two ranks on two threads of this process (each its own
// TCPStore client and ProcessGroupGloo), the collectives' data, and a rank that leaves while the
// other waits in a collective: the survivor's error names it.
#include "agent/dist/process_group.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <array>
#include <chrono>
#include <cmath>
#include <string>
#include <thread>

#include "agent/core/torch_pch.h"
#include "tests/agent/subprocess.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace memplan {
namespace {

using ::testing::HasSubstr;

using ::memplan::testing::ListenOnLoopback;
using ::memplan::testing::LoopbackListener;

DistOptions Rank(int rank, int world_size, const LoopbackListener& listener) {
  DistOptions o;
  o.world_size = world_size;
  o.rank = rank;
  o.local_world_size = world_size;
  o.local_rank = rank;
  o.master_addr = "127.0.0.1";
  o.master_port = listener.port;
  o.master_listen_fd = rank == 0 ? listener.fd : -1;
  o.backend = DistBackend::kGloo;
  o.timeout_seconds = 20;
  o.heartbeat_milliseconds = 100;
  return o;
}

// Runs fn(rank) for ranks 0 and 1 on two threads at once.
template <typename Fn>
void OnTwoRanks(Fn fn) {
  std::thread other([&] { fn(1); });
  fn(0);
  other.join();
}

// Joins ranks 0 and 1 on two threads at once and runs fn(rank, group) on each; a rank that cannot
// join leaves its error in status[rank].
template <typename Fn>
void OnTwoJoinedRanks(const LoopbackListener& listener, std::array<absl::Status, 2>& status,
                      Fn fn) {
  OnTwoRanks([&](int rank) {
    absl::StatusOr<std::unique_ptr<ProcessGroup>> group =
        ProcessGroup::Join(Rank(rank, 2, listener));
    if (!group.ok()) {
      status[rank] = group.status();
      return;
    }
    fn(rank, **group);
  });
}

bool GlooBuilt() { return ResolveDistBackend(DistBackend::kGloo).ok(); }

TEST(ProcessGroupTest, GlooCollectivesGiveTheExpectedData) {
  if (!GlooBuilt()) GTEST_SKIP() << ResolveDistBackend(DistBackend::kGloo).status();
  const LoopbackListener listener = ListenOnLoopback();
  ASSERT_GT(listener.port, 0);
  std::array<torch::Tensor, 2> gathered, scattered, reduced;
  std::array<absl::Status, 2> status;
  OnTwoJoinedRanks(listener, status, [&](int rank, ProcessGroup& g) {
    EXPECT_EQ(g.rank(), rank);
    EXPECT_EQ(g.world_size(), 2);
    EXPECT_TRUE(g.device().is_cpu());
    // Rank r contributes [10r, 10r + 1, 10r + 2].
    torch::Tensor shard = torch::arange(3, torch::kFloat32) + 10 * rank;
    gathered[rank] = torch::zeros({6});
    status[rank] = g.AllGather(gathered[rank], shard)->Wait();
    if (!status[rank].ok()) return;
    // Rank r contributes (r + 1) * [0, 1, 2, 3]; the sum is 3 * [0, 1, 2, 3], split in two.
    torch::Tensor full = torch::arange(4, torch::kFloat32) * (rank + 1);
    scattered[rank] = torch::zeros({2});
    status[rank] = g.ReduceScatterSum(scattered[rank], full)->Wait();
    if (!status[rank].ok()) return;
    reduced[rank] = torch::full({2}, rank + 1.0, torch::kFloat64);
    status[rank] = g.AllReduceSum(reduced[rank])->Wait();
    if (status[rank].ok()) status[rank] = g.Barrier();
  });
  for (int rank = 0; rank < 2; ++rank) {
    ASSERT_TRUE(status[rank].ok()) << status[rank];
    EXPECT_TRUE(torch::equal(gathered[rank], torch::tensor({0.f, 1.f, 2.f, 10.f, 11.f, 12.f})));
    EXPECT_TRUE(
        torch::equal(scattered[rank], torch::tensor({0.f, 3.f, 6.f, 9.f}).narrow(0, 2 * rank, 2)));
    EXPECT_TRUE(torch::equal(reduced[rank], torch::full({2}, 3.0, torch::kFloat64)));
  }
}

// [Narrow reduce-scatter] bf16 slices exchanged, summed in fp32: the fp32 reduce-scatter of the
// widened inputs bit for bit, where a bf16 reduce-scatter rounds (1 + 2^-8 is no bf16 value).
TEST(ProcessGroupTest, GlooWidenedReduceScatterSumsBf16InFp32) {
  if (!GlooBuilt()) GTEST_SKIP() << ResolveDistBackend(DistBackend::kGloo).status();
  const LoopbackListener listener = ListenOnLoopback();
  ASSERT_GT(listener.port, 0);
  std::array<torch::Tensor, 2> widened, reference, inputs;
  std::array<absl::Status, 2> status;
  torch::manual_seed(11);
  const torch::Tensor draws = torch::randn({2, 1000}).to(torch::kBFloat16);
  inputs[0] = draws[0].clone();
  inputs[1] = draws[1].clone();
  inputs[0][0] = 1.0;
  inputs[1][0] = std::ldexp(1.0, -8);
  OnTwoJoinedRanks(listener, status, [&](int rank, ProcessGroup& g) {
    widened[rank] = torch::zeros({500}, torch::kFloat32);
    status[rank] = g.ReduceScatterSumWidened(widened[rank], inputs[rank])->Wait();
    if (!status[rank].ok()) return;
    reference[rank] = torch::zeros({500}, torch::kFloat32);
    status[rank] = g.ReduceScatterSum(reference[rank], inputs[rank].to(torch::kFloat32))->Wait();
  });
  for (int rank = 0; rank < 2; ++rank) {
    ASSERT_TRUE(status[rank].ok()) << status[rank];
    EXPECT_TRUE(torch::equal(widened[rank], reference[rank])) << rank;
  }
  EXPECT_EQ(widened[0][0].item<float>(), 1.0f + std::ldexp(1.0f, -8));
}

TEST(ProcessGroupTest, ARankThatLeavesIsNamedByTheRankWaitingForIt) {
  if (!GlooBuilt()) GTEST_SKIP() << ResolveDistBackend(DistBackend::kGloo).status();
  const LoopbackListener listener = ListenOnLoopback();
  ASSERT_GT(listener.port, 0);
  absl::Status survivor;
  double seconds = 0;
  OnTwoRanks([&](int rank) {
    absl::StatusOr<std::unique_ptr<ProcessGroup>> group =
        ProcessGroup::Join(Rank(rank, 2, listener));
    ASSERT_TRUE(group.ok()) << group.status();
    ASSERT_TRUE((*group)->Barrier().ok());
    if (rank == 1) {
      group->reset();  // rank 1 goes: heartbeat stops, its Gloo connections close
      return;
    }
    const auto start = std::chrono::steady_clock::now();
    torch::Tensor t = torch::ones({4});
    survivor = (*group)->AllReduceSum(t)->Wait();
    seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  });
  ASSERT_FALSE(survivor.ok());
  EXPECT_EQ(survivor.code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(std::string(survivor.message()), HasSubstr("rank 0 of 2: all-reduce failed"));
  EXPECT_THAT(std::string(survivor.message()), HasSubstr("rank 1 is gone"));
  // Within the collective timeout (20 s), not at its end.
  EXPECT_LT(seconds, 15);
}

TEST(ProcessGroupTest, JoinRefusesBadOptionsNamingTheField) {
  DistOptions o;
  o.world_size = 2;
  o.rank = 5;
  absl::StatusOr<std::unique_ptr<ProcessGroup>> group = ProcessGroup::Join(o);
  ASSERT_FALSE(group.ok());
  EXPECT_THAT(std::string(group.status().message()), HasSubstr("rank = 5 is out of range"));
}

}  // namespace
}  // namespace memplan
