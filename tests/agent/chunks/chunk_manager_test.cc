// ChunkManager, the facade: option validation, and bf16 training and memory on a GPU when there
// is one (the layers' own tests: chunk_{set,pager,collectives,optimizer,state_io}_test.cc).
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

#if __has_include(<c10/cuda/CUDACachingAllocator.h>)
#include <c10/cuda/CUDACachingAllocator.h>
#define MEMPLAN_TEST_CUDA 1
#endif

namespace memplan {
namespace {

using namespace chunk_test;  // NOLINT(build/namespaces): the shared toy model and helpers

TEST(ChunkManagerTest, RejectsBadOptions) {
  const ToyModel model = ToyModel::Make(1, false, 8, 8, 7, torch::kFloat32);
  ChunkManagerOptions options = CpuOptions(0, 0);
  auto status = ChunkManager::Create(model.Groups(), options).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(status.message().find("n_buffer"), absl::string_view::npos);
  options = CpuOptions(0, 1);
  options.optimizer = OptimizerKind::kAdamWBf16States;  // needs bf16 parameters
  status = ChunkManager::Create(model.Groups(), options).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(status.message().find("--optimizer adamw_bf16"), absl::string_view::npos) << status;
  EXPECT_NE(status.message().find("--dtype bf16"), absl::string_view::npos) << status;
  options = CpuOptions(0, 1);
  options.alignment_bytes = 6;
  EXPECT_EQ(ChunkManager::Create(model.Groups(), options).status().code(),
            absl::StatusCode::kInvalidArgument);
  // adamw8bit's absmax slots need parameters on 256-byte boundaries.
  options = CpuOptions(0, 1);
  options.optimizer = OptimizerKind::kAdamW8bit;
  options.alignment_bytes = 128;
  status = ChunkManager::Create(model.Groups(), options).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(status.message().find("alignment_bytes"), absl::string_view::npos) << status;
  options = CpuOptions(0, 1);
  options.max_grad_copy_groups = 0;
  status = ChunkManager::Create(model.Groups(), options).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(status.message().find("max_grad_copy_groups: must be >= 1, got 0"),
            absl::string_view::npos)
      << status;
}

#ifdef MEMPLAN_TEST_CUDA
int64_t PeakAllocatedBytes(int device) {
  return c10::cuda::CUDACachingAllocator::getDeviceStats(device)
      .allocated_bytes[static_cast<size_t>(c10::CachingAllocator::StatType::AGGREGATE)]
      .peak;
}
#endif

TEST(ChunkManagerGpuTest, Bf16TrainingTracksTheFp32Reference) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  const torch::Device gpu(torch::kCUDA, 0);
  const int kSteps = 4;
  const ToyModel reference =
      ToyModel::Make(4, true, 64, 128, 21, torch::TensorOptions().device(gpu));
  const auto bf16 = torch::TensorOptions().device(gpu).dtype(torch::kBFloat16);
  // The same bf16 model twice: every chunk offloaded (CPU AdamW) and every chunk persistent
  // (fused GPU AdamW).
  const ToyModel offloaded = ToyModel::Make(4, true, 64, 128, 21, bf16);
  const ToyModel persistent = ToyModel::Make(4, true, 64, 128, 21, bf16);
  // And persistent with 4 KiB chunks: the 8 192-element embedding and every matrix larger than
  // 2 048 elements are updated in slices ([Sliced grad copy]); the result must be bit for bit the
  // unsliced update's.
  const ToyModel sliced = ToyModel::Make(4, true, 64, 128, 21, bf16);
  ChunkManagerOptions options = CpuOptions(0, 2);
  options.adamw.lr = 1e-3;
  options.chunk_bytes = 40000;
  options.device = gpu;
  options.host_memory = HostMemoryKind::kPinned;
  options.max_grad_norm = 0;
  auto cpu_manager = ChunkManager::Create(offloaded.Groups(), options);
  ASSERT_TRUE(cpu_manager.ok()) << cpu_manager.status();
  EXPECT_GT((*cpu_manager)->MemoryStats().host_pinned_bytes, 0);
  options.n_persist = 1000;
  auto gpu_manager = ChunkManager::Create(persistent.Groups(), options);
  ASSERT_TRUE(gpu_manager.ok()) << gpu_manager.status();
  ChunkManagerOptions small = options;
  small.chunk_bytes = 4096;
  auto sliced_manager = ChunkManager::Create(sliced.Groups(), small);
  ASSERT_TRUE(sliced_manager.ok()) << sliced_manager.status();

  std::map<std::string, torch::Tensor> ref_by_name = reference.ByName();
  std::vector<torch::Tensor> ref_params;
  for (const NamedParam& p : (*cpu_manager)->ParamOrder()) {
    ref_params.push_back(ref_by_name.at(p.name));
  }
  const AdamWOptions& a = options.adamw;
  torch::optim::AdamW optimizer(ref_params, torch::optim::AdamWOptions(a.lr)
                                                .betas({a.beta1, a.beta2})
                                                .eps(a.eps)
                                                .weight_decay(a.weight_decay));
  for (int step = 0; step < kSteps; ++step) {
    const Batch batch = MakeBatch(128, 500 + step, gpu);
    const float ref_loss =
        RunMicroBatch(reference, nullptr, false, batch.tokens, batch.targets).item<float>();
    for (auto* manager : {&*cpu_manager, &*gpu_manager}) {
      const ToyModel& model = manager == &*cpu_manager ? offloaded : persistent;
      const float loss =
          RunMicroBatch(model, manager->get(), false, batch.tokens, batch.targets).item<float>();
      // bf16 logits: a relative error of a few 2^-8.
      EXPECT_NEAR(loss, ref_loss, 0.02 * std::abs(ref_loss)) << "step " << step;
      ASSERT_TRUE((*manager)->Step(0).ok());
    }
    RunMicroBatch(sliced, sliced_manager->get(), false, batch.tokens, batch.targets);
    ASSERT_TRUE((*sliced_manager)->Step(0).ok());
    optimizer.step();
    optimizer.zero_grad();
  }
  // Adam moves a weight by about lr per step whatever the gradient, so bf16 gradients can change
  // each weight by at most ~2 lr per step relative to fp32, plus the final bf16 rounding.
  const auto cpu_params = (*cpu_manager)->Params();
  const auto gpu_params = (*gpu_manager)->Params();
  std::map<std::string, torch::Tensor> sliced_by_name;
  for (const NamedParam& p : (*sliced_manager)->Params()) sliced_by_name[p.name] = p.param;
  for (const NamedParam& p : gpu_params) {
    EXPECT_TRUE(torch::equal(sliced_by_name.at(p.name).cpu(), p.param.cpu())) << p.name;
  }
  std::map<std::string, torch::Tensor> cpu_state, gpu_state;
  for (const NamedParam& s : (*cpu_manager)->OptimizerState()) cpu_state[s.name] = s.param;
  for (const NamedParam& s : (*gpu_manager)->OptimizerState()) gpu_state[s.name] = s.param;
  for (size_t i = 0; i < cpu_params.size(); ++i) {
    const std::string& name = cpu_params[i].name;
    torch::Tensor ref = ref_by_name.at(name).detach().cpu();
    for (const auto* params : {&cpu_params, &gpu_params}) {
      torch::Tensor value = (*params)[i].param.to(torch::kFloat32);
      ASSERT_FALSE(torch::isnan(value).any().item<bool>()) << name;
      torch::Tensor bound = 2 * a.lr * kSteps + ref.abs() * (1.0 / 128);
      EXPECT_TRUE(((value - ref).abs() <= bound).all().item<bool>())
          << name << " max diff " << (value - ref).abs().max().item<float>();
    }
    // CPU AdamW on the host and fused AdamW on the device agree on the fp32 masters.
    const torch::Tensor diff = cpu_state.at(name + ".master") - gpu_state.at(name + ".master");
    EXPECT_LT(diff.abs().mean().item<double>(), a.lr / 10) << name;
  }
}

// The persistent chunks' device update with an fp32 master ([Batched widening], [Shared step
// tensors], [Whole-chunk master copy] in chunk_optimizer_step.cc) is, bit for bit, at::_fused_adamw_
// per parameter on its own fp32 master with its grad widened by .to(kFloat32), then the master
// rounded into the parameter: with whole chunks and with 4 KiB chunks (updates in slices).
TEST(ChunkManagerGpuTest, PersistentMasterUpdateIsPerParameterFusedAdamWExactly) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  const torch::Device gpu(torch::kCUDA, 0);
  const auto bf16 = torch::TensorOptions().device(gpu).dtype(torch::kBFloat16);
  for (const int64_t chunk_bytes : {int64_t{40000}, int64_t{4096}}) {
    SCOPED_TRACE(absl::StrCat("chunk_bytes ", chunk_bytes));
    const ToyModel model = ToyModel::Make(3, true, 64, 128, 23, bf16);
    ChunkManagerOptions options = CpuOptions(0, 2);
    options.adamw.lr = 1e-3;
    options.adamw.weight_decay = 0.01;
    options.chunk_bytes = chunk_bytes;
    options.device = gpu;
    options.max_grad_norm = 0;
    options.n_persist = 1000;
    auto manager = ChunkManager::Create(model.Groups(), options);
    ASSERT_TRUE(manager.ok()) << manager.status();
    std::map<std::string, torch::Tensor> master, exp_avg, exp_avg_sq;
    for (const NamedParam& p : (*manager)->ParamOrder()) {
      master[p.name] = p.param.detach().to(torch::kFloat32);
      exp_avg[p.name] = torch::zeros_like(master[p.name]);
      exp_avg_sq[p.name] = torch::zeros_like(master[p.name]);
    }
    const AdamWOptions& a = options.adamw;
    for (int step = 1; step <= 3; ++step) {
      const Batch batch = MakeBatch(128, 700 + step, gpu);
      RunMicroBatch(model, manager->get(), false, batch.tokens, batch.targets);
      std::map<std::string, torch::Tensor> grads;
      for (const NamedParam& p : (*manager)->ParamOrder()) {
        ASSERT_TRUE(p.param.grad().defined()) << p.name;
        grads[p.name] = p.param.grad().clone();
      }
      ASSERT_TRUE((*manager)->Step(0).ok());
      const torch::Tensor step_tensor =
          torch::full({}, static_cast<double>(step), bf16.dtype(torch::kFloat32));
      for (const auto& [name, grad] : grads) {
        at::_fused_adamw_({master[name]}, {grad.to(torch::kFloat32)}, {exp_avg[name]},
                          {exp_avg_sq[name]}, {}, {step_tensor}, a.lr, a.beta1, a.beta2,
                          a.weight_decay, a.eps, false, false);
      }
    }
    std::map<std::string, torch::Tensor> state;
    for (const NamedParam& s : (*manager)->OptimizerState()) state[s.name] = s.param;
    for (const NamedParam& p : (*manager)->ParamOrder()) {
      EXPECT_TRUE(torch::equal(p.param.detach().cpu(), master[p.name].to(torch::kBFloat16).cpu()))
          << p.name;
      EXPECT_TRUE(torch::equal(state.at(p.name + ".master").cpu(), master[p.name].cpu())) << p.name;
      EXPECT_TRUE(torch::equal(state.at(p.name + ".exp_avg_sq").cpu(), exp_avg_sq[p.name].cpu()))
          << p.name;
    }
  }
}

TEST(ChunkManagerGpuTest, OffloadingEverythingLowersThePeak) {
#ifndef MEMPLAN_TEST_CUDA
  GTEST_SKIP() << "built without CUDA headers";
#else
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  const torch::Device gpu(torch::kCUDA, 0);
  auto peak_for = [&](int n_persist) -> int64_t {
    const ToyModel model =
        ToyModel::Make(8, false, 1024, 2048, 31, torch::TensorOptions().dtype(torch::kFloat32));
    ChunkManagerOptions options = CpuOptions(n_persist, 2);
    options.chunk_bytes = int64_t{8} << 20;  // two blocks per chunk
    options.device = gpu;
    options.host_memory = HostMemoryKind::kPinned;
    options.max_grad_norm = 0;
    auto manager = ChunkManager::Create(model.Groups(), options);
    EXPECT_TRUE(manager.ok()) << manager.status();
    torch::cuda::synchronize();
    c10::cuda::CUDACachingAllocator::resetPeakStats(0);
    for (int step = 0; step < 2; ++step) {
      const Batch batch = MakeBatch(2048, 700 + step, gpu);
      RunMicroBatch(model, manager->get(), false, batch.tokens, batch.targets);
      EXPECT_TRUE((*manager)->Step(0).ok());
    }
    torch::cuda::synchronize();
    return PeakAllocatedBytes(0);
  };
  const int64_t all_persistent = peak_for(1000);
  const int64_t all_offloaded = peak_for(0);
  std::printf("peak allocated: all persistent %lld B, all offloaded %lld B\n",
              static_cast<long long>(all_persistent), static_cast<long long>(all_offloaded));
  EXPECT_LT(all_offloaded, all_persistent);
#endif
}

}  // namespace
}  // namespace memplan
