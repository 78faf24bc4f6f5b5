// GPU checks (skipped without CUDA): bf16 training under every block mode and chunk plan stays
// within a tight tolerance of the plain LibTorch run, and checkpointing / offloading really lower
// the measured peak of the CUDA caching allocator.
#include <c10/cuda/CUDACachingAllocator.h>
#include <gtest/gtest.h>

#include <map>
#include <string>
#include <vector>

#include "agent/train/trainer.h"

namespace memplan {
namespace {

using M = BlockMode;

ModelSpec GpuSpec(int64_t hidden, int64_t layers, int64_t vocab, bool tied) {
  ModelSpec s;
  s.name = "gpu-test";
  s.hidden_size = hidden;
  s.num_layers = layers;
  s.num_heads = hidden / 64;
  s.num_kv_heads = hidden / 256;
  s.intermediate_size = hidden * 11 / 4;
  s.vocab_size = vocab;
  s.rope_theta = 500000.0;
  s.tie_word_embeddings = tied;
  return s;
}

std::unique_ptr<LlamaModel> MakeModel(const ModelSpec& spec, bool params_on_cpu) {
  LlamaModelOptions o;
  o.spec = spec;
  o.dtype = DType::kBFloat16;
  o.device = torch::Device(torch::kCUDA, 0);
  if (params_on_cpu) o.param_device = torch::Device(torch::kCPU);
  o.seed = 9;
  auto model = LlamaModel::Create(o);
  EXPECT_TRUE(model.ok()) << model.status();
  return std::move(model).value();
}

std::vector<MicroBatch> Batches(int64_t step, int grad_accum, int64_t vocab, int64_t batch,
                                int64_t seq) {
  std::vector<MicroBatch> out;
  for (int i = 0; i < grad_accum; ++i) {
    auto gen = at::make_generator<at::CPUGeneratorImpl>(77 + step * 16 + i);
    MicroBatch b;
    b.input_ids = torch::randint(vocab, {batch, seq}, gen, torch::kLong);
    b.labels = b.input_ids.clone();
    out.push_back(b);
  }
  return out;
}

double RelativeError(const torch::Tensor& got, const torch::Tensor& expected) {
  const torch::Tensor e = expected.to(torch::kFloat64);
  const torch::Tensor g = got.to(torch::kFloat64);
  return ((g - e).norm() / (e.norm() + 1e-12)).item<double>();
}

struct GpuCase {
  std::string name;
  std::vector<BlockMode> modes;
  bool managed = false;
  int n_persist = 0;
  HostMemoryKind host = HostMemoryKind::kPinned;
};

// Readable parameter names in test output and ctest.
void PrintTo(const GpuCase& c, std::ostream* os) { *os << c.name; }

class GpuPlanTest : public ::testing::TestWithParam<GpuCase> {
 protected:
  void SetUp() override {
    if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  }
};

TEST_P(GpuPlanTest, Bf16CloseToPlainLibTorch) {
  const GpuCase& c = GetParam();
  const ModelSpec spec = GpuSpec(512, 4, 4096, /*tied=*/true);
  TrainerOptions base;
  base.grad_accum = 2;
  base.max_grad_norm = 1.0;
  base.adamw.lr = 1e-3;

  auto ref_model = MakeModel(spec, false);
  TrainerOptions ref_options = base;
  ref_options.plain_reference = true;
  auto ref = Trainer::Create(ref_model.get(), ref_options);
  ASSERT_TRUE(ref.ok()) << ref.status();

  auto model = MakeModel(spec, c.managed);
  TrainerOptions options = base;
  options.block_modes = c.modes;
  options.managed = c.managed;
  options.chunks.chunk_bytes = 4 << 20;
  options.chunks.n_persist = c.n_persist;
  options.chunks.n_buffer = 2;
  options.chunks.host_memory = c.host;
  options.offload.host_memory = c.host;
  auto trainer = Trainer::Create(model.get(), options);
  ASSERT_TRUE(trainer.ok()) << trainer.status();

  auto ref_loss = (*ref)->ForwardBackward(Batches(0, 2, spec.vocab_size, 2, 256));
  auto loss = (*trainer)->ForwardBackward(Batches(0, 2, spec.vocab_size, 2, 256));
  ASSERT_TRUE(ref_loss.ok() && loss.ok()) << ref_loss.status() << loss.status();
  EXPECT_NEAR(*loss, *ref_loss, 2e-3 * std::abs(*ref_loss));
  std::map<std::string, torch::Tensor> ref_grads;
  for (auto& p : (*ref)->Grads()) ref_grads[p.name] = p.param;
  for (auto& p : (*trainer)->Grads()) {
    ASSERT_TRUE(ref_grads.count(p.name)) << p.name;
    EXPECT_LT(RelativeError(p.param, ref_grads[p.name]), 2e-2) << p.name;
  }
  ASSERT_TRUE((*ref)->OptimizerStep().ok());
  ASSERT_TRUE((*trainer)->OptimizerStep().ok());
  for (int64_t step = 1; step < 3; ++step) {
    auto r = (*ref)->Step(Batches(step, 2, spec.vocab_size, 2, 256));
    auto s = (*trainer)->Step(Batches(step, 2, spec.vocab_size, 2, 256));
    ASSERT_TRUE(r.ok() && s.ok()) << r.status() << s.status();
    EXPECT_NEAR(s->loss, r->loss, 1e-2 * std::abs(r->loss)) << "step " << step;
  }
  std::map<std::string, torch::Tensor> ref_params;
  for (auto& p : (*ref)->Params()) ref_params[p.name] = p.param;
  for (auto& p : (*trainer)->Params()) {
    EXPECT_LT(RelativeError(p.param, ref_params[p.name]), 1e-2) << p.name;
  }
  if (ActivationOffloader* offloader = (*trainer)->offloader()) {
    EXPECT_GT(offloader->Stats().offloaded_bytes, 0);
    EXPECT_EQ(offloader->Stats().host_bytes, 0);
  }
}

const std::vector<M> kMixed = {M::kSwap, M::kHsOffload, M::kCkpt, M::kNone};
INSTANTIATE_TEST_SUITE_P(
    Plans, GpuPlanTest,
    ::testing::Values(
        GpuCase{"ckpt", {M::kCkpt, M::kCkpt, M::kCkpt, M::kCkpt}},
        GpuCase{"swap", {M::kSwap, M::kSwap, M::kSwap, M::kSwap}},
        GpuCase{"hs_offload", {M::kHsOffload, M::kHsOffload, M::kHsOffload, M::kHsOffload}},
        GpuCase{"hs_offload_pageable",
                {M::kHsOffload, M::kHsOffload, M::kHsOffload, M::kHsOffload},
                false,
                0,
                HostMemoryKind::kPageable},
        GpuCase{"managed_offloaded_mixed", kMixed, true, 0},
        GpuCase{"managed_half_persistent_pageable", kMixed, true, 3, HostMemoryKind::kPageable}),
    [](const auto& info) { return info.param.name; });

// Peak allocated bytes of one forward+backward (parameters, grads and optimizer state included).
int64_t ForwardBackwardPeak(const ModelSpec& spec, const TrainerOptions& options,
                            const std::vector<MicroBatch>& batches) {
  auto model = MakeModel(spec, options.managed);
  auto trainer = Trainer::Create(model.get(), options);
  EXPECT_TRUE(trainer.ok()) << trainer.status();
  // One full step first, so optimizer state exists as in steady state.
  const absl::StatusOr<StepStats> step = (*trainer)->Step(batches);
  EXPECT_TRUE(step.ok()) << step.status();
  torch::cuda::synchronize();
  c10::cuda::CUDACachingAllocator::resetPeakStats(0);
  const absl::StatusOr<double> loss = (*trainer)->ForwardBackward(batches);
  EXPECT_TRUE(loss.ok()) << loss.status();
  torch::cuda::synchronize();
  const auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(0);
  return stats.allocated_bytes[static_cast<size_t>(c10::CachingAllocator::StatType::AGGREGATE)]
      .peak;
}

TEST(GpuMemoryTest, CheckpointingAndOffloadLowerPeakMemory) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  const ModelSpec spec = GpuSpec(1024, 8, 8192, /*tied=*/false);
  const auto batches = Batches(0, 1, spec.vocab_size, 4, 1024);
  auto with_modes = [&](BlockMode mode, bool managed) {
    TrainerOptions o;
    o.block_modes.assign(spec.num_layers, mode);
    o.managed = managed;
    o.chunks.chunk_bytes = 32 << 20;
    o.chunks.n_persist = 0;
    o.chunks.n_buffer = 2;
    return ForwardBackwardPeak(spec, o, batches);
  };
  const int64_t none = with_modes(M::kNone, false);
  const int64_t ckpt = with_modes(M::kCkpt, false);
  const int64_t swap = with_modes(M::kSwap, false);
  const int64_t hs = with_modes(M::kHsOffload, false);
  const int64_t managed_ckpt = with_modes(M::kCkpt, true);
  const double gib = 1 << 30;
  std::printf(
      "peak allocated GiB: none %.3f ckpt %.3f swap %.3f hs_offload %.3f "
      "managed(n_persist=0)+ckpt %.3f\n",
      none / gib, ckpt / gib, swap / gib, hs / gib, managed_ckpt / gib);
  EXPECT_LT(ckpt, none * 0.8);
  EXPECT_LT(swap, none * 0.8);
  EXPECT_LT(hs, ckpt);
  EXPECT_LT(managed_ckpt, ckpt);
}

}  // namespace
}  // namespace memplan
