// ChunkManager against plain LibTorch training (all parameters resident, torch::optim::AdamW,
// clip_grad_norm_): bit-exact in fp32 on CPU; bf16 and memory on a GPU when there is one.
#include "agent/chunks/chunk_manager.h"

#include <condition_variable>
#include <functional>
#include <mutex>
#include <thread>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "agent/chunks/cpu_adamw.h"
#include "agent/chunks/torch_sqrt.h"
#include "agent/dist/communicator.h"
#include "agent/dist/counting_communicator.h"
#include "common/chunk_packing.h"
#include "common/optimizer_bytes.h"
#include "agent/core/torch_pch.h"
#include "gtest/gtest.h"

#if __has_include(<c10/cuda/CUDACachingAllocator.h>)
#include <c10/cuda/CUDACachingAllocator.h>
#define MEMPLAN_TEST_CUDA 1
#endif

namespace memplan {
namespace {

namespace F = torch::nn::functional;

// A small language-model-shaped network: embedding, residual tanh blocks with a norm-like scale,
// final scale + LM head (optionally tied to the embedding). One parameter group per stage.
struct ToyModel {
  int64_t vocab = 32;
  int64_t hidden = 16;
  bool tied = false;
  torch::Tensor embed;
  std::vector<torch::Tensor> norm, weight, bias;
  torch::Tensor final_norm;
  torch::Tensor head;  // undefined when tied

  static ToyModel Make(int blocks, bool tied, int64_t hidden, int64_t vocab, uint64_t seed,
                       torch::TensorOptions options) {
    torch::manual_seed(seed);
    ToyModel m;
    m.vocab = vocab;
    m.hidden = hidden;
    m.tied = tied;
    auto param = [&](torch::Tensor t) { return t.to(options).requires_grad_(true); };
    m.embed = param(torch::randn({vocab, hidden}) * 0.5);
    for (int b = 0; b < blocks; ++b) {
      m.norm.push_back(param(1 + 0.1 * torch::randn({hidden})));
      m.weight.push_back(param(torch::randn({hidden, hidden}) / std::sqrt(hidden)));
      m.bias.push_back(param(0.1 * torch::randn({hidden})));
    }
    m.final_norm = param(1 + 0.1 * torch::randn({hidden}));
    if (!tied) m.head = param(torch::randn({vocab, hidden}) * 0.3);
    return m;
  }

  ToyModel Clone() const {
    ToyModel m = *this;
    auto copy = [](const torch::Tensor& t) {
      return t.defined() ? t.detach().clone().requires_grad_(true) : t;
    };
    m.embed = copy(embed);
    for (auto& t : m.norm) t = copy(t);
    for (auto& t : m.weight) t = copy(t);
    for (auto& t : m.bias) t = copy(t);
    m.final_norm = copy(final_norm);
    m.head = copy(head);
    return m;
  }

  int blocks() const { return static_cast<int>(weight.size()); }
  int groups() const { return blocks() + 2; }

  ParamGroups Groups() const {
    ParamGroups groups(this->groups());
    groups[0].push_back({"model.embed_tokens.weight", embed});
    for (int b = 0; b < blocks(); ++b) {
      const std::string prefix = "model.layers." + std::to_string(b) + ".";
      groups[b + 1].push_back({prefix + "input_layernorm.weight", norm[b]});
      groups[b + 1].push_back({prefix + "mlp.weight", weight[b]});
      groups[b + 1].push_back({prefix + "mlp.bias", bias[b]});
    }
    groups.back().push_back({"model.norm.weight", final_norm});
    groups.back().push_back({"lm_head.weight", tied ? embed : head});
    return groups;
  }

  std::map<std::string, torch::Tensor> ByName() const {
    std::map<std::string, torch::Tensor> out;
    for (const auto& group : Groups()) {
      for (const auto& p : group) out[p.name] = p.param;
    }
    return out;
  }

  // Group g's computation; `x` is the detached input (token ids for group 0).
  torch::Tensor RunGroup(int g, const torch::Tensor& x, const torch::Tensor& targets) const {
    if (g == 0) return F::embedding(x, embed);
    if (g <= blocks()) {
      const int b = g - 1;
      return torch::tanh(F::linear(x * norm[b], weight[b], bias[b])) + x;
    }
    torch::Tensor logits = F::linear(x * final_norm, tied ? embed : head);
    return F::cross_entropy(logits.view({-1, vocab}), targets.view({-1}));
  }
};

// Forward and backward group by group, the way the agent's block runner drives ParamResidency:
// each group's backward is a nested autograd::backward between PreBackward and PostBackward.
// `checkpoint` recomputes the blocks in backward instead of keeping their graphs.
torch::Tensor RunMicroBatch(const ToyModel& model, ParamResidency* hooks, bool checkpoint,
                            const torch::Tensor& tokens, const torch::Tensor& targets,
                            const std::function<void(int)>& on_resident = nullptr) {
  const int groups = model.groups();
  std::vector<torch::Tensor> inputs(groups), outputs(groups);
  torch::Tensor h = tokens;
  auto is_checkpointed = [&](int g) { return checkpoint && g > 0 && g < groups - 1; };
  for (int g = 0; g < groups; ++g) {
    if (hooks) hooks->PreForward(g);
    if (on_resident) on_resident(g);
    inputs[g] = g == 0 ? tokens : h.detach().requires_grad_(true);
    if (is_checkpointed(g)) {
      torch::NoGradGuard no_grad;
      outputs[g] = model.RunGroup(g, inputs[g], targets);
    } else {
      outputs[g] = model.RunGroup(g, inputs[g], targets);
    }
    h = outputs[g];
    if (hooks) hooks->PostForward(g);
  }
  torch::Tensor grad;
  for (int g = groups - 1; g >= 0; --g) {
    if (hooks) hooks->PreBackward(g);
    if (on_resident) on_resident(g);
    torch::Tensor y = is_checkpointed(g) ? model.RunGroup(g, inputs[g], targets) : outputs[g];
    if (g == groups - 1) {
      torch::autograd::backward({y});
    } else {
      torch::autograd::backward({y}, {grad});
    }
    if (g > 0) grad = inputs[g].grad();
    if (hooks) hooks->PostBackward(g);
  }
  return outputs.back().detach();
}

struct Batch {
  torch::Tensor tokens, targets;
};

Batch MakeBatch(int64_t vocab, uint64_t seed, torch::Device device) {
  torch::manual_seed(seed);
  return {torch::randint(vocab, {2, 5}, torch::kLong).to(device),
          torch::randint(vocab, {2, 5}, torch::kLong).to(device)};
}

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

ChunkManagerOptions CpuOptions(int n_persist, int n_buffer) {
  ChunkManagerOptions options;
  options.chunk_bytes = 3000;  // about two blocks per chunk with the toy sizes below
  options.n_persist = n_persist;
  options.n_buffer = n_buffer;
  options.host_memory = HostMemoryKind::kPageable;
  options.device = torch::kCPU;
  options.cpu_threads = 2;
  options.adamw = AdamWOptions{1e-2, 0.9, 0.99, 1e-8, 0.05};
  return options;
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

// adamw8bit: every parameter updated as bitsandbytes' AdamW8bit updates one tensor (the CPU
// kernel on the whole tensor, itself checked against a reference in adamw8bit_test.cc), whether
// its chunk is persistent (LibTorch ops on the device) or offloaded (CPU workers, in tasks), with
// accumulation, clipping and overlapped updates; the exported state is the reference's.
struct Q8Case {
  bool bf16;
  int n_persist;
  int n_buffer;
  bool tied;
  double max_grad_norm;
  int grad_accum;
  bool overlap;
  bool stochastic = false;  // [Stochastic rounding] of bf16 parameters
};

std::string Q8CaseName(const ::testing::TestParamInfo<Q8Case>& info) {
  const Q8Case& c = info.param;
  return std::string(c.bf16 ? "bf16" : "fp32") + "_persist" + std::to_string(c.n_persist) +
         "_buf" + std::to_string(c.n_buffer) + (c.tied ? "_tied" : "") +
         (c.max_grad_norm > 0 ? "_clip" : "") + "_accum" + std::to_string(c.grad_accum) +
         (c.overlap ? "_overlap" : "") + (c.stochastic ? "_stochastic" : "");
}

struct Q8State {
  torch::Tensor codes[2];  // exp_avg, exp_avg_sq
  torch::Tensor absmax[2];
};

// The reference: one tensor, blocks from its element 0.
void Q8Reference(const AdamWOptions& o, int64_t step, float grad_scale, torch::Tensor param,
                 const torch::Tensor& grad, Q8State& st, const ParamRounding& rounding = {}) {
  const torch::Tensor g = grad.contiguous();
  const int64_t n = param.numel();
  const AdamWStepScalars s = MakeAdamWStepScalars(o, step);
  if (param.scalar_type() == torch::kBFloat16) {
    AdamW8bitUpdateBf16(s, grad_scale, n, QuantBlocks{},
                        reinterpret_cast<uint16_t*>(param.data_ptr<at::BFloat16>()),
                        reinterpret_cast<const uint16_t*>(g.data_ptr<at::BFloat16>()),
                        st.codes[0].data_ptr<uint8_t>(), st.codes[1].data_ptr<uint8_t>(),
                        st.absmax[0].data_ptr<float>(), st.absmax[1].data_ptr<float>(),
                        &TorchSqrt, rounding);
  } else {
    AdamW8bitUpdate(s, grad_scale, n, QuantBlocks{}, param.data_ptr<float>(), g.data_ptr<float>(),
                    st.codes[0].data_ptr<uint8_t>(), st.codes[1].data_ptr<uint8_t>(),
                    st.absmax[0].data_ptr<float>(), st.absmax[1].data_ptr<float>(), &TorchSqrt);
  }
}

// Hidden 40, vocabulary 50: 1600-element block weights (6.25 absmax blocks), a 2000-element
// embedding; one block's group per chunk, so several chunks of each residency.
ChunkManagerOptions Q8Options(const Q8Case& c) {
  ChunkManagerOptions options = CpuOptions(c.n_persist, c.n_buffer);
  options.optimizer = OptimizerKind::kAdamW8bit;
  options.grad_accum = c.grad_accum;
  options.max_grad_norm = c.overlap ? c.max_grad_norm : -1;
  options.chunk_bytes = c.bf16 ? 4000 : 8000;
  options.stochastic_rounding = c.stochastic;
  options.rounding_seed = 99;
  return options;
}

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

// Ranks as threads of one process: each collective blocks until every rank has called it, then
// every rank computes its result from all inputs (in rank order, so sums are deterministic).
class ThreadHub {
 public:
  explicit ThreadHub(int world) : world_(world), inputs_(world) {}
  std::vector<torch::Tensor> Exchange(int rank, const torch::Tensor& input) {
    std::unique_lock<std::mutex> lock(mu_);
    const int64_t round = round_;
    inputs_[rank] = input.to(torch::kCPU, false, /*copy=*/true);
    if (++arrived_ == world_) {
      result_ = inputs_;
      arrived_ = 0;
      ++round_;
      cv_.notify_all();
    } else {
      cv_.wait(lock, [&] { return round_ != round; });
    }
    return result_;  // no rank can start the next round before this one has read it
  }
  int world() const { return world_; }

 private:
  const int world_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<torch::Tensor> inputs_, result_;
  int arrived_ = 0;
  int64_t round_ = 0;
};

class ThreadCommunicator : public Communicator {
 public:
  // `gather_seconds` > 0: each all-gather reports that device time ([Collective timing]), as a
  // timing backend would; 0: untimed (Gloo).
  ThreadCommunicator(ThreadHub& hub, int rank, double gather_seconds = 0)
      : hub_(hub), rank_(rank), gather_seconds_(gather_seconds) {}
  int rank() const override { return rank_; }
  int world_size() const override { return hub_.world(); }
  torch::Device device() const override { return torch::kCPU; }
  std::unique_ptr<PendingCollective> AllGather(torch::Tensor output,
                                               torch::Tensor input) override {
    output.copy_(torch::cat(hub_.Exchange(rank_, input.reshape({-1}))));
    return std::make_unique<Done>(gather_seconds_);
  }
  std::unique_ptr<PendingCollective> ReduceScatterSum(torch::Tensor output,
                                                      torch::Tensor input) override {
    output.copy_(Sum(hub_.Exchange(rank_, input.reshape({-1})))
                     .narrow(0, rank_ * output.numel(), output.numel())
                     .view(output.sizes()));
    return std::make_unique<Done>();
  }
  std::unique_ptr<PendingCollective> AllReduceSum(torch::Tensor tensor) override {
    tensor.copy_(Sum(hub_.Exchange(rank_, tensor)).view(tensor.sizes()));
    return std::make_unique<Done>();
  }

 private:
  struct Done : PendingCollective {
    explicit Done(double seconds = 0) : seconds(seconds) {}
    absl::Status Wait() override { return absl::OkStatus(); }
    absl::StatusOr<double> DeviceSeconds(bool wait) override {
      if (seconds <= 0) return PendingCollective::DeviceSeconds(wait);
      return std::exchange(seconds, 0.0);  // answered once
    }
    double seconds;
  };
  static torch::Tensor Sum(const std::vector<torch::Tensor>& all) {
    torch::Tensor sum = all[0].clone();
    for (size_t r = 1; r < all.size(); ++r) sum.add_(all[r]);
    return sum;
  }
  ThreadHub& hub_;
  const int rank_;
  const double gather_seconds_;
};

template <typename Fn>
void RunRanks(int world, Fn fn) {
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r) threads.emplace_back([&fn, r] { fn(r); });
  for (std::thread& t : threads) t.join();
}

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

TEST(ChunkManagerTest, ReleasedParametersArePlaceholdersOfTheSameShape) {
  const ToyModel model = ToyModel::Make(4, /*tied=*/true, 16, 32, 3, torch::kFloat32);
  std::map<std::string, std::vector<int64_t>> shapes;
  for (const auto& [name, tensor] : model.ByName()) shapes[name] = tensor.sizes().vec();
  auto manager = ChunkManager::Create(model.Groups(), CpuOptions(/*n_persist=*/1, 1));
  ASSERT_TRUE(manager.ok()) << manager.status();
  const ChunkMemoryStats stats = (*manager)->MemoryStats();
  int placeholders = 0;
  for (const NamedParam& p : (*manager)->ParamOrder()) {
    EXPECT_EQ(p.param.sizes().vec(), shapes.at(p.name)) << p.name;
    EXPECT_EQ(p.param.scalar_type(), torch::kFloat32);
    const bool released = p.param.storage().nbytes() < static_cast<size_t>(p.param.numel() * 4);
    placeholders += released;
  }
  // Everything outside the persistent chunk 0 is released until its group runs.
  EXPECT_GT(placeholders, 0);
  EXPECT_EQ(model.embed.sizes(), torch::IntArrayRef({32, 16}));
  EXPECT_GT(model.embed.storage().nbytes(), 0u) << "chunk 0 is persistent";
  EXPECT_EQ(model.weight[3].sizes(), torch::IntArrayRef({16, 16}));
  EXPECT_LT(model.weight[3].storage().nbytes(), 16u * 16 * 4);
  (*manager)->PreForward(4);
  ASSERT_EQ(stats.n_oversized_buffers, 0);
  EXPECT_EQ(model.weight[3].storage().nbytes(),
            static_cast<size_t>(stats.buffer_device_bytes / stats.n_buffer));
  EXPECT_TRUE(model.weight[3].is_contiguous());
}

TEST(ChunkManagerTest, HostMemoryIsExactlyTheLayout) {
  for (OptimizerKind kind : {OptimizerKind::kAdamW, OptimizerKind::kAdamWBf16States,
                            OptimizerKind::kSgd, OptimizerKind::kAdamW8bit}) {
  for (bool bf16 : {false, true}) {
    if (kind == OptimizerKind::kAdamWBf16States && !bf16) continue;
    for (int grad_accum : {1, 2}) {
      const ToyModel model =
          ToyModel::Make(5, false, 24, 40, 5,
                         torch::TensorOptions().dtype(bf16 ? torch::kBFloat16 : torch::kFloat32));
      ChunkManagerOptions options = CpuOptions(/*n_persist=*/2, /*n_buffer=*/2);
      options.grad_accum = grad_accum;
      options.optimizer = kind;
      auto manager = ChunkManager::Create(model.Groups(), options);
      ASSERT_TRUE(manager.ok()) << manager.status();
      const ChunkMemoryStats stats = (*manager)->MemoryStats();

      // Independent layout of the same parameters.
      std::vector<LayoutParam> params;
      const int64_t elem = bf16 ? 2 : 4;
      const ParamGroups groups = model.Groups();
      for (size_t g = 0; g < groups.size(); ++g) {
        for (const NamedParam& p : groups[g]) {
          params.push_back({p.name, p.param.numel(), elem, static_cast<int>(g)});
        }
      }
      auto layout = ChunkPacking::Build(params, {options.chunk_bytes, options.alignment_bytes});
      ASSERT_TRUE(layout.ok());
      ASSERT_EQ(stats.n_chunks, layout->num_chunks());
      EXPECT_EQ(stats.layout_bytes, layout->TotalBytes());
      int64_t offloaded = 0;
      int64_t absmax_host = 0, absmax_device = 0;  // adamw8bit: one fp32 slot per 256 bytes
      for (int c = 0; c < layout->num_chunks(); ++c) {
        EXPECT_EQ(stats.chunk_bytes[c], layout->chunks()[c].size_bytes);
        if (c >= 2) offloaded += layout->chunks()[c].size_bytes;
        const int64_t n = layout->chunks()[c].size_bytes / elem, g = 256 / elem;
        const int64_t slots = kind == OptimizerKind::kAdamW8bit ? (n - 1 + g - 1) / g + 1 : 0;
        (c >= 2 ? absmax_host : absmax_device) += 2 * 4 * slots;
      }
      EXPECT_EQ(stats.persistent_device_bytes, layout->RangeBytes(0, 2));
      int64_t own_buffers = 0;  // oversized non-persistent chunks have a buffer each
      int oversized = 0;
      for (int c = 2; c < layout->num_chunks(); ++c) {
        if (!layout->chunks()[c].oversized) continue;
        own_buffers += layout->chunks()[c].size_bytes;
        ++oversized;
      }
      EXPECT_EQ(stats.n_oversized_buffers, oversized);
      EXPECT_EQ(stats.buffer_device_bytes,
                stats.n_buffer * layout->MaxRegularChunkBytes() + own_buffers);
      // Per offloaded chunk: parameters + grad staging in the model dtype, then the optimizer's
      // arrays. Spelled out here, independently of common/optimizer_bytes.h.
      int64_t per_elem = 0;
      switch (kind) {
        case OptimizerKind::kAdamW:  // fp32 moments, master and grad sum for bf16
          per_elem = 4 * (2 + (bf16 ? 2 : (grad_accum > 1 ? 1 : 0)));
          break;
        case OptimizerKind::kAdamWBf16States:  // bf16 moments, bf16 grad sum with accumulation
          per_elem = 2 * (2 + (grad_accum > 1 ? 1 : 0));
          break;
        case OptimizerKind::kSgd:  // fp32 master and grad sum for bf16
          per_elem = 4 * (bf16 ? 2 : (grad_accum > 1 ? 1 : 0));
          break;
        case OptimizerKind::kAdamW8bit:  // uint8 codes, grad sum in the model dtype
          per_elem = 2 + (grad_accum > 1 ? elem : 0);
          break;
      }
      const int64_t expected = 2 * offloaded + per_elem * (offloaded / elem) + absmax_host;
      const std::string what = absl::StrCat(std::string(OptimizerName(kind)), " bf16=", bf16,
                                            " accum=", grad_accum);
      EXPECT_EQ(stats.host_pinned_bytes, 0);
      EXPECT_EQ(stats.host_pageable_bytes, expected) << what;
      // The planner's definition (common/optimizer_bytes.h) gives the same bytes, chunk by chunk.
      int64_t planner_host = 0, planner_state = 0;
      for (int c = 0; c < layout->num_chunks(); ++c) {
        const int64_t bytes = layout->chunks()[c].size_bytes;
        if (c < 2) {
          planner_state += PersistentStateBytes(kind, elem, bytes / elem);
        } else {
          planner_host += OffloadedChunkHost(kind, elem, grad_accum, bytes).total();
        }
      }
      EXPECT_EQ(stats.host_pageable_bytes, planner_host) << what;
      EXPECT_EQ(stats.persistent_state_device_bytes, planner_state) << what;
      if (kind == OptimizerKind::kAdamW8bit) {
        EXPECT_EQ(stats.persistent_state_device_bytes,
                  2 * layout->RangeBytes(0, 2) / elem + absmax_device)
            << what;
      }
    }
  }
  }
}

TEST(ChunkManagerTest, PinnedWithoutCudaFallsBackAndSaysWhy) {
  if (torch::cuda::is_available()) GTEST_SKIP() << "pinned memory works here";
  const ToyModel model = ToyModel::Make(2, false, 16, 32, 4, torch::kFloat32);
  ChunkManagerOptions options = CpuOptions(0, 2);
  options.host_memory = HostMemoryKind::kPinned;
  options.pageable_fallback = true;
  auto manager = ChunkManager::Create(model.Groups(), options);
  ASSERT_TRUE(manager.ok()) << manager.status();
  const ChunkMemoryStats stats = (*manager)->MemoryStats();
  EXPECT_TRUE(stats.pinned_fallback);
  EXPECT_NE(stats.pinned_fallback_reason.find("CUDA"), std::string::npos)
      << stats.pinned_fallback_reason;
  EXPECT_EQ(stats.host_pinned_bytes, 0);
  EXPECT_GT(stats.host_pageable_bytes, 0);

  const ToyModel model2 = ToyModel::Make(2, false, 16, 32, 4, torch::kFloat32);
  options.pageable_fallback = false;
  auto refused = ChunkManager::Create(model2.Groups(), options);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(refused.status().message().find("pinned"), absl::string_view::npos);
}

// Profile-only (on-demand profiling): the same forward and backward as the unmanaged model,
// parameters alone in host memory, every gradient dropped once final, no optimizer.
TEST(ChunkManagerTest, ProfileOnlyMovesParametersAndDropsGradients) {
  for (bool tied : {false, true}) {
    SCOPED_TRACE(tied ? "tied" : "untied");
    const ToyModel reference = ToyModel::Make(5, tied, 24, 40, 9, torch::kFloat32);
    const ToyModel managed = reference.Clone();
    ChunkManagerOptions options = CpuOptions(/*n_persist=*/1, /*n_buffer=*/2);
    options.profile_only = true;
    auto manager = ChunkManager::Create(managed.Groups(), options);
    ASSERT_TRUE(manager.ok()) << manager.status();
    const ChunkMemoryStats stats = (*manager)->MemoryStats();
    EXPECT_EQ(stats.persistent_state_device_bytes, 0);
    EXPECT_EQ(stats.host_pageable_bytes, stats.layout_bytes - stats.persistent_device_bytes)
        << "only the parameters of offloaded chunks live on the host";

    const Batch batch = MakeBatch(40, 3, torch::kCPU);
    const torch::Tensor want = RunMicroBatch(reference, nullptr, false, batch.tokens, batch.targets);
    // Every group's gradients exist until its PostBackward and are gone after it.
    int checked = 0;
    const ParamGroups managed_groups = managed.Groups();
    const torch::Tensor got = RunMicroBatch(managed, manager->get(), false, batch.tokens,
                                            batch.targets, [&](int g) {
                                              if (g + 1 >= managed.groups()) return;
                                              for (const NamedParam& p : managed_groups[g + 1]) {
                                                if (p.param.is_same(managed.embed)) continue;
                                                EXPECT_FALSE(p.param.grad().defined()) << p.name;
                                                ++checked;
                                              }
                                            });
    EXPECT_GT(checked, 0);
    EXPECT_TRUE(torch::equal(got, want)) << "same loss as the unmanaged model";
    for (const NamedParam& p : managed_groups[0]) EXPECT_FALSE(p.param.grad().defined());
    EXPECT_TRUE((*manager)->Grads().empty());
    EXPECT_TRUE((*manager)->OptimizerState().empty());
    const absl::Status step = (*manager)->Step(0);
    EXPECT_EQ(step.code(), absl::StatusCode::kFailedPrecondition) << step;
    // Parameters are unchanged: the host copies are the reference's values.
    const std::vector<NamedParam> values = (*manager)->Params();
    const ParamGroups ref_groups = reference.Groups();
    std::map<std::string, torch::Tensor> ref;
    for (const auto& group : ref_groups) {
      for (const NamedParam& p : group) ref[p.name] = p.param;
    }
    for (const NamedParam& v : values) EXPECT_TRUE(torch::equal(v.param, ref.at(v.name))) << v.name;
  }
}

TEST(ChunkManagerTest, RaisesBuffersWhenAGroupNeedsMoreChunksAtOnce) {
  // The tied head needs the embedding's chunk and its own: two buffers at least.
  const ToyModel model = ToyModel::Make(4, /*tied=*/true, 16, 32, 6, torch::kFloat32);
  auto manager = ChunkManager::Create(model.Groups(), CpuOptions(0, 1));
  ASSERT_TRUE(manager.ok()) << manager.status();
  EXPECT_GE((*manager)->MinBuffers(), 2);
  EXPECT_EQ((*manager)->MemoryStats().n_buffer, (*manager)->MinBuffers());
}

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

TEST(ChunkManagerTest, UploadStatsCountEachChunkUploadOnce) {
  const ToyModel model = ToyModel::Make(4, /*tied=*/false, 16, 32, 7, torch::kFloat32);
  // One buffer per offloaded chunk: nothing is evicted, so a forward uploads each chunk once.
  auto probe = ChunkManager::Create(model.Groups(), CpuOptions(/*n_persist=*/1, 1));
  ASSERT_TRUE(probe.ok()) << probe.status();
  const int offloaded = (*probe)->MemoryStats().n_chunks - 1;
  ASSERT_GT(offloaded, 1);
  probe->reset();
  const ToyModel fresh = ToyModel::Make(4, /*tied=*/false, 16, 32, 7, torch::kFloat32);
  auto manager = ChunkManager::Create(fresh.Groups(), CpuOptions(/*n_persist=*/1, offloaded));
  ASSERT_TRUE(manager.ok()) << manager.status();
  const ChunkMemoryStats stats = (*manager)->MemoryStats();
  EXPECT_EQ((*manager)->UploadStats().uploads, 0) << "creating the manager uploads nothing";
  const int groups = static_cast<int>(fresh.Groups().size());
  for (int g = 0; g < groups; ++g) (*manager)->PreForward(g);
  int64_t expected_bytes = 0;
  for (int c = 1; c < stats.n_chunks; ++c) expected_bytes += stats.chunk_bytes[c];
  const ChunkUploadStats uploads = (*manager)->UploadStats();
  EXPECT_EQ(uploads.uploads, offloaded);
  EXPECT_EQ(uploads.bytes, expected_bytes);
  EXPECT_EQ(uploads.seconds, 0) << "no CUDA events on the CPU";
  (*manager)->ResetUploadStats();
  EXPECT_EQ((*manager)->UploadStats().uploads, 0);
  EXPECT_EQ((*manager)->UploadStats().bytes, 0);
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
