// Shared by the ChunkManager tests (one file per layer): a toy language model run through the
// manager's hooks, the optimizer test cases' helpers and ranks as threads of one process.
#pragma once

#include <condition_variable>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "agent/chunks/chunk_manager.h"
#include "agent/chunks/cpu_adamw.h"
#include "agent/chunks/torch_sqrt.h"
#include "agent/core/torch_pch.h"
#include "agent/dist/communicator.h"
#include "common/optimizer_bytes.h"
#include "gtest/gtest.h"

namespace memplan::chunk_test {

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
inline torch::Tensor RunMicroBatch(const ToyModel& model, ParamResidency* hooks, bool checkpoint,
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

inline Batch MakeBatch(int64_t vocab, uint64_t seed, torch::Device device) {
  torch::manual_seed(seed);
  return {torch::randint(vocab, {2, 5}, torch::kLong).to(device),
          torch::randint(vocab, {2, 5}, torch::kLong).to(device)};
}

inline ChunkManagerOptions CpuOptions(int n_persist, int n_buffer) {
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

inline std::string Q8CaseName(const ::testing::TestParamInfo<Q8Case>& info) {
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
inline void Q8Reference(const AdamWOptions& o, int64_t step, float grad_scale, torch::Tensor param,
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
inline ChunkManagerOptions Q8Options(const Q8Case& c) {
  ChunkManagerOptions options = CpuOptions(c.n_persist, c.n_buffer);
  options.optimizer = OptimizerKind::kAdamW8bit;
  options.grad_accum = c.grad_accum;
  options.max_grad_norm = c.overlap ? c.max_grad_norm : -1;
  options.chunk_bytes = c.bf16 ? 4000 : 8000;
  options.stochastic_rounding = c.stochastic;
  options.rounding_seed = 99;
  return options;
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
inline void RunRanks(int world, Fn fn) {
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r) threads.emplace_back([&fn, r] { fn(r); });
  for (std::thread& t : threads) t.join();
}

}  // namespace memplan::chunk_test
