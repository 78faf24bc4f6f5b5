// What the vision tower allocates on the CPU (MemoryProbe over c10's CPU allocator) against the
// planner's [Vision tower bytes] (common/vision_cost.h): the saved set a trained tower keeps, its
// forward peak, and a frozen tower's transients, for fp32 and bf16, for Qwen2.5-VL's and
// Qwen2-VL's towers, with the blocks kept or checkpointed ([Vision block checkpointing]).
#include <gtest/gtest.h>

#include <cstdio>
#include <memory>
#include <string>
#include <tuple>

#include "agent/model/layers.h"
#include "agent/model/vision_tower.h"
#include "agent/profiler/memory_probe.h"
#include "common/vision_cost.h"
#include "tests/agent/model/memory_ratio.h"
#include "tests/agent/tiny_spec.h"

namespace memplan {
namespace {

const bool kSingleThread = [] {
  torch::set_num_threads(1);
  return true;
}();

// A tower wide enough that its per-patch tensors outweigh the CPU attention kernel's scratch:
// width 128 (4 heads of 32), MLP 256, 2x2-pixel patches, windows of 2x2 merged patches, full
// attention at block 1; or the same as Qwen2-VL's (LayerNorm, QuickGELU MLP, no windows).
ModelSpec Spec(const std::string& family) {
  ModelSpec s = testing::TinyVlSpec(3);
  s.vision.hidden_size = 128;
  s.vision.intermediate_size = 256;
  s.vision.num_heads = 4;
  if (family == "qwen2_vl") {
    s.family = family;
    s.vision.window_size = 0;
    s.vision.fullatt_block_indexes.clear();
  }
  return s;
}

// Two images of 32x32 pixels: 16x16 patches each, 512 patches in all.
constexpr int64_t kImages = 2, kSide = 32;

VisionInputs Images(const ModelSpec& s) {
  const int64_t g = kSide / s.vision.patch_size;
  VisionInputs in;
  in.image_grid_thw = torch::tensor({int64_t{1}, g, g}, torch::kLong).repeat({kImages, 1});
  auto gen = at::make_generator<at::CPUGeneratorImpl>(11);
  in.pixel_values = torch::randn({kImages * g * g, s.vision.PatchDim()}, gen);
  return in;
}

VisionParams Params(const ModelSpec& s, torch::ScalarType dtype, bool trains) {
  VisionParams p = VisionParams::Shaped(s);
  auto gen = at::make_generator<at::CPUGeneratorImpl>(5);
  for (size_t i = 0; i < p.tensors.size(); ++i) {
    p.tensors[i] = (torch::randn(p.shapes[i], gen) * 0.05).to(dtype).requires_grad_(trains);
  }
  return p;
}

struct Measured {
  int64_t saved = 0;           // left after the forward, the output excluded
  int64_t forward_peak = 0;    // above the start
  int64_t backward_extra = 0;  // backward's peak above its start, parameter gradients excluded
};

Measured Measure(const ModelSpec& s, torch::ScalarType dtype, bool trains,
                 bool checkpoint = false) {
  const VisionParams params = Params(s, dtype, trains);
  const VisionInputs images = Images(s);
  int64_t param_bytes = 0;
  for (const torch::Tensor& t : params.tensors) param_bytes += t.nbytes();
  Measured m;
  std::unique_ptr<MemoryProbe> probe = MemoryProbe::Create(torch::kCPU);
  torch::Tensor out = VisionTowerForward(s, params, images, checkpoint);
  m.forward_peak = probe->PeakAllocatedBytes();
  m.saved = probe->AllocatedBytes() - static_cast<int64_t>(out.nbytes());
  if (trains) {
    const torch::Tensor grad = torch::ones_like(out);
    probe->ResetPeak();
    const int64_t start = probe->AllocatedBytes();
    torch::autograd::backward({out}, {grad});
    m.backward_extra = probe->PeakAllocatedBytes() - start - param_bytes;
  }
  return m;
}

class VisionMemoryTest : public ::testing::TestWithParam<std::tuple<std::string, DType>> {};

// A trained tower (full fine-tuning): the planner's saved bytes within 1 % of what autograd keeps
// (equal to the byte here); its forward peak (the saved set and an upper bound of the rest) not
// under and within 5 % (a 3-block tower: its transients weigh more than in a 32-block one); its
// backward peak above its start and the parameters' gradients (the saved set shrinking as backward
// goes) under the planner's transient, which it adds to the whole saved set.
TEST_P(VisionMemoryTest, TrainedTowerKeepsWhatThePlannerCharges) {
  const ModelSpec s = Spec(std::get<0>(GetParam()));
  const DType dtype = std::get<1>(GetParam());
  const VisionTowerCost predicted =
      VisionTowerCostFor(s, kImages, kSide, kSide, dtype, /*trains=*/true);
  const Measured m = Measure(s, ToScalarType(dtype), /*trains=*/true);
  std::printf(
      "%s trained: saved %lld predicted %lld; forward peak %lld predicted %lld; "
      "backward %lld predicted %lld\n",
      std::string(DTypeName(dtype)).c_str(), static_cast<long long>(m.saved),
      static_cast<long long>(predicted.saved_bytes), static_cast<long long>(m.forward_peak),
      static_cast<long long>(predicted.saved_bytes + predicted.forward_transient_bytes),
      static_cast<long long>(m.backward_extra),
      static_cast<long long>(predicted.backward_transient_bytes));
  EXPECT_NEAR(MemoryRatio(predicted.saved_bytes, m.saved), 1.0, 0.01);
  const double peak =
      MemoryRatio(predicted.saved_bytes + predicted.forward_transient_bytes, m.forward_peak);
  EXPECT_GE(peak, 1.0);
  EXPECT_LE(peak, 1.05);
  EXPECT_GE(predicted.backward_transient_bytes, m.backward_extra);
}

// Checkpointed blocks: the saved set (block inputs, the merger's, the rotary tables) within 1 % of
// what autograd keeps, and the drop from the kept tower's price within 1 % of the drop measured;
// the forward peak not under and within 5 %; the backward peak (one block recomputed at a time)
// under the planner's transient (a bound: 2.7-3.1x the CPU's here, as the kept tower's backward
// bound is loose).
TEST_P(VisionMemoryTest, CheckpointedTowerKeepsWhatThePlannerCharges) {
  const ModelSpec s = Spec(std::get<0>(GetParam()));
  const DType dtype = std::get<1>(GetParam());
  const VisionTowerCost kept = VisionTowerCostFor(s, kImages, kSide, kSide, dtype, true);
  const VisionTowerCost predicted =
      VisionTowerCostFor(s, kImages, kSide, kSide, dtype, true, /*checkpoint_blocks=*/true);
  const Measured whole = Measure(s, ToScalarType(dtype), /*trains=*/true);
  Measured m = Measure(s, ToScalarType(dtype), /*trains=*/true, /*checkpoint=*/true);
  // Each checkpoint also keeps the CPU generator's state to replay its forward (host memory on a
  // GPU, where the planner does not count it; the probe here counts it).
  const int64_t rng_bytes =
      s.vision.depth *
      static_cast<int64_t>(at::detail::getDefaultCPUGenerator().get_state().nbytes());
  m.saved -= rng_bytes;
  m.forward_peak -= rng_bytes;
  std::printf(
      "%s checkpointed: saved %lld predicted %lld (drop %lld predicted %lld); forward peak %lld "
      "predicted %lld; backward %lld predicted %lld\n",
      std::string(DTypeName(dtype)).c_str(), static_cast<long long>(m.saved),
      static_cast<long long>(predicted.saved_bytes), static_cast<long long>(whole.saved - m.saved),
      static_cast<long long>(kept.saved_bytes - predicted.saved_bytes),
      static_cast<long long>(m.forward_peak),
      static_cast<long long>(predicted.saved_bytes + predicted.forward_transient_bytes),
      static_cast<long long>(m.backward_extra),
      static_cast<long long>(predicted.backward_transient_bytes));
  EXPECT_NEAR(MemoryRatio(predicted.saved_bytes, m.saved), 1.0, 0.01);
  EXPECT_NEAR(MemoryRatio(kept.saved_bytes - predicted.saved_bytes, whole.saved - m.saved), 1.0,
              0.01);
  const double peak =
      MemoryRatio(predicted.saved_bytes + predicted.forward_transient_bytes, m.forward_peak);
  EXPECT_GE(peak, 1.0);
  EXPECT_LE(peak, 1.05);
  EXPECT_GE(predicted.backward_transient_bytes, m.backward_extra);
  // The recompute is the blocks' forward once more.
  EXPECT_GT(predicted.recompute_flops, 0);
  EXPECT_DOUBLE_EQ(predicted.backward_flops, kept.backward_flops + predicted.recompute_flops);
  EXPECT_EQ(kept.recompute_flops, 0);
}

// A frozen tower (LoRA) keeps nothing: its output alone survives, and its peak is the planner's
// transient within 1 % (equal to the byte here).
TEST_P(VisionMemoryTest, FrozenTowerKeepsNothing) {
  const ModelSpec s = Spec(std::get<0>(GetParam()));
  const DType dtype = std::get<1>(GetParam());
  const VisionTowerCost predicted =
      VisionTowerCostFor(s, kImages, kSide, kSide, dtype, /*trains=*/false);
  const Measured m = Measure(s, ToScalarType(dtype), /*trains=*/false);
  std::printf("%s frozen: left %lld; forward peak %lld predicted %lld\n",
              std::string(DTypeName(dtype)).c_str(), static_cast<long long>(m.saved),
              static_cast<long long>(m.forward_peak),
              static_cast<long long>(predicted.forward_transient_bytes));
  EXPECT_EQ(predicted.saved_bytes, 0);
  EXPECT_EQ(m.saved, 0);
  EXPECT_NEAR(MemoryRatio(predicted.forward_transient_bytes, m.forward_peak), 1.0, 0.01);
}

INSTANTIATE_TEST_SUITE_P(Dtypes, VisionMemoryTest,
                         ::testing::Combine(::testing::Values("qwen2_5_vl", "qwen2_vl"),
                                            ::testing::Values(DType::kFloat32, DType::kBFloat16)),
                         [](const ::testing::TestParamInfo<std::tuple<std::string, DType>>& info) {
                           return std::get<0>(info.param) +
                                  (std::get<1>(info.param) == DType::kFloat32 ? "_fp32" : "_bf16");
                         });

}  // namespace
}  // namespace memplan
