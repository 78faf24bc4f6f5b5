#include "agent/model/moe.h"

#include <c10/core/CPUAllocator.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "agent/model/llama_model.h"
#include "common/param_shapes.h"

namespace memplan {
namespace {

const bool kSingleThread = [] {
  torch::set_num_threads(1);
  return true;
}();

ModelSpec MoeSpec(const std::string& family, int64_t experts = 4, int64_t top_k = 2) {
  ModelSpec s;
  s.name = "tiny-" + family;
  s.family = family;
  s.hidden_size = 32;
  s.num_layers = 4;
  s.num_heads = 4;
  s.num_kv_heads = 2;
  s.intermediate_size = 48;
  s.vocab_size = 96;
  s.rope_theta = 10000.0;
  s.rms_norm_eps = 1e-5;
  s.num_experts = experts;
  s.num_experts_per_tok = top_k;
  s.moe_intermediate_size = family == "mixtral" ? s.intermediate_size : 24;
  s.norm_topk_prob = family == "mixtral";
  if (family == "qwen3_moe") {
    s.qk_norm = true;
    s.head_dim = 16;
  }
  return s;
}

MoeParams RandomParams(const ModelSpec& spec, uint64_t seed) {
  MoeParams p = MoeParams::Shaped(spec, 0);
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  for (size_t i = 0; i < p.tensors.size(); ++i) {
    p.tensors[i] = (torch::randn(p.shapes[i], gen) * 0.2).requires_grad_(true);
  }
  return p;
}

// The sparse MLP computed densely: every expert on every token, each token's output the sum of
// its top-k experts' outputs times their (renormalised) softmax weights.
torch::Tensor DenseReference(const ModelSpec& spec, const MoeParams& p, const torch::Tensor& y) {
  const torch::Tensor x = y.reshape({-1, spec.hidden_size});
  const torch::Tensor probs = torch::softmax(x.mm(p.router().t()), -1);
  auto [w, idx] = probs.topk(spec.num_experts_per_tok, -1);
  if (spec.norm_topk_prob) w = w / w.sum(-1, true);
  // gates[t, e]: the weight of expert e for token t, zero when not chosen.
  const torch::Tensor gates = torch::zeros_like(probs).scatter(1, idx, w);
  torch::Tensor out = torch::zeros_like(x);
  for (int64_t e = 0; e < spec.num_experts; ++e) {
    const torch::Tensor h =
        torch::silu(x.mm(p.expert(e, 0).t())) * x.mm(p.expert(e, 1).t());
    out = out + h.mm(p.expert(e, 2).t()) * gates.select(1, e).unsqueeze(1);
  }
  return out.view(y.sizes());
}

struct RoutingCase {
  std::string family;
  int64_t top_k;
};

class MoeRoutingTest : public ::testing::TestWithParam<RoutingCase> {};

TEST_P(MoeRoutingTest, MatchesDenseReferenceInValueAndGradient) {
  const ModelSpec spec = MoeSpec(GetParam().family, 4, GetParam().top_k);
  const MoeParams p = RandomParams(spec, 11);
  auto gen = at::make_generator<at::CPUGeneratorImpl>(12);
  const torch::Tensor y = torch::randn({2, 7, spec.hidden_size}, gen).requires_grad_(true);

  const torch::Tensor got = MoeMlp(spec, p, y, nullptr);
  ASSERT_EQ(got.sizes(), y.sizes());
  const torch::Tensor want = DenseReference(spec, p, y);
  EXPECT_LT((got - want).abs().max().item<double>(), 1e-5 * want.abs().max().item<double>());

  const torch::Tensor probe = torch::randn(y.sizes(), gen);
  auto grads = [&](const torch::Tensor& out) {
    std::vector<torch::Tensor> inputs = {y};
    for (const torch::Tensor& t : p.tensors) inputs.push_back(t);
    return torch::autograd::grad({(out * probe).sum()}, inputs);
  };
  const std::vector<torch::Tensor> g_got = grads(got);
  const std::vector<torch::Tensor> g_want = grads(want);
  ASSERT_EQ(g_got.size(), g_want.size());
  for (size_t i = 0; i < g_got.size(); ++i) {
    ASSERT_TRUE(g_got[i].defined()) << i;
    const double scale = std::max(g_want[i].abs().max().item<double>(), 1e-12);
    EXPECT_LT((g_got[i] - g_want[i]).abs().max().item<double>(), 1e-5 * scale) << i;
  }
}

INSTANTIATE_TEST_SUITE_P(Families, MoeRoutingTest,
                         ::testing::Values(RoutingCase{"qwen3_moe", 2}, RoutingCase{"mixtral", 2},
                                           RoutingCase{"qwen3_moe", 3}),
                         [](const auto& info) {
                           return info.param.family + "_top" + std::to_string(info.param.top_k);
                         });

TEST(MoeMlpTest, AnExpertNoTokenReachesGetsAZeroGradient) {
  const ModelSpec spec = MoeSpec("qwen3_moe");
  MoeParams p = RandomParams(spec, 3);
  {
    torch::NoGradGuard no_grad;
    p.tensors[0][3].fill_(-5.0);  // expert 3's logit: -5 * sum(x) with x > 0, never in the top 2
  }
  auto gen = at::make_generator<at::CPUGeneratorImpl>(4);
  const torch::Tensor y = torch::rand({1, 6, spec.hidden_size}, gen) + 0.1;
  MoeMlp(spec, p, y, nullptr).sum().backward();
  for (int which = 0; which < 3; ++which) {
    const torch::Tensor g = p.expert(3, which).grad();
    ASSERT_TRUE(g.defined());
    EXPECT_EQ(g.abs().max().item<float>(), 0.0f);
    EXPECT_GT(p.expert(0, which).grad().abs().max().item<float>(), 0.0f);
  }
}

// [Grouped experts] The grouped path and the loop on the same parameters and input: the output
// and the gradients of the input and of every parameter, for an output probe.
struct PathResult {
  torch::Tensor out;
  std::vector<torch::Tensor> grads;  // input, then p.tensors
};

PathResult RunPath(const ModelSpec& spec, const MoeParams& p, const torch::Tensor& y,
                   const torch::Tensor& probe, MoeExperts experts) {
  const torch::Tensor input = y.detach().clone().requires_grad_(true);
  PathResult r;
  r.out = MoeMlp(spec, p, input, nullptr, experts);
  std::vector<torch::Tensor> inputs = {input};
  for (const torch::Tensor& t : p.tensors) inputs.push_back(t);
  r.grads = torch::autograd::grad({(r.out * probe).sum()}, inputs);
  return r;
}

// Expert `starved`'s router row at -5 * sum(x) with x > 0: it is never in the top k.
void Starve(MoeParams& p, int64_t starved) {
  torch::NoGradGuard no_grad;
  p.tensors[0][starved].fill_(-5.0);
}

TEST(MoeExpertsTest, GroupedPathRunsWhereATenHasKernels) {
  const ModelSpec spec = MoeSpec("qwen3_moe");  // hidden 32, expert width 24
  EXPECT_TRUE(MoeGroupedGemmRuns(spec, torch::kFloat32, torch::kCPU));
  EXPECT_TRUE(MoeGroupedGemmRuns(spec, torch::kBFloat16, torch::kCPU));
  EXPECT_FALSE(MoeGroupedGemmRuns(spec, torch::kFloat64, torch::kCPU));
  // CUDA: bf16 only (fp32 would take ATen's per-group loop with a host read per call).
  EXPECT_FALSE(MoeGroupedGemmRuns(spec, torch::kFloat32, torch::Device(torch::kCUDA, 0)));
  ModelSpec narrow = spec;
  narrow.moe_intermediate_size = 20;  // 40-byte bf16 rows: not a 16-byte multiple
  EXPECT_TRUE(MoeGroupedGemmRuns(narrow, torch::kFloat32, torch::kCPU));
  EXPECT_FALSE(MoeGroupedGemmRuns(narrow, torch::kBFloat16, torch::kCPU));
  ModelSpec many = spec;
  many.num_experts = 1024;
  EXPECT_FALSE(MoeGroupedGemmRuns(many, torch::kFloat32, torch::kCPU));
}

// max |got - want| <= tolerance * max |want|, in fp32.
bool CloseTo(const torch::Tensor& got, const torch::Tensor& want, double tolerance) {
  const torch::Tensor a = got.to(torch::kFloat32);
  const torch::Tensor b = want.to(torch::kFloat32);
  return (a - b).abs().max().item<double>() <= tolerance * b.abs().max().item<double>();
}

// On the CPU ATen's grouped kernel is one mm per expert into a slice of one output: the loop's
// values to within the BLAS kernels' rounding (they differ by an ulp now and then: the output
// slices are not aligned as fresh tensors are), fp32 and bf16, an expert without rows included
// (exactly zero gradients in both).
TEST(MoeExpertsTest, GroupedEqualsLoopOnTheCpu) {
  for (const std::string family : {"qwen3_moe", "mixtral"}) {
    for (const torch::ScalarType dtype : {torch::kFloat32, torch::kBFloat16}) {
      const double tolerance = dtype == torch::kFloat32 ? 1e-6 : 8e-3;
      const ModelSpec spec = MoeSpec(family, 6, 2);
      ASSERT_TRUE(MoeGroupedGemmRuns(spec, dtype, torch::kCPU));
      MoeParams p = RandomParams(spec, 31);
      Starve(p, 4);
      for (torch::Tensor& t : p.tensors) t = t.detach().to(dtype).requires_grad_(true);
      auto gen = at::make_generator<at::CPUGeneratorImpl>(32);
      const torch::Tensor y = (torch::rand({2, 9, spec.hidden_size}, gen) + 0.1).to(dtype);
      const torch::Tensor probe = torch::randn(y.sizes(), gen).to(dtype);

      const PathResult grouped = RunPath(spec, p, y, probe, MoeExperts::kGrouped);
      const PathResult loop = RunPath(spec, p, y, probe, MoeExperts::kLoop);
      EXPECT_TRUE(CloseTo(grouped.out, loop.out, tolerance)) << family << " " << dtype;
      ASSERT_EQ(grouped.grads.size(), loop.grads.size());
      for (size_t i = 0; i < loop.grads.size(); ++i) {
        ASSERT_TRUE(grouped.grads[i].defined()) << i;
        EXPECT_TRUE(CloseTo(grouped.grads[i], loop.grads[i], tolerance))
            << family << " " << dtype << " " << i;
      }
      for (int which = 0; which < 3; ++which) {
        const size_t starved = static_cast<size_t>(1 + 1 + 3 * 4 + which);  // input, router, ...
        EXPECT_EQ(grouped.grads[starved].abs().max().item<float>(), 0.0f) << which;
        EXPECT_GT(grouped.grads[2 + static_cast<size_t>(which)].abs().max().item<float>(), 0.0f);
      }
    }
  }
}

// [Grouped experts] on CUDA in bf16 (compute capability 9.x or 10.x: ATen's grouped kernels),
// against the loop's per-expert cuBLAS GEMMs. The two round differently (a different kernel and
// summation order in fp32, outputs rounded to bf16), so they agree within a tolerance: for the
// output and each gradient, max |grouped - loop| <= 2e-2 * max |loop| (bf16 keeps 8 bits of
// mantissa, 2^-8 = 3.9e-3 relative per rounding, a few roundings deep); an expert that receives no
// row gets exactly zero gradients in both.
// Counts the live bytes of CPU tensors allocated while it is installed (CountingCpu::Scope),
// through the default allocator. Not thread-safe to install; counts from any thread.
class CountingCpu final : public c10::Allocator {
 public:
  static CountingCpu& Get() {
    static CountingCpu* counting = new CountingCpu(c10::GetDefaultCPUAllocator());
    return *counting;
  }
  c10::DataPtr allocate(size_t n) override {
    auto* block = new Block{inner_->allocate(n), n};
    live_bytes_ += static_cast<int64_t>(n);
    void* data = block->data.get();
    return {data, block, &Free, c10::Device(c10::kCPU)};
  }
  void copy_data(void* dest, const void* src, size_t count) const override {
    default_copy_data(dest, src, count);
  }
  int64_t live_bytes() const { return live_bytes_.load(); }

  struct Scope {
    Scope() { c10::SetCPUAllocator(&Get()); }
    ~Scope() { c10::SetCPUAllocator(Get().inner_); }
  };

 private:
  struct Block {
    c10::DataPtr data;
    size_t n;
  };
  explicit CountingCpu(c10::Allocator* inner) : inner_(inner) {}
  static void Free(void* ctx) {
    auto* block = static_cast<Block*>(ctx);
    Get().live_bytes_ -= static_cast<int64_t>(block->n);
    delete block;
  }
  c10::Allocator* inner_;
  std::atomic<int64_t> live_bytes_{0};
};

// [Frozen linear] (agent/model/layers.cc) on both expert paths: with the router and the experts
// frozen (a LoRA run on a mixture of experts: no adapters on them) the layer keeps none of their
// inputs for backward, the router's (the layer's input [T, H]), the experts' gate/up input (the
// sorted rows [T * k, H]) nor the down projection's (the SwiGLU product [T * k, I]), and the
// input gradient is the same; with them training it keeps all three.
TEST(MoeMlpTest, FrozenRouterAndExpertsKeepNoInputsForBackward) {
  const ModelSpec spec = MoeSpec("qwen3_moe");
  ASSERT_TRUE(MoeGroupedGemmRuns(spec, torch::kFloat32, torch::kCPU));
  const MoeParams trained = RandomParams(spec, 11);
  const MoeParams frozen = [&] {
    MoeParams p = trained;
    for (torch::Tensor& t : p.tensors) t = t.detach();
    return p;
  }();
  auto gen = at::make_generator<at::CPUGeneratorImpl>(12);
  const torch::Tensor leaf = torch::randn({2, 6, spec.hidden_size}, gen).requires_grad_();
  const int64_t tokens = 12, k = spec.num_experts_per_tok;
  const int64_t inputs_bytes = 4 * (tokens * spec.hidden_size + tokens * k * spec.hidden_size +
                                    tokens * k * spec.moe_intermediate_size);
  for (MoeExperts experts : {MoeExperts::kGrouped, MoeExperts::kLoop}) {
    SCOPED_TRACE(experts == MoeExperts::kGrouped ? "grouped" : "loop");
    std::vector<int64_t> kept_bytes;
    std::vector<torch::Tensor> input_grads;
    for (const MoeParams* p : {&frozen, &trained}) {
      const bool trains = p == &trained;
      SCOPED_TRACE(trains ? "trained" : "frozen");
      torch::Tensor out;
      {
        CountingCpu::Scope counting;
        ASSERT_EQ(c10::GetCPUAllocator(), &CountingCpu::Get());
        const int64_t before = CountingCpu::Get().live_bytes();
        torch::Tensor y = leaf * 2;  // an intermediate: only the graph could keep it alive
        const c10::weak_intrusive_ptr<c10::StorageImpl> storage = y.storage().getWeakStorageImpl();
        out = MoeMlp(spec, *p, y, nullptr, experts);
        y = torch::Tensor();
        kept_bytes.push_back(CountingCpu::Get().live_bytes() - before);
        EXPECT_EQ(storage.expired(), !trains);
      }
      leaf.mutable_grad() = torch::Tensor();
      out.square().sum().backward();
      input_grads.push_back(leaf.grad().clone());
    }
    EXPECT_EQ(kept_bytes[1] - kept_bytes[0], inputs_bytes);
    EXPECT_TRUE(torch::equal(input_grads[0], input_grads[1]));
  }
}

TEST(MoeExpertsGpuTest, GroupedMatchesLoopInBf16) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "needs a CUDA device";
  const torch::Device cuda(torch::kCUDA, 0);
  ModelSpec spec = MoeSpec("qwen3_moe", 16, 4);
  spec.hidden_size = 256;
  spec.moe_intermediate_size = 128;
  if (!MoeGroupedGemmRuns(spec, torch::kBFloat16, cuda)) {
    GTEST_SKIP() << "ATen's grouped GEMM needs compute capability 9.x or 10.x";
  }
  for (const std::string family : {"qwen3_moe", "mixtral"}) {
    spec.family = family;
    spec.norm_topk_prob = family == "mixtral";
    MoeParams p = RandomParams(spec, 41);
    Starve(p, 7);
    for (torch::Tensor& t : p.tensors) {
      t = (t.detach() * 0.5).to(cuda, torch::kBFloat16).requires_grad_(true);
    }
    auto gen = at::make_generator<at::CPUGeneratorImpl>(42);
    const torch::Tensor y =
        (torch::rand({4, 96, spec.hidden_size}, gen) + 0.1).to(cuda, torch::kBFloat16);
    const torch::Tensor probe = torch::randn(y.sizes(), gen).to(cuda, torch::kBFloat16);

    const PathResult grouped = RunPath(spec, p, y, probe, MoeExperts::kGrouped);
    const PathResult loop = RunPath(spec, p, y, probe, MoeExperts::kLoop);
    EXPECT_TRUE(CloseTo(grouped.out, loop.out, 2e-2)) << family;
    ASSERT_EQ(grouped.grads.size(), loop.grads.size());
    for (size_t i = 0; i < loop.grads.size(); ++i) {
      ASSERT_TRUE(grouped.grads[i].defined()) << i;
      EXPECT_TRUE(CloseTo(grouped.grads[i], loop.grads[i], 2e-2)) << family << " " << i;
    }
    for (int which = 0; which < 3; ++which) {
      const size_t starved = static_cast<size_t>(1 + 1 + 3 * 7 + which);
      EXPECT_EQ(grouped.grads[starved].abs().max().item<float>(), 0.0f) << family << which;
      EXPECT_EQ(loop.grads[starved].abs().max().item<float>(), 0.0f) << family << which;
    }
  }
}

// [Router load balance]: the value and the router-logit gradients of two recorded layers against
// transformers' formula differentiated by autograd.
TEST(MoeRouterLossTest, ValueAndGradientMatchTheFormula) {
  ModelSpec spec = MoeSpec("mixtral", 4, 2);
  spec.output_router_logits = true;
  spec.router_aux_loss_coef = 0.5;
  auto gen = at::make_generator<at::CPUGeneratorImpl>(5);
  std::vector<torch::Tensor> logits;
  for (int l = 0; l < 2; ++l) logits.push_back(torch::randn({6, 4}, gen).requires_grad_(true));

  MoeRouterLoss aux(spec);
  std::vector<torch::Tensor> routed;
  for (int l = 0; l < 2; ++l) {
    const torch::Tensor used = logits[static_cast<size_t>(l)] * 1.0;  // a non-leaf, as in a layer
    const torch::Tensor probs = torch::softmax(used, -1);
    const torch::Tensor top = std::get<1>(probs.topk(2, -1));
    aux.Record(l, used, probs, at::bincount(top.reshape({-1}), {}, 4));
    routed.push_back(std::get<0>(probs.topk(2, -1)).sum());
  }
  const torch::Tensor lm = (routed[0] + routed[1]) * 0.25;
  const torch::Tensor total = aux.AddTo(lm);
  (total * 3.0).backward();  // an upstream scale, as gradient accumulation divides

  // Reference: counts C (constant) and probability sums P over both layers, R = 12 rows.
  std::vector<torch::Tensor> ref_leaves;
  torch::Tensor counts = torch::zeros({4});
  torch::Tensor prob_sum = torch::zeros({4});
  for (int l = 0; l < 2; ++l) {
    ref_leaves.push_back(logits[static_cast<size_t>(l)].detach().clone().requires_grad_(true));
    const torch::Tensor probs = torch::softmax(ref_leaves.back(), -1);
    const torch::Tensor top = std::get<1>(probs.topk(2, -1));
    counts = counts + torch::zeros({4}).scatter_add(0, top.reshape({-1}), torch::ones({12}));
    prob_sum = prob_sum + probs.sum(0);
  }
  const torch::Tensor ref_aux = (counts / 12 * (prob_sum / 12)).sum() * 4;
  EXPECT_NEAR(aux.last_aux().item<double>(), ref_aux.item<double>(), 1e-6);
  EXPECT_NEAR(total.item<double>(), lm.item<double>() + 0.5 * ref_aux.item<double>(), 1e-6);
  // The routing's own gradient plus 3 * 0.5 * d aux.
  torch::Tensor ref_lm = torch::zeros({});
  for (int l = 0; l < 2; ++l) {
    const torch::Tensor probs = torch::softmax(ref_leaves[static_cast<size_t>(l)], -1);
    ref_lm = ref_lm + std::get<0>(probs.topk(2, -1)).sum() * 0.25;
  }
  ((ref_lm + 0.5 * ref_aux) * 3.0).backward();
  for (int l = 0; l < 2; ++l) {
    const torch::Tensor got = logits[static_cast<size_t>(l)].grad();
    const torch::Tensor want = ref_leaves[static_cast<size_t>(l)].grad();
    EXPECT_LT((got - want).abs().max().item<double>(), 1e-6) << l;
    EXPECT_GT(want.abs().max().item<double>(), 1e-2);
  }
}

std::unique_ptr<LlamaModel> MakeModel(const ModelSpec& spec) {
  LlamaModelOptions options;
  options.spec = spec;
  options.seed = 9;
  auto model = LlamaModel::Create(options);
  EXPECT_TRUE(model.ok()) << model.status();
  return std::move(model).value();
}

TEST(MoeModelTest, ParamsFollowTheCheckpointNamesAndOrder) {
  ModelSpec spec = MoeSpec("qwen3_moe");
  spec.mlp_only_layers = {1};
  const auto model = MakeModel(spec);
  const std::vector<NamedParam> params = model->Params();
  const std::vector<ParamShape> shapes = HfParamShapes(spec);
  ASSERT_EQ(params.size(), shapes.size());
  for (size_t i = 0; i < params.size(); ++i) {
    EXPECT_EQ(params[i].name, shapes[i].name);
    EXPECT_EQ(params[i].param.sizes().vec(), shapes[i].shape) << shapes[i].name;
  }
}

// Plain and grouped losses run the same routing and the same load-balancing code, so every block
// mode gives bit-identical losses and gradients, the auxiliary loss included.
TEST(MoeModelTest, GroupedLossIsBitIdenticalToPlainWithTheAuxLoss) {
  for (const std::string family : {"qwen3_moe", "mixtral"}) {
    ModelSpec spec = MoeSpec(family);
    spec.output_router_logits = true;
    spec.router_aux_loss_coef = 0.1;
    if (family == "qwen3_moe") spec.mlp_only_layers = {2};
    auto gen = at::make_generator<at::CPUGeneratorImpl>(21);
    const torch::Tensor ids = torch::randint(spec.vocab_size, {2, 12}, gen, torch::kLong);
    const torch::Tensor targets = torch::randint(spec.vocab_size, {2, 12}, gen, torch::kLong);

    auto plain = MakeModel(spec);
    const torch::Tensor plain_loss = plain->Loss(ids, targets);
    plain_loss.backward();

    auto grouped = MakeModel(spec);
    const BlockModes modes = {BlockMode::kCkpt, BlockMode::kSwap, BlockMode::kHsOffload,
                              BlockMode::kNone};
    const torch::Tensor grouped_loss = grouped->Loss(ids, targets, modes, nullptr);
    grouped_loss.backward();
    EXPECT_EQ(plain_loss.item<float>(), grouped_loss.item<float>()) << family;

    const auto a = plain->Params();
    const auto b = grouped->Params();
    ASSERT_EQ(a.size(), b.size());
    for (size_t i = 0; i < a.size(); ++i) {
      ASSERT_TRUE(a[i].param.grad().defined()) << a[i].name;
      EXPECT_TRUE(torch::equal(a[i].param.grad(), b[i].param.grad())) << family << " " << a[i].name;
    }

    // The auxiliary term is there: without it the loss and the router gradients change.
    spec.output_router_logits = false;
    auto without = MakeModel(spec);
    const torch::Tensor lm_only = without->Loss(ids, targets);
    lm_only.backward();
    EXPECT_GT(plain_loss.item<double>() - lm_only.item<double>(), 0.1 * 0.9);  // aux >= ~1
    const std::string router = MoeRouterName(spec, 0);
    for (size_t i = 0; i < a.size(); ++i) {
      if (a[i].name != router) continue;
      const torch::Tensor diff = a[i].param.grad() - without->Params()[i].param.grad();
      EXPECT_GT(diff.abs().max().item<double>(), 1e-6) << family;
    }
  }
}

// The model's option reaches every sparse layer: the loop and the grouped experts give the same
// loss and gradients (to fp32 rounding on the CPU), in the grouped loss with every block mode.
TEST(MoeModelTest, LoopAndGroupedExpertsGiveTheSameLossAndGradients) {
  ModelSpec spec = MoeSpec("qwen3_moe");
  spec.output_router_logits = true;
  spec.router_aux_loss_coef = 0.1;
  auto gen = at::make_generator<at::CPUGeneratorImpl>(23);
  const torch::Tensor ids = torch::randint(spec.vocab_size, {2, 12}, gen, torch::kLong);
  const torch::Tensor targets = torch::randint(spec.vocab_size, {2, 12}, gen, torch::kLong);
  const BlockModes modes = {BlockMode::kCkpt, BlockMode::kSwap, BlockMode::kHsOffload,
                            BlockMode::kNone};
  std::vector<std::unique_ptr<LlamaModel>> models;
  std::vector<float> losses;
  for (const MoeExperts experts : {MoeExperts::kLoop, MoeExperts::kGrouped}) {
    LlamaModelOptions options;
    options.spec = spec;
    options.seed = 9;
    options.moe_experts = experts;
    auto model = LlamaModel::Create(options);
    ASSERT_TRUE(model.ok()) << model.status();
    const torch::Tensor loss = model.value()->Loss(ids, targets, modes, nullptr);
    loss.backward();
    losses.push_back(loss.item<float>());
    models.push_back(std::move(model).value());
  }
  EXPECT_NEAR(losses[0], losses[1], 1e-6 * std::abs(losses[0]));
  const auto a = models[0]->Params();
  const auto b = models[1]->Params();
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    ASSERT_TRUE(b[i].param.grad().defined()) << b[i].name;
    EXPECT_TRUE(CloseTo(b[i].param.grad(), a[i].param.grad(), 1e-5)) << a[i].name;
  }
}

TEST(MoeModelTest, AdaptersOnExpertsAndQloraAreRefused) {
  LlamaModelOptions options;
  options.spec = MoeSpec("mixtral");
  options.lora.rank = 4;
  options.lora.alpha = 8;
  options.lora.targets = {"q_proj", "gate_proj"};
  auto model = LlamaModel::Create(options);
  ASSERT_FALSE(model.ok());
  EXPECT_NE(model.status().message().find("mixture of experts"), std::string::npos)
      << model.status();
  options.lora.targets = {"q_proj", "v_proj"};
  auto attention_only = LlamaModel::Create(options);
  ASSERT_TRUE(attention_only.ok()) << attention_only.status();
  EXPECT_EQ(attention_only.value()->TrainableParams().size(), 4u * 4u);
  options.lora.nf4_base = true;
  auto qlora = LlamaModel::Create(options);
  ASSERT_FALSE(qlora.ok());
  EXPECT_NE(qlora.status().message().find("QLoRA"), std::string::npos) << qlora.status();
}

}  // namespace
}  // namespace memplan
