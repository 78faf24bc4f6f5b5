// ChunkStateIO (through the ChunkManager): checkpoints exported by one residency load into
// another and training continues bit for bit.
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

// Checkpoint: the state exported by one residency, loaded by another (other initial values),
// continues training bit for bit.
// With [Stochastic rounding] too: the keys come from the restored update counts, so the resumed
// run rounds as the straight one.
TEST(ChunkManagerTest, AdamW8bitCheckpointRoundTrip) {
  for (const auto& [bf16, stochastic] : {std::pair{false, false}, std::pair{true, false},
                                         std::pair{true, true}}) {
    const auto dtype = bf16 ? torch::kBFloat16 : torch::kFloat32;
    const ToyModel a_model = ToyModel::Make(4, true, 40, 50, 11, dtype);
    const ToyModel b_model = ToyModel::Make(4, true, 40, 50, 99, dtype);
    auto a = ChunkManager::Create(a_model.Groups(),
                                  Q8Options({bf16, 0, 2, true, 0, 1, false, stochastic}));
    auto b = ChunkManager::Create(b_model.Groups(),
                                  Q8Options({bf16, 2, 1, true, 0, 1, false, stochastic}));
    ASSERT_TRUE(a.ok() && b.ok());
    for (int step = 0; step < 2; ++step) {
      const Batch batch = MakeBatch(50, 60 + step, torch::kCPU);
      RunMicroBatch(a_model, a->get(), false, batch.tokens, batch.targets);
      ASSERT_TRUE((*a)->Step(0.5).ok());
    }
    const std::vector<NamedParam> state = (*a)->OptimizerState();
    ASSERT_TRUE((*b)->LoadParamsAndState((*a)->Params(), state).ok());
    std::map<std::string, torch::Tensor> by_name;
    for (const NamedParam& s : (*b)->OptimizerState()) by_name[s.name] = s.param;
    for (const NamedParam& s : state) {
      EXPECT_TRUE(torch::equal(by_name.at(s.name), s.param)) << s.name << " read back";
    }
    for (int step = 0; step < 2; ++step) {
      const Batch batch = MakeBatch(50, 80 + step, torch::kCPU);
      torch::Tensor la = RunMicroBatch(a_model, a->get(), false, batch.tokens, batch.targets);
      torch::Tensor lb = RunMicroBatch(b_model, b->get(), false, batch.tokens, batch.targets);
      EXPECT_TRUE(torch::equal(la, lb));
      ASSERT_TRUE((*a)->Step(0.5).ok());
      ASSERT_TRUE((*b)->Step(0.5).ok());
    }
    const auto pa = (*a)->Params();
    const auto pb = (*b)->Params();
    for (size_t i = 0; i < pa.size(); ++i) {
      EXPECT_TRUE(torch::equal(pa[i].param, pb[i].param)) << pa[i].name << " " << stochastic;
    }
    // A state with a code tensor of the wrong type is refused, naming it.
    std::vector<NamedParam> bad = state;
    for (NamedParam& s : bad) {
      if (absl::EndsWith(s.name, ".q8")) {
        s.param = s.param.to(torch::kFloat32);
        const absl::Status status = (*b)->LoadParamsAndState((*a)->Params(), bad);
        EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
        EXPECT_NE(status.message().find(s.name), absl::string_view::npos) << status;
        break;
      }
    }
  }
}

TEST(ChunkManagerTest, CheckpointRoundTripContinuesTrainingIdentically) {
  const ToyModel a_model = ToyModel::Make(4, true, 16, 32, 11, torch::kFloat32);
  const ToyModel b_model = ToyModel::Make(4, true, 16, 32, 99, torch::kFloat32);  // other values
  auto a = ChunkManager::Create(a_model.Groups(), CpuOptions(0, 2));
  auto b = ChunkManager::Create(b_model.Groups(), CpuOptions(1, 1));  // another residency
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_TRUE((*a)->OptimizerState().empty()) << "no state before the first update";
  for (int step = 0; step < 2; ++step) {
    const Batch batch = MakeBatch(32, 50 + step, torch::kCPU);
    RunMicroBatch(a_model, a->get(), false, batch.tokens, batch.targets);
    ASSERT_TRUE((*a)->Step(0).ok());
  }
  ASSERT_TRUE((*b)->LoadParamsAndState((*a)->Params(), (*a)->OptimizerState()).ok());
  const Batch batch = MakeBatch(32, 77, torch::kCPU);
  torch::Tensor loss_a = RunMicroBatch(a_model, a->get(), false, batch.tokens, batch.targets);
  torch::Tensor loss_b = RunMicroBatch(b_model, b->get(), false, batch.tokens, batch.targets);
  EXPECT_TRUE(torch::equal(loss_a, loss_b));
  ASSERT_TRUE((*a)->Step(0).ok());
  ASSERT_TRUE((*b)->Step(0).ok());
  const auto pa = (*a)->Params();
  const auto pb = (*b)->Params();
  ASSERT_EQ(pa.size(), pb.size());
  for (size_t i = 0; i < pa.size(); ++i) {
    EXPECT_EQ(pa[i].name, pb[i].name);
    EXPECT_TRUE(torch::equal(pa[i].param, pb[i].param)) << pa[i].name;
  }
  // Unknown names and missing parameters are refused.
  std::vector<NamedParam> partial = (*a)->Params();
  partial.pop_back();
  EXPECT_EQ((*b)->LoadParamsAndState(partial, {}).code(), absl::StatusCode::kInvalidArgument);
  partial.push_back({"no.such.weight", torch::zeros({1})});
  EXPECT_EQ((*b)->LoadParamsAndState(partial, {}).code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace memplan
