// ChunkOptimizer (through the ChunkManager): training against plain LibTorch (all parameters
// resident, torch::optim::AdamW / SGD, clip_grad_norm_) bit for bit on the CPU, every optimizer,
// persistent and offloaded chunks, accumulation, clipping and overlapped updates.
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
#include "agent/core/foreach_groups.h"
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

struct ExactCase {
  int n_persist;
  int n_buffer;
  bool checkpoint;
  bool tied;
  double max_grad_norm;  // 0 = no clipping
  int grad_accum;
  bool overlap;  // options.max_grad_norm = the Step() value (CPU updates start in backward)
};

std::string CaseName(const ::testing::TestParamInfo<ExactCase>& info) {
  const ExactCase& c = info.param;
  return "persist" + std::to_string(c.n_persist) + "_buf" + std::to_string(c.n_buffer) +
         (c.checkpoint ? "_ckpt" : "_keep") + (c.tied ? "_tied" : "") +
         (c.max_grad_norm > 0 ? "_clip" : "") + "_accum" + std::to_string(c.grad_accum) +
         (c.overlap ? "_overlap" : "");
}

class ChunkManagerExactTest : public ::testing::TestWithParam<ExactCase> {};

TEST_P(ChunkManagerExactTest, TrainsBitIdenticallyToUnmanagedTorch) {
  const ExactCase c = GetParam();
  const ToyModel reference = ToyModel::Make(4, c.tied, 16, 32, 42, torch::kFloat32);
  const ToyModel managed = reference.Clone();
  ChunkManagerOptions options = CpuOptions(c.n_persist, c.n_buffer);
  options.grad_accum = c.grad_accum;
  options.max_grad_norm = c.overlap ? c.max_grad_norm : -1;
  auto manager_or = ChunkManager::Create(managed.Groups(), options);
  ASSERT_TRUE(manager_or.ok()) << manager_or.status();
  ChunkManager& manager = **manager_or;
  ASSERT_GE(manager.MemoryStats().n_chunks, 4);

  // The reference walks parameters in the manager's canonical order (clip_grad_norm_ sums the
  // per-parameter norms in that order).
  std::map<std::string, torch::Tensor> ref_by_name = reference.ByName();
  std::vector<torch::Tensor> ref_params;
  for (const NamedParam& p : manager.ParamOrder()) ref_params.push_back(ref_by_name.at(p.name));
  const AdamWOptions& a = options.adamw;
  torch::optim::AdamW optimizer(ref_params, torch::optim::AdamWOptions(a.lr)
                                                .betas({a.beta1, a.beta2})
                                                .eps(a.eps)
                                                .weight_decay(a.weight_decay));
  const ParamGroups managed_groups = managed.Groups();
  const ParamGroups reference_groups = reference.Groups();
  auto expect_resident = [&](int g) {
    for (size_t k = 0; k < managed_groups[g].size(); ++k) {
      ASSERT_TRUE(torch::equal(managed_groups[g][k].param, reference_groups[g][k].param))
          << managed_groups[g][k].name << " is not materialised with its current value";
    }
  };

  for (int step = 0; step < 3; ++step) {
    for (int micro = 0; micro < c.grad_accum; ++micro) {
      const Batch batch = MakeBatch(32, 1000 + step * 10 + micro, torch::kCPU);
      torch::Tensor ref_loss =
          RunMicroBatch(reference, nullptr, c.checkpoint, batch.tokens, batch.targets);
      torch::Tensor loss = RunMicroBatch(managed, &manager, c.checkpoint, batch.tokens,
                                         batch.targets, expect_resident);
      ASSERT_TRUE(torch::equal(loss, ref_loss)) << "step " << step << " micro " << micro;
    }
    if (!c.overlap || c.max_grad_norm > 0) {
      // Grads are still unconsumed when no update started during backward.
      const auto grads = manager.Grads();
      ASSERT_EQ(grads.size(), ref_params.size());
      for (const NamedParam& g : grads) {
        ASSERT_TRUE(torch::equal(g.param, ref_by_name.at(g.name).grad())) << g.name;
      }
    }
    double ref_norm = 0;
    if (c.max_grad_norm > 0) {
      ref_norm = torch::nn::utils::clip_grad_norm_(ref_params, c.max_grad_norm);
    }
    optimizer.step();
    optimizer.zero_grad();
    ASSERT_TRUE(manager.Step(c.max_grad_norm).ok());
    if (c.max_grad_norm > 0) {
      EXPECT_EQ(manager.LastGradNorm(), ref_norm);
      EXPECT_GT(ref_norm, c.max_grad_norm) << "the case should actually clip";
    }
    for (const NamedParam& p : manager.Params()) {
      ASSERT_TRUE(torch::equal(p.param, ref_by_name.at(p.name).detach()))
          << p.name << " after step " << step;
    }
  }
  // [Grad staging slots]: with blocks offloaded, their grads were produced in the slots (autograd
  // accumulating into the zeroed slot views) and, bit for bit, torch's above.
  const ChunkMemoryStats stats = manager.MemoryStats();
  if (c.n_persist == 0) {
    EXPECT_GT(stats.grad_slot_device_bytes, 0);
    EXPECT_GT(stats.grads_from_slots, 0);
  }
  if (c.n_persist >= stats.n_chunks) {
    EXPECT_EQ(stats.grad_slot_device_bytes, 0);
    EXPECT_EQ(stats.grads_from_slots, 0);
  }
  // Optimizer state matches torch's too.
  std::map<std::string, torch::Tensor> state;
  for (const NamedParam& s : manager.OptimizerState()) state[s.name] = s.param;
  EXPECT_EQ(state.at("step").item<int64_t>(), 3);
  for (const NamedParam& p : manager.ParamOrder()) {
    auto& ref_state = static_cast<torch::optim::AdamWParamState&>(
        *optimizer.state().at(ref_by_name.at(p.name).unsafeGetTensorImpl()));
    EXPECT_TRUE(torch::equal(state.at(p.name + ".exp_avg"), ref_state.exp_avg())) << p.name;
    EXPECT_TRUE(torch::equal(state.at(p.name + ".exp_avg_sq"), ref_state.exp_avg_sq()));
  }
}

INSTANTIATE_TEST_SUITE_P(
    Residency, ChunkManagerExactTest,
    ::testing::Values(
        // n_persist, n_buffer, checkpoint, tied, max_grad_norm, grad_accum, overlap
        ExactCase{0, 1, false, false, 0, 1, false}, ExactCase{0, 2, false, false, 0, 1, true},
        ExactCase{0, 1, true, false, 0, 1, true}, ExactCase{0, 2, true, true, 0, 1, false},
        ExactCase{0, 1, false, true, 0, 1, true}, ExactCase{2, 1, false, true, 0, 1, true},
        ExactCase{2, 2, true, false, 0.05, 1, false}, ExactCase{0, 2, false, true, 0.05, 1, true},
        ExactCase{0, 1, false, false, 0.05, 2, false}, ExactCase{0, 2, true, true, 0, 3, true},
        ExactCase{1, 2, false, true, 0.05, 2, true}, ExactCase{99, 1, false, true, 0.05, 1, true},
        ExactCase{99, 2, true, false, 0, 2, true}),
    CaseName);

// adamw_bf16 and sgd against a torch reference on resident parameters. Bit-exact on CPU:
//   adamw_bf16: bf16 parameters, bf16 .grad accumulated by autograd, clip_grad_norm_, then
//     at::_fused_adamw_ (torch.optim.AdamW(fused=True)) on every parameter with a grad;
//   sgd, fp32: torch::optim::SGD after clip_grad_norm_;
//   sgd, bf16 (one micro-batch): the fp32 master the manager keeps, updated with torch's SGD ops
//     from the fp32 copy of the bf16 grad scaled by the (bf16) clip coefficient, rounded to bf16.
struct OptimizerCase {
  OptimizerKind kind;
  bool bf16;
  int n_persist;
  int n_buffer;
  bool tied;
  double max_grad_norm;
  int grad_accum;
  bool overlap;
};

std::string OptimizerCaseName(const ::testing::TestParamInfo<OptimizerCase>& info) {
  const OptimizerCase& c = info.param;
  return std::string(OptimizerName(c.kind)) + (c.bf16 ? "_bf16" : "_fp32") + "_persist" +
         std::to_string(c.n_persist) + "_buf" + std::to_string(c.n_buffer) +
         (c.tied ? "_tied" : "") + (c.max_grad_norm > 0 ? "_clip" : "") + "_accum" +
         std::to_string(c.grad_accum) + (c.overlap ? "_overlap" : "");
}

class ChunkManagerOptimizerTest : public ::testing::TestWithParam<OptimizerCase> {};

TEST_P(ChunkManagerOptimizerTest, MatchesTorchOnResidentParameters) {
  const OptimizerCase c = GetParam();
  const auto dtype = c.bf16 ? torch::kBFloat16 : torch::kFloat32;
  const ToyModel reference = ToyModel::Make(4, c.tied, 16, 32, 42, dtype);
  const ToyModel managed = reference.Clone();
  ChunkManagerOptions options = CpuOptions(c.n_persist, c.n_buffer);
  options.optimizer = c.kind;
  options.grad_accum = c.grad_accum;
  options.max_grad_norm = c.overlap ? c.max_grad_norm : -1;
  if (c.bf16) options.chunk_bytes = 1500;  // the same number of chunks at half the bytes
  auto manager_or = ChunkManager::Create(managed.Groups(), options);
  ASSERT_TRUE(manager_or.ok()) << manager_or.status();
  ChunkManager& manager = **manager_or;
  ASSERT_GE(manager.MemoryStats().n_chunks, 4);
  ASSERT_LT(manager.MemoryStats().n_persist, manager.MemoryStats().n_chunks)
      << "some chunk must be offloaded";

  std::map<std::string, torch::Tensor> ref_by_name = reference.ByName();
  std::vector<torch::Tensor> ref_params;
  std::vector<std::string> names;
  for (const NamedParam& p : manager.ParamOrder()) {
    ref_params.push_back(ref_by_name.at(p.name));
    names.push_back(p.name);
  }
  const AdamWOptions& a = options.adamw;
  // Reference optimizer state.
  std::vector<torch::Tensor> exp_avg, exp_avg_sq, master;
  for (const torch::Tensor& p : ref_params) {
    exp_avg.push_back(torch::zeros_like(p));
    exp_avg_sq.push_back(torch::zeros_like(p));
    master.push_back(p.detach().to(torch::kFloat32));
  }
  torch::optim::SGD sgd(ref_params, torch::optim::SGDOptions(a.lr).weight_decay(a.weight_decay));
  int64_t ref_step = 0;

  for (int step = 0; step < 2; ++step) {
    for (int micro = 0; micro < c.grad_accum; ++micro) {
      const Batch batch = MakeBatch(32, 2000 + step * 10 + micro, torch::kCPU);
      torch::Tensor ref_loss =
          RunMicroBatch(reference, nullptr, false, batch.tokens, batch.targets);
      torch::Tensor loss = RunMicroBatch(managed, &manager, false, batch.tokens, batch.targets);
      ASSERT_TRUE(torch::equal(loss, ref_loss)) << "step " << step << " micro " << micro;
    }
    if (c.kind == OptimizerKind::kAdamWBf16States && (!c.overlap || c.max_grad_norm > 0)) {
      // Offloaded grads are summed in bf16 like autograd's .grad.
      for (const NamedParam& g : manager.Grads()) {
        ASSERT_EQ(g.param.scalar_type(), dtype) << g.name;
        ASSERT_TRUE(torch::equal(g.param, ref_by_name.at(g.name).grad())) << g.name;
      }
    }
    // Reference update.
    ++ref_step;
    {
      torch::NoGradGuard no_grad;
      torch::Tensor coef;
      if (c.max_grad_norm > 0) {
        std::vector<torch::Tensor> norms;
        for (const torch::Tensor& p : ref_params) norms.push_back(p.grad().norm(2.0));
        const torch::Tensor total = torch::stack(norms).norm(2.0);
        coef = torch::clamp(c.max_grad_norm / (total + 1e-6), std::nullopt, 1.0);
        EXPECT_LT(coef.item<double>(), 1.0) << "the case should actually clip";
      }
      if (c.kind == OptimizerKind::kAdamWBf16States) {
        if (coef.defined()) {
          for (const torch::Tensor& p : ref_params) p.grad().mul_(coef);
        }
        std::vector<torch::Tensor> ps, gs, steps;
        for (const torch::Tensor& p : ref_params) {
          ps.push_back(p.detach());
          gs.push_back(p.grad());
          steps.push_back(torch::full({}, static_cast<double>(ref_step), torch::kFloat32));
        }
        at::_fused_adamw_(ps, gs, exp_avg, exp_avg_sq, {}, steps, a.lr, a.beta1, a.beta2,
                          a.weight_decay, a.eps, false, false);
      } else if (!c.bf16) {
        if (coef.defined()) {
          for (const torch::Tensor& p : ref_params) p.grad().mul_(coef);
        }
        sgd.step();
      } else {
        for (size_t i = 0; i < ref_params.size(); ++i) {
          torch::Tensor d = ref_params[i].grad().to(torch::kFloat32);
          if (coef.defined()) d.mul_(coef);
          d.add_(master[i], a.weight_decay);
          master[i].add_(d, -1 * a.lr);
          ref_params[i].detach().copy_(master[i]);
        }
      }
      for (const torch::Tensor& p : ref_params) p.mutable_grad().reset();
    }
    ASSERT_TRUE(manager.Step(c.max_grad_norm).ok());
    for (const NamedParam& p : manager.Params()) {
      ASSERT_EQ(p.param.scalar_type(), dtype);
      ASSERT_TRUE(torch::equal(p.param, ref_by_name.at(p.name).detach()))
          << p.name << " after step " << step << ", max abs diff "
          << (p.param.to(torch::kFloat32) - ref_by_name.at(p.name).detach().to(torch::kFloat32))
                 .abs()
                 .max()
                 .item<double>();
    }
  }
  std::map<std::string, torch::Tensor> state;
  for (const NamedParam& s : manager.OptimizerState()) state[s.name] = s.param;
  for (size_t i = 0; i < names.size(); ++i) {
    if (c.kind == OptimizerKind::kAdamWBf16States) {
      ASSERT_EQ(state.at(names[i] + ".exp_avg").scalar_type(), torch::kBFloat16);
      EXPECT_TRUE(torch::equal(state.at(names[i] + ".exp_avg"), exp_avg[i])) << names[i];
      EXPECT_TRUE(torch::equal(state.at(names[i] + ".exp_avg_sq"), exp_avg_sq[i])) << names[i];
      EXPECT_EQ(state.count(names[i] + ".master"), 0u);
    } else {
      EXPECT_EQ(state.count(names[i] + ".exp_avg"), 0u);
      EXPECT_EQ(state.count(names[i] + ".master"), c.bf16 ? 1u : 0u);
      if (c.bf16) {
        EXPECT_TRUE(torch::equal(state.at(names[i] + ".master"), master[i]));
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    Optimizers, ChunkManagerOptimizerTest,
    ::testing::Values(
        // kind, bf16, n_persist, n_buffer, tied, max_grad_norm, grad_accum, overlap
        OptimizerCase{OptimizerKind::kAdamWBf16States, true, 0, 1, false, 0, 1, true},
        OptimizerCase{OptimizerKind::kAdamWBf16States, true, 2, 2, true, 0, 1, false},
        OptimizerCase{OptimizerKind::kAdamWBf16States, true, 2, 1, false, 0.05, 1, false},
        OptimizerCase{OptimizerKind::kAdamWBf16States, true, 1, 2, true, 0.05, 2, true},
        OptimizerCase{OptimizerKind::kAdamWBf16States, true, 2, 2, false, 0, 2, true},
        OptimizerCase{OptimizerKind::kAdamWBf16States, true, 0, 2, true, 0.05, 2, false},
        OptimizerCase{OptimizerKind::kSgd, false, 0, 1, false, 0, 1, true},
        OptimizerCase{OptimizerKind::kSgd, false, 2, 2, true, 0.05, 1, false},
        OptimizerCase{OptimizerKind::kSgd, false, 1, 2, true, 0.05, 2, true},
        OptimizerCase{OptimizerKind::kSgd, false, 2, 1, false, 0, 2, true},
        OptimizerCase{OptimizerKind::kSgd, true, 2, 2, true, 0, 1, true},
        OptimizerCase{OptimizerKind::kSgd, true, 1, 1, false, 0.05, 1, false}),
    OptimizerCaseName);

class ChunkManagerAdamW8bitTest : public ::testing::TestWithParam<Q8Case> {};

TEST_P(ChunkManagerAdamW8bitTest, EqualsThePerTensorReference) {
  const Q8Case c = GetParam();
  const auto dtype = c.bf16 ? torch::kBFloat16 : torch::kFloat32;
  const ToyModel reference = ToyModel::Make(4, c.tied, 40, 50, 42, dtype);
  const ToyModel managed = reference.Clone();
  const ChunkManagerOptions options = Q8Options(c);
  auto manager_or = ChunkManager::Create(managed.Groups(), options);
  ASSERT_TRUE(manager_or.ok()) << manager_or.status();
  ChunkManager& manager = **manager_or;
  ASSERT_GE(manager.MemoryStats().n_chunks, 4);
  ASSERT_LT(manager.MemoryStats().n_persist, manager.MemoryStats().n_chunks);

  std::map<std::string, torch::Tensor> ref_by_name = reference.ByName();
  std::vector<torch::Tensor> ref_params;
  std::vector<std::string> names;
  std::vector<Q8State> states;
  for (const NamedParam& p : manager.ParamOrder()) {
    ref_params.push_back(ref_by_name.at(p.name));
    names.push_back(p.name);
    const int64_t blocks = (p.param.numel() + 255) / 256;
    Q8State st;
    for (int k = 0; k < 2; ++k) {
      st.codes[k] = torch::zeros({p.param.numel()}, torch::kUInt8);
      st.absmax[k] = torch::zeros({blocks});
    }
    states.push_back(st);
  }
  for (int step = 1; step <= 3; ++step) {
    for (int micro = 0; micro < c.grad_accum; ++micro) {
      const Batch batch = MakeBatch(50, 3000 + step * 10 + micro, torch::kCPU);
      torch::Tensor ref_loss =
          RunMicroBatch(reference, nullptr, false, batch.tokens, batch.targets);
      torch::Tensor loss = RunMicroBatch(managed, &manager, false, batch.tokens, batch.targets);
      ASSERT_TRUE(torch::equal(loss, ref_loss)) << "step " << step << " micro " << micro;
    }
    {
      torch::NoGradGuard no_grad;
      float grad_scale = 1.0f;
      if (c.max_grad_norm > 0) {
        std::vector<torch::Tensor> norms;
        for (const torch::Tensor& p : ref_params) norms.push_back(p.grad().norm(2.0));
        const torch::Tensor total = torch::stack(norms).norm(2.0);
        grad_scale =
            torch::clamp(c.max_grad_norm / (total + 1e-6), std::nullopt, 1.0).item<float>();
        EXPECT_LT(grad_scale, 1.0f) << "the case should actually clip";
      }
      for (size_t i = 0; i < ref_params.size(); ++i) {
        // Stochastic: keyed by the parameter's place in ParamOrder() and its update count, so a
        // whole-tensor update rounds each element as the manager's pieces do.
        Q8Reference(options.adamw, step, grad_scale, ref_params[i].detach(), ref_params[i].grad(),
                    states[i],
                    MakeParamRounding(c.stochastic, options.rounding_seed,
                                      static_cast<int64_t>(i), step, 0));
        ref_params[i].mutable_grad().reset();
      }
    }
    ASSERT_TRUE(manager.Step(c.max_grad_norm).ok());
    for (const NamedParam& p : manager.Params()) {
      ASSERT_EQ(p.param.scalar_type(), dtype);
      ASSERT_TRUE(torch::equal(p.param, ref_by_name.at(p.name).detach()))
          << p.name << " after step " << step << ", max abs diff "
          << (p.param.to(torch::kFloat32) - ref_by_name.at(p.name).detach().to(torch::kFloat32))
                 .abs()
                 .max()
                 .item<double>();
    }
  }
  std::map<std::string, torch::Tensor> state;
  for (const NamedParam& s : manager.OptimizerState()) state[s.name] = s.param;
  EXPECT_EQ(state.at("step").item<int64_t>(), 3);
  for (size_t i = 0; i < names.size(); ++i) {
    const char* moment[2] = {".exp_avg", ".exp_avg_sq"};
    for (int k = 0; k < 2; ++k) {
      const torch::Tensor& codes = state.at(names[i] + moment[k] + ".q8");
      ASSERT_EQ(codes.scalar_type(), torch::kUInt8);
      EXPECT_EQ(codes.sizes(), ref_by_name.at(names[i]).sizes());
      EXPECT_TRUE(torch::equal(codes.reshape({-1}), states[i].codes[k])) << names[i] << k;
      EXPECT_TRUE(torch::equal(state.at(names[i] + moment[k] + ".absmax"), states[i].absmax[k]))
          << names[i] << k;
    }
    EXPECT_EQ(state.count(names[i] + ".exp_avg"), 0u);
    EXPECT_EQ(state.count(names[i] + ".master"), 0u);
  }
}

INSTANTIATE_TEST_SUITE_P(
    AdamW8bit, ChunkManagerAdamW8bitTest,
    ::testing::Values(
        // bf16, n_persist, n_buffer, tied, max_grad_norm, grad_accum, overlap
        Q8Case{false, 0, 1, false, 0, 1, true}, Q8Case{false, 2, 2, true, 0.05, 2, false},
        Q8Case{false, 3, 2, false, 0, 2, true}, Q8Case{true, 1, 2, true, 0, 2, true},
        Q8Case{true, 2, 1, false, 0.05, 1, false}, Q8Case{true, 0, 2, true, 0.05, 2, false},
        Q8Case{true, 1, 2, true, 0.05, 2, true, true},
        Q8Case{true, 2, 1, false, 0, 1, false, true}),
    Q8CaseName);

TEST(ChunkManagerTest, StepRefusesToClipAfterOverlappedUpdates) {
  const ToyModel model = ToyModel::Make(3, false, 16, 32, 8, torch::kFloat32);
  ChunkManagerOptions options = CpuOptions(0, 2);
  options.max_grad_norm = 0;  // promise: no clipping
  auto manager = ChunkManager::Create(model.Groups(), options);
  ASSERT_TRUE(manager.ok());
  const Batch batch = MakeBatch(32, 9, torch::kCPU);
  RunMicroBatch(model, manager->get(), false, batch.tokens, batch.targets);
  const absl::Status status = (*manager)->Step(1.0);
  EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(status.message().find("max_grad_norm"), absl::string_view::npos);
}

// Two runs of the same training that must agree: the same losses bit for bit (and training
// moved the loss), the same final parameters and optimizer state (FinalState()).
std::map<std::string, torch::Tensor> FinalState(ChunkManager& manager) {
  std::map<std::string, torch::Tensor> finals;
  for (const NamedParam& p : manager.Params()) finals[p.name] = p.param.clone();
  for (const NamedParam& s : manager.OptimizerState()) finals[s.name] = s.param.clone();
  return finals;
}

void ExpectRunsEqual(const std::vector<std::vector<float>>& losses,
                     const std::vector<std::map<std::string, torch::Tensor>>& finals,
                     const std::string& label) {
  EXPECT_EQ(losses[0], losses[1]) << label;
  EXPECT_NE(losses[1].front(), losses[1].back()) << label << ": training moved the loss";
  ASSERT_EQ(finals[0].size(), finals[1].size()) << label;
  for (const auto& [name, value] : finals[0]) {
    EXPECT_TRUE(torch::equal(value, finals[1].at(name))) << label << " " << name;
  }
}

// [Deferred CPU updates] Five steps of the toy model, Step() deferring and Step() waiting for
// every CPU update: the losses of every micro-batch and the final parameters and state must be
// equal bit for bit. No Params() between steps (it would wait for everything), so the next forward
// really meets updates in flight. `max_grad_norm` > 0 clips (Step() queues the updates); 0
// promises no clipping (the updates start in backward and Step() leaves them running).
void ExpectDeferredTrainsAsWaiting(OptimizerKind kind, double max_grad_norm, int grad_accum) {
  const std::string label = absl::StrCat(std::string(OptimizerName(kind)), " clip ",
                                         max_grad_norm, " grad_accum ", grad_accum);
  std::vector<std::vector<float>> losses(2);
  std::vector<std::map<std::string, torch::Tensor>> finals(2);
  for (const bool defer : {false, true}) {
    const ToyModel model = ToyModel::Make(6, true, 64, 48, 77, torch::kFloat32);
    ChunkManagerOptions options = CpuOptions(0, 1);
    options.chunk_bytes = 40000;
    options.optimizer = kind;
    options.grad_accum = grad_accum;
    if (max_grad_norm == 0) options.max_grad_norm = 0;
    options.defer_step_updates = defer;
    auto manager = ChunkManager::Create(model.Groups(), options);
    ASSERT_TRUE(manager.ok()) << manager.status();
    for (int step = 0; step < 5; ++step) {
      for (int micro = 0; micro < grad_accum; ++micro) {
        const Batch batch = MakeBatch(48, 500 + 10 * step + micro, torch::kCPU);
        losses[defer].push_back(
            RunMicroBatch(model, manager->get(), false, batch.tokens, batch.targets)
                .item<float>());
      }
      if (max_grad_norm == 0) {
        EXPECT_GT((*manager)->UpdatesStartedBeforeStep(), 0) << label << ": none started early";
      }
      ASSERT_TRUE((*manager)->Step(max_grad_norm).ok()) << label;
      if (max_grad_norm > 0) {
        EXPECT_GT((*manager)->LastGradNorm(), max_grad_norm) << label << ": nothing was clipped";
      }
    }
    finals[defer] = FinalState(**manager);
  }
  ExpectRunsEqual(losses, finals, label);
}

// [Sliced grad copy] for SGD with an fp32 master: a parameter larger than a regular chunk (the
// 512-element embedding with 400-byte chunks: 200 elements a slice) is updated slice by slice,
// bit for bit as in one piece (1500-byte chunks), clipped and with weight decay.
TEST(ChunkManagerTest, SlicedSgdMasterUpdateEqualsTheWholeOne) {
  const auto bf16 = torch::TensorOptions().dtype(torch::kBFloat16);
  std::vector<std::map<std::string, torch::Tensor>> finals;
  for (const int64_t chunk_bytes : {int64_t{1500}, int64_t{400}}) {
    const ToyModel model = ToyModel::Make(2, true, 16, 32, 17, bf16);
    ChunkManagerOptions options = CpuOptions(1000, 1);
    options.optimizer = OptimizerKind::kSgd;
    options.adamw.weight_decay = 0.01;
    options.chunk_bytes = chunk_bytes;
    options.max_grad_norm = 0.05;
    auto manager = ChunkManager::Create(model.Groups(), options);
    ASSERT_TRUE(manager.ok()) << manager.status();
    for (int step = 0; step < 3; ++step) {
      const Batch batch = MakeBatch(32, 900 + step, torch::kCPU);
      RunMicroBatch(model, manager->get(), false, batch.tokens, batch.targets);
      ASSERT_TRUE((*manager)->Step(options.max_grad_norm).ok());
    }
    std::map<std::string, torch::Tensor> values;
    for (const NamedParam& p : (*manager)->Params()) values[p.name] = p.param.clone();
    for (const NamedParam& s : (*manager)->OptimizerState()) values[s.name] = s.param.clone();
    finals.push_back(std::move(values));
  }
  ASSERT_EQ(finals[0].size(), finals[1].size());
  EXPECT_TRUE(finals[0].count("model.embed_tokens.weight.master"));
  for (const auto& [name, value] : finals[0]) {
    EXPECT_TRUE(torch::equal(value, finals[1].at(name))) << name;
  }
}

// With clipping Step() queues the offloaded chunks' CPU updates in chunk order and returns.
// Fails when the pager's per-chunk wait is removed.
TEST(ChunkManagerTest, DeferredClippedUpdatesTrainExactlyAsWaitingOnes) {
  for (const OptimizerKind kind : {OptimizerKind::kAdamW, OptimizerKind::kSgd}) {
    ExpectDeferredTrainsAsWaiting(kind, 0.05, 1);
  }
}

// Without clipping the updates start in backward and Step() leaves the unfinished ones running,
// by the same rule; with two micro-batches the next step's first one meets them. Fails when the
// pager's per-chunk wait is removed.
TEST(ChunkManagerTest, DeferredUnclippedUpdatesTrainExactlyAsWaitingOnes) {
  for (const OptimizerKind kind : {OptimizerKind::kAdamW, OptimizerKind::kSgd}) {
    for (const int grad_accum : {1, 2}) ExpectDeferredTrainsAsWaiting(kind, 0, grad_accum);
  }
}

// [Speculative clipped updates] Thresholds per step that clip some steps and not others, and a
// ZeroGrad() after a backward that speculated: the speculating manager trains bit for bit as the
// one that holds every offloaded update until Step(), and every path ran (speculation that stood,
// speculation restored and redone, the restore of ZeroGrad()). Fails when a restore is skipped
// or a redo counts the step twice.
void ExpectSpeculationTrainsAsHolding(OptimizerKind kind, torch::ScalarType dtype) {
  const std::string label =
      absl::StrCat(std::string(OptimizerName(kind)), " ", c10::toString(dtype));
  // 1e6 clips nothing, 1e-3 everything.
  const std::vector<double> max_norms = {1e6, 1e6, 1e-3, 1e6, 1e6, 1e6, 1e-3, 1e6};
  std::vector<std::vector<float>> losses(2);
  std::vector<std::map<std::string, torch::Tensor>> finals(2);
  std::vector<ChunkManager::SpeculationCounts> counts(2);
  for (const bool speculate : {false, true}) {
    // hidden 256: a block's weight has 65 536 elements, two of the pieces a speculative update
    // goes through (UpdateIntoCopies, cpu_adamw.h).
    constexpr int64_t kHidden = 256;
    static_assert(kHidden * kHidden == 2 * kCopyPieceElems);
    const ToyModel model =
        ToyModel::Make(6, true, kHidden, 48, 77, torch::TensorOptions().dtype(dtype));
    ChunkManagerOptions options = CpuOptions(1, 2);
    options.chunk_bytes = 524288;  // a multiple of adamw8bit's 256-byte alignment
    options.optimizer = kind;
    options.max_grad_norm = 1.0;
    options.speculative_clip = speculate;
    auto manager = ChunkManager::Create(model.Groups(), options);
    ASSERT_TRUE(manager.ok()) << label << ": " << manager.status();
    ASSERT_GT((*manager)->MemoryStats().n_chunks, 1) << label << ": nothing offloaded";
    for (size_t step = 0; step < max_norms.size(); ++step) {
      if (step == 4) {
        // Step 3 did not clip: this backward speculates, and ZeroGrad() takes it back.
        const Batch dropped = MakeBatch(48, 700, torch::kCPU);
        RunMicroBatch(model, manager->get(), false, dropped.tokens, dropped.targets);
        EXPECT_EQ((*manager)->UpdatesStartedBeforeStep() > 0, speculate) << label;
        (*manager)->ZeroGrad();
      }
      const Batch batch = MakeBatch(48, 500 + 10 * step, torch::kCPU);
      losses[speculate].push_back(
          RunMicroBatch(model, manager->get(), false, batch.tokens, batch.targets).item<float>());
      ASSERT_TRUE((*manager)->Step(max_norms[step]).ok()) << label << " step " << step;
    }
    counts[speculate] = (*manager)->Speculation();
    finals[speculate] = FinalState(**manager);
  }
  // Step 0 never speculates; 1 stands; 2 clips (restored, redone); 3 follows a clipped step;
  // the dropped backward is restored; 4 and 5 stand; 6 clips; 7 follows it.
  EXPECT_EQ(counts[0].speculated, 0) << label;
  EXPECT_EQ(counts[1].speculated, 5) << label;
  EXPECT_EQ(counts[1].restored, 3) << label;
  ExpectRunsEqual(losses, finals, label);
}

TEST(ChunkManagerTest, SpeculativeClippedUpdatesTrainExactlyAsHeldOnes) {
  for (const OptimizerKind kind :
       {OptimizerKind::kAdamW, OptimizerKind::kSgd, OptimizerKind::kAdamW8bit}) {
    ExpectSpeculationTrainsAsHolding(kind, torch::kFloat32);
  }
  for (const OptimizerKind kind : {OptimizerKind::kAdamW, OptimizerKind::kAdamWBf16States,
                                   OptimizerKind::kAdamW8bit, OptimizerKind::kSgd}) {
    ExpectSpeculationTrainsAsHolding(kind, torch::kBFloat16);
  }
}

// [Device updates of offloaded chunks] on the CPU device (the same path without streams): a
// manager that updates a share of its offloaded chunks "on the device" (the persistent chunks'
// fused update on copies of the chunk's arrays) trains bit for bit as one whose CPU workers update
// them all, over steps that clip and steps that do not, one and two micro-batches; and the device
// did update chunks (it counts their elements). Fails when a device-updated chunk's values are
// not copied back, or its step count is not taken.
void ExpectDeviceUpdatesTrainAsCpuOnes(OptimizerKind kind, torch::ScalarType dtype, int grad_accum,
                                       double share, bool speculate = false) {
  const std::string label =
      absl::StrCat(std::string(OptimizerName(kind)), " ", c10::toString(dtype), " grad_accum ",
                   grad_accum, " share ", share, speculate ? " speculating" : "");
  const std::vector<double> max_norms = {1e6, 1e-3, 1e-3, 1e6, 1e-3};
  std::vector<std::vector<float>> losses(2);
  std::vector<std::map<std::string, torch::Tensor>> finals(2);
  int64_t on_device = 0;
  for (const bool device : {false, true}) {
    const ToyModel model = ToyModel::Make(6, true, 64, 48, 77, torch::TensorOptions().dtype(dtype));
    ChunkManagerOptions options = CpuOptions(1, 1);
    options.chunk_bytes = 16384;  // a multiple of adamw8bit's 256-byte alignment
    options.optimizer = kind;
    options.grad_accum = grad_accum;
    options.max_grad_norm = 1.0;
    options.device_update_share = device ? share : 0;
    // [Speculative clipped updates] beside them: steps 1 and 4 speculate on the CPU and clip,
    // their redone copies become the live arrays the next held steps copy to the device.
    options.speculative_clip = speculate;
    auto manager = ChunkManager::Create(model.Groups(), options);
    ASSERT_TRUE(manager.ok()) << label << ": " << manager.status();
    ASSERT_GT((*manager)->MemoryStats().n_chunks, 3) << label;
    for (size_t step = 0; step < max_norms.size(); ++step) {
      for (int micro = 0; micro < grad_accum; ++micro) {
        const Batch batch = MakeBatch(48, 900 + 10 * static_cast<int>(step) + micro, torch::kCPU);
        losses[device].push_back(
            RunMicroBatch(model, manager->get(), false, batch.tokens, batch.targets).item<float>());
      }
      ASSERT_TRUE((*manager)->Step(max_norms[step]).ok()) << label << " step " << step;
      if (device) on_device += (*manager)->TakeCpuPassStats().device_updated_elems;
    }
    if (speculate) {
      EXPECT_EQ((*manager)->Speculation().speculated, 2) << label;
    }
    finals[device] = FinalState(**manager);
  }
  EXPECT_GT(on_device, 0) << label << ": nothing was updated on the device";
  ExpectRunsEqual(losses, finals, label);
}

TEST(ChunkManagerTest, DeviceUpdatesOfOffloadedChunksTrainAsCpuOnes) {
  for (const OptimizerKind kind : {OptimizerKind::kAdamWBf16States, OptimizerKind::kAdamW8bit}) {
    for (const int grad_accum : {1, 2}) {
      ExpectDeviceUpdatesTrainAsCpuOnes(kind, torch::kBFloat16, grad_accum, 0.5);
    }
  }
  ExpectDeviceUpdatesTrainAsCpuOnes(OptimizerKind::kAdamW8bit, torch::kFloat32, 1, 1.0);
  for (const OptimizerKind kind : {OptimizerKind::kAdamWBf16States, OptimizerKind::kAdamW8bit}) {
    ExpectDeviceUpdatesTrainAsCpuOnes(kind, torch::kBFloat16, 1, 0.5, /*speculate=*/true);
  }
}

// agent/core/foreach_groups.h, on tensors of three dtypes interleaved (and one not contiguous):
// the foreach norms and the foreach scaling equal the per-tensor ops bit for bit, each in its
// tensor's place, whatever the dtype of the coefficient.
TEST(ForeachGroupsTest, NormsAndScalingEqualThePerTensorOps) {
  torch::NoGradGuard no_grad;
  torch::manual_seed(5);
  const std::vector<torch::ScalarType> dtypes = {torch::kFloat32, torch::kBFloat16, torch::kFloat32,
                                                 torch::kFloat64, torch::kBFloat16};
  std::vector<torch::Tensor> tensors;
  for (size_t i = 0; i < dtypes.size(); ++i) {
    tensors.push_back(
        (torch::randn({static_cast<int64_t>(37 + 11 * i)}) * (1.0 + i)).to(dtypes[i]));
  }
  tensors.push_back(torch::randn({8, 6}).t());  // fp32, not contiguous
  ASSERT_EQ(IndicesByDeviceAndDtype(tensors).size(), 3u);
  const std::vector<torch::Tensor> norms = ForeachNorms(tensors);
  ASSERT_EQ(norms.size(), tensors.size());
  for (size_t i = 0; i < tensors.size(); ++i) {
    EXPECT_EQ(norms[i].scalar_type(), tensors[i].scalar_type()) << i;
    EXPECT_TRUE(torch::equal(norms[i], tensors[i].norm(2.0))) << i;
  }
  // 0.3 is no bf16 value: on the CPU a bf16 tensor times the fp32 coefficient is not the tensor
  // times its bf16 rounding, so a coefficient converted to the grads' dtype would show here.
  const torch::Tensor coef32 = torch::full({}, 0.3, torch::kFloat32);
  ASSERT_FALSE(torch::equal(tensors[1] * coef32, tensors[1] * coef32.to(torch::kBFloat16)));
  for (const torch::Tensor& coef : {coef32, coef32.to(torch::kBFloat16)}) {
    std::vector<torch::Tensor> scaled, expected;
    for (const torch::Tensor& t : tensors) {
      scaled.push_back(t.clone());
      expected.push_back(t.clone().mul_(coef));
    }
    ForeachMulInPlace(scaled, coef);
    for (size_t i = 0; i < tensors.size(); ++i) {
      EXPECT_EQ(scaled[i].scalar_type(), tensors[i].scalar_type()) << i;
      EXPECT_TRUE(torch::equal(scaled[i], expected[i])) << i << " times a " << coef.dtype();
    }
  }
}

// Step()'s clipping of the persistent grads (one _foreach_norm and one _foreach_mul_ per device
// and dtype) against clip_grad_norm_ done parameter by parameter: every chunk persistent, the
// reference a second manager on a copy of the model whose grads the test clips one by one (each
// grad's norm, the norm of the stacked norms, grad.mul_(coef)) before an unclipped Step(). The
// reported norm and the parameters after each step are equal bit for bit, for the optimizers that
// clip the model-dtype grad: adamw (fp32: the CPU kernel's product is mul_'s), sgd (fp32) and
// adamw_bf16 (bf16 parameters, grads and coefficient).
struct ClipCase {
  OptimizerKind kind;
  bool bf16;
};

std::string ClipCaseName(const ::testing::TestParamInfo<ClipCase>& info) {
  return std::string(OptimizerName(info.param.kind)) + (info.param.bf16 ? "_bf16" : "_fp32");
}

class ChunkManagerClipTest : public ::testing::TestWithParam<ClipCase> {};

TEST_P(ChunkManagerClipTest, ForeachClipEqualsPerParameterClip) {
  const ClipCase c = GetParam();
  const ToyModel model =
      ToyModel::Make(4, true, 16, 32, 21, c.bf16 ? torch::kBFloat16 : torch::kFloat32);
  const ToyModel reference = model.Clone();
  ChunkManagerOptions options = CpuOptions(99, 1);
  options.optimizer = c.kind;
  if (c.bf16) options.chunk_bytes = 1500;  // the same number of chunks at half the bytes
  auto managed = ChunkManager::Create(model.Groups(), options);
  auto unclipped = ChunkManager::Create(reference.Groups(), options);
  ASSERT_TRUE(managed.ok()) << managed.status();
  ASSERT_TRUE(unclipped.ok()) << unclipped.status();
  const ChunkMemoryStats stats = (*managed)->MemoryStats();
  ASSERT_GE(stats.n_chunks, 4);
  ASSERT_EQ(stats.n_persist, stats.n_chunks);
  const std::map<std::string, torch::Tensor> ref_by_name = reference.ByName();
  constexpr double kMaxNorm = 0.05;
  for (int step = 0; step < 3; ++step) {
    const Batch batch = MakeBatch(32, 700 + step, torch::kCPU);
    RunMicroBatch(model, managed->get(), false, batch.tokens, batch.targets);
    RunMicroBatch(reference, unclipped->get(), false, batch.tokens, batch.targets);
    double ref_norm = 0;
    {
      torch::NoGradGuard no_grad;
      std::vector<torch::Tensor> grads, norms;
      for (const NamedParam& p : (*unclipped)->ParamOrder()) {
        grads.push_back(ref_by_name.at(p.name).grad());
        ASSERT_TRUE(grads.back().defined()) << p.name;
        norms.push_back(grads.back().norm(2.0));
      }
      const torch::Tensor total = torch::stack(norms).norm(2.0);
      const torch::Tensor coef = torch::clamp(kMaxNorm / (total + 1e-6), std::nullopt, 1.0);
      ASSERT_LT(coef.item<double>(), 1.0) << "the case should actually clip";
      for (torch::Tensor& g : grads) g.mul_(coef);
      ref_norm = total.item<double>();
    }
    ASSERT_TRUE((*unclipped)->Step(0).ok());
    ASSERT_TRUE((*managed)->Step(kMaxNorm).ok());
    EXPECT_EQ((*managed)->LastGradNorm(), ref_norm) << "step " << step;
    const std::vector<NamedParam> expected = (*unclipped)->Params();
    const std::vector<NamedParam> actual = (*managed)->Params();
    ASSERT_EQ(actual.size(), expected.size());
    for (size_t i = 0; i < actual.size(); ++i) {
      ASSERT_EQ(actual[i].name, expected[i].name);
      ASSERT_TRUE(torch::equal(actual[i].param, expected[i].param))
          << actual[i].name << " after step " << step;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Optimizers, ChunkManagerClipTest,
                         ::testing::Values(ClipCase{OptimizerKind::kAdamW, false},
                                           ClipCase{OptimizerKind::kSgd, false},
                                           ClipCase{OptimizerKind::kAdamWBf16States, true}),
                         ClipCaseName);

TEST(ChunkManagerTest, Bf16ModelKeepsFp32MasterWeights) {
  const auto bf16 = torch::TensorOptions().dtype(torch::kBFloat16);
  const ToyModel model = ToyModel::Make(4, false, 16, 32, 12, bf16);
  const ToyModel reference = ToyModel::Make(4, false, 16, 32, 12, torch::kFloat32);
  ChunkManagerOptions options = CpuOptions(1, 2);
  auto manager = ChunkManager::Create(model.Groups(), options);
  ASSERT_TRUE(manager.ok()) << manager.status();
  for (int step = 0; step < 3; ++step) {
    const Batch batch = MakeBatch(32, 300 + step, torch::kCPU);
    RunMicroBatch(model, manager->get(), false, batch.tokens, batch.targets);
    ASSERT_TRUE((*manager)->Step(0).ok());
  }
  std::map<std::string, torch::Tensor> state;
  for (const NamedParam& s : (*manager)->OptimizerState()) state[s.name] = s.param;
  for (const NamedParam& p : (*manager)->Params()) {
    ASSERT_EQ(p.param.scalar_type(), torch::kBFloat16);
    const torch::Tensor master = state.at(p.name + ".master");
    ASSERT_EQ(master.scalar_type(), torch::kFloat32);
    // The device copy is the master rounded to bf16, and training moved the weights.
    EXPECT_TRUE(torch::equal(p.param, master.to(torch::kBFloat16))) << p.name;
    EXPECT_FALSE(torch::equal(master, reference.ByName().at(p.name).detach())) << p.name;
  }
}

}  // namespace
}  // namespace memplan
