#include "agent/blocks/group_runner.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "agent/blocks/activation_offloader.h"

namespace memplan {
namespace {

const bool kSingleThread = [] {  // shared CI machine: avoid OpenMP spin contention
  torch::set_num_threads(1);
  return true;
}();

// Records the ParamResidency calls and checks that each group's parameters have their final
// gradient when PostBackward is called.
class RecordingResidency : public ParamResidency {
 public:
  void PreForward(int g) override { calls.push_back(absl::StrCat("F+", g)); }
  void PostForward(int g) override { calls.push_back(absl::StrCat("F-", g)); }
  void PreBackward(int g) override { calls.push_back(absl::StrCat("B+", g)); }
  void PostBackward(int g) override {
    calls.push_back(absl::StrCat("B-", g));
    if (on_post_backward) on_post_backward(g);
  }
  std::vector<std::string> calls;
  std::function<void(int)> on_post_backward;
};

// A small stack of "blocks", each h -> h + dropout(tanh(h·W_g)), with one weight per block.
struct Toy {
  explicit Toy(int n_blocks, int64_t width = 8) {
    torch::manual_seed(3);
    for (int i = 0; i < n_blocks; ++i) {
      weights.push_back((torch::randn({width, width}) * 0.5).requires_grad_(true));
    }
    input = torch::randn({4, width});
  }
  static torch::Tensor Body(const torch::Tensor& w, const torch::Tensor& h, double dropout) {
    torch::Tensor y = torch::tanh(torch::mm(h, w));
    if (dropout > 0) y = torch::dropout(y, dropout, /*train=*/true);
    return h + y * y;
  }
  torch::Tensor Plain(double dropout) {
    torch::Tensor h = input;
    for (auto& w : weights) h = Body(w, h, dropout);
    return h.pow(2).sum();
  }
  torch::Tensor Grouped(const std::vector<BlockMode>& modes, double dropout,
                        ParamResidency* residency, ActivationOffloader* offloader) {
    GroupRunnerOptions options{residency, offloader};
    // Group 0 turns a constant input into a grad-requiring one, like an embedding lookup.
    GroupSpec first;
    first.group = 0;
    first.body = [](const torch::Tensor& x) { return x * 1.0; };
    torch::Tensor h = RunGroup(first, input, options);
    for (size_t i = 0; i < weights.size(); ++i) {
      GroupSpec spec;
      spec.group = static_cast<int>(i) + 1;
      spec.mode = modes[i];
      torch::Tensor w = weights[i];
      spec.body = [w, dropout](const torch::Tensor& x) { return Body(w, x, dropout); };
      h = RunGroup(spec, h, options);
    }
    return h.pow(2).sum();
  }
  std::vector<torch::Tensor> TakeGrads() {
    std::vector<torch::Tensor> grads;
    for (auto& w : weights) {
      grads.push_back(w.grad().clone());
      w.mutable_grad().reset();
    }
    return grads;
  }
  std::vector<torch::Tensor> weights;
  torch::Tensor input;
};

std::unique_ptr<ActivationOffloader> CpuOffloader() {
  auto offloader = ActivationOffloader::Create({});
  EXPECT_TRUE(offloader.ok()) << offloader.status();
  return std::move(offloader).value();
}

class GroupRunnerModeTest : public ::testing::TestWithParam<BlockMode> {};

TEST_P(GroupRunnerModeTest, MatchesPlainAutogradBitForBit) {
  Toy toy(3);
  torch::Tensor plain = toy.Plain(0.0);
  plain.backward();
  auto expected = toy.TakeGrads();

  auto offloader = CpuOffloader();
  torch::Tensor grouped =
      toy.Grouped({GetParam(), GetParam(), GetParam()}, 0.0, nullptr, offloader.get());
  EXPECT_TRUE(torch::equal(plain, grouped));
  grouped.backward();
  auto got = toy.TakeGrads();
  for (size_t i = 0; i < got.size(); ++i) EXPECT_TRUE(torch::equal(expected[i], got[i])) << i;
  const auto stats = offloader->Stats();
  switch (GetParam()) {
    case BlockMode::kSwap:  // mm input, tanh output, the squared term; the weights pass through
      EXPECT_GT(stats.offloaded_bytes, 0);
      EXPECT_EQ(stats.passthrough_tensors, 3);
      break;
    case BlockMode::kHsOffload:  // the three block inputs, 4 x 8 floats each
      EXPECT_EQ(stats.offloaded_bytes, 3 * 4 * 8 * 4);
      break;
    default:
      EXPECT_EQ(stats.offloaded_bytes, 0);
  }
  EXPECT_EQ(stats.host_bytes, 0);
}

TEST_P(GroupRunnerModeTest, RecomputeSeesTheForwardRandomNumbers) {
  // With dropout in the body, CKPT/HS_OFFLOAD only match NONE if the recompute replays the RNG.
  Toy toy(3);
  auto offloader = CpuOffloader();
  torch::manual_seed(11);
  toy.Grouped({BlockMode::kNone, BlockMode::kNone, BlockMode::kNone}, 0.5, nullptr, offloader.get())
      .backward();
  auto expected = toy.TakeGrads();
  torch::manual_seed(11);
  toy.Grouped({GetParam(), GetParam(), GetParam()}, 0.5, nullptr, offloader.get()).backward();
  auto got = toy.TakeGrads();
  for (size_t i = 0; i < got.size(); ++i) EXPECT_TRUE(torch::equal(expected[i], got[i])) << i;
  // And the generator continues from where the forward left it, as without recompute.
  torch::manual_seed(11);
  toy.Grouped({BlockMode::kNone, BlockMode::kNone, BlockMode::kNone}, 0.5, nullptr, offloader.get())
      .backward();
  torch::Tensor after_none = torch::rand({4});
  toy.TakeGrads();
  torch::manual_seed(11);
  toy.Grouped({GetParam(), GetParam(), GetParam()}, 0.5, nullptr, offloader.get()).backward();
  EXPECT_TRUE(torch::equal(after_none, torch::rand({4})));
  toy.TakeGrads();
}

TEST_P(GroupRunnerModeTest, ResidencyHooksBracketEachGroupAndGradsAreFinal) {
  Toy toy(2);
  RecordingResidency residency;
  std::vector<bool> grad_ready(3, false);
  residency.on_post_backward = [&](int g) {
    grad_ready[g] = g == 0 || toy.weights[g - 1].grad().defined();
  };
  auto offloader = CpuOffloader();
  toy.Grouped({GetParam(), GetParam()}, 0.0, &residency, offloader.get()).backward();
  EXPECT_THAT(residency.calls, ::testing::ElementsAre("F+0", "F-0", "F+1", "F-1", "F+2", "F-2",
                                                      "B+2", "B-2", "B+1", "B-1", "B+0", "B-0"));
  EXPECT_THAT(grad_ready, ::testing::Each(true));
}

INSTANTIATE_TEST_SUITE_P(AllModes, GroupRunnerModeTest,
                         ::testing::Values(BlockMode::kNone, BlockMode::kCkpt, BlockMode::kSwap,
                                           BlockMode::kHsOffload),
                         [](const auto& info) { return std::string(BlockModeName(info.param)); });

TEST(GroupRunnerTest, MixedModesMatchPlain) {
  Toy toy(4);
  toy.Plain(0.0).backward();
  auto expected = toy.TakeGrads();
  auto offloader = CpuOffloader();
  toy.Grouped({BlockMode::kSwap, BlockMode::kHsOffload, BlockMode::kCkpt, BlockMode::kNone}, 0.0,
              nullptr, offloader.get())
      .backward();
  auto got = toy.TakeGrads();
  for (size_t i = 0; i < got.size(); ++i) EXPECT_TRUE(torch::equal(expected[i], got[i])) << i;
  // Everything offloaded was dropped once backward finished.
  EXPECT_EQ(offloader->Stats().host_bytes, 0);
}

// [Outputs belong to the next group] A NONE or SWAP group keeps its inner graph for backward but
// not its output's storage: an HS_OFFLOAD group after it copies that input to the host and its
// device storage goes once the copy is done (here: the end of the next group's forward), as the
// planner charges it. Before, the first group held it until backward. Gradients stay exact.
TEST(GroupRunnerTest, AnHsOffloadGroupsInputIsFreedAfterANoneOrSwapGroup) {
  for (BlockMode before : {BlockMode::kNone, BlockMode::kSwap}) {
    SCOPED_TRACE(std::string(BlockModeName(before)));
    Toy toy(3);
    toy.Plain(0.0).backward();
    const auto expected = toy.TakeGrads();
    auto offloader = CpuOffloader();
    GroupRunnerOptions options{nullptr, offloader.get()};
    GroupSpec first;
    first.group = 0;
    first.body = [](const torch::Tensor& x) { return x * 1.0; };
    torch::Tensor h = RunGroup(first, toy.input, options);
    const std::vector<BlockMode> modes = {before, BlockMode::kHsOffload, BlockMode::kHsOffload};
    std::optional<c10::weak_intrusive_ptr<c10::StorageImpl>> hs_input;
    for (size_t i = 0; i < modes.size(); ++i) {
      GroupSpec spec;
      spec.group = static_cast<int>(i) + 1;
      spec.mode = modes[i];
      torch::Tensor w = toy.weights[i];
      spec.body = [w](const torch::Tensor& x) { return Toy::Body(w, x, 0.0); };
      if (i == 1) hs_input = h.storage().getWeakStorageImpl();
      h = RunGroup(spec, h, options);
    }
    // Group 2's input (group 1's output) went to the host; its device storage is gone.
    ASSERT_TRUE(hs_input.has_value());
    EXPECT_TRUE(hs_input->expired());
    h.pow(2).sum().backward();
    const auto got = toy.TakeGrads();
    for (size_t i = 0; i < got.size(); ++i) EXPECT_TRUE(torch::equal(expected[i], got[i])) << i;
  }
}

TEST(GroupRunnerTest, OffloadingModesWithoutOffloaderAreRejected) {
  Toy toy(1);
  GroupSpec spec;
  spec.group = 1;
  spec.mode = BlockMode::kSwap;
  spec.body = [](const torch::Tensor& x) { return x * 2; };
  EXPECT_THROW(RunGroup(spec, toy.input.requires_grad_(true), {}), c10::Error);
}

}  // namespace
}  // namespace memplan
