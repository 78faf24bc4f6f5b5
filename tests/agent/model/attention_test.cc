#include "agent/model/attention.h"

#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "agent/blocks/activation_offloader.h"
#include "agent/model/llama_model.h"
#include "common/sliding_window.h"
#include "tests/agent/model/dense_attention.h"

namespace memplan {
namespace {

const bool kSingleThread = [] {
  torch::set_num_threads(1);
  return true;
}();

struct Inputs {
  torch::Tensor q, k, v, grad;
};

// [batch, heads, seq, head_dim] in the layout the model hands over (a transposed
// [batch, seq, heads, head_dim] tensor), each a leaf that requires grad.
Inputs MakeInputs(int64_t heads, int64_t kv_heads, int64_t seq, uint64_t seed) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  auto draw = [&](int64_t h) {
    return torch::randn({2, seq, h, 8}, gen).transpose(1, 2).requires_grad_(true);
  };
  Inputs in;
  in.q = draw(heads);
  in.k = draw(kv_heads);
  in.v = draw(kv_heads);
  in.grad = torch::randn({2, heads, seq, 8}, gen);
  return in;
}

struct AttentionCase {
  std::string name;
  int64_t heads, kv_heads, seq, window;
};

void PrintTo(const AttentionCase& c, std::ostream* os) { *os << c.name; }

class CausalAttentionTest : public ::testing::TestWithParam<AttentionCase> {};

// Output and the gradients of q, k and v against the dense reference, in fp32.
TEST_P(CausalAttentionTest, MatchesTheDenseMaskedReference) {
  const AttentionCase& c = GetParam();
  Inputs a = MakeInputs(c.heads, c.kv_heads, c.seq, 5);
  Inputs b{a.q.detach().clone().requires_grad_(true), a.k.detach().clone().requires_grad_(true),
           a.v.detach().clone().requires_grad_(true), a.grad};

  const torch::Tensor got = CausalAttention(a.q, a.k, a.v, c.window);
  const torch::Tensor want =
      DenseAttention(b.q, b.k, b.v, c.window, 1.0 / std::sqrt(static_cast<double>(b.q.size(3))));
  ASSERT_EQ(got.sizes(), want.sizes());
  EXPECT_LT(RelErr(got, want), 1e-6);
  got.backward(a.grad);
  want.backward(b.grad);
  EXPECT_LT(RelErr(a.q.grad(), b.q.grad()), 1e-5);
  EXPECT_LT(RelErr(a.k.grad(), b.k.grad()), 1e-5);
  EXPECT_LT(RelErr(a.v.grad(), b.v.grad()), 1e-5);
}

INSTANTIATE_TEST_SUITE_P(
    Windows, CausalAttentionTest,
    ::testing::Values(
        // Full causal attention (window 0) and windows at or above the sequence: the causal path.
        AttentionCase{"full", 4, 4, 19, 0}, AttentionCase{"window_equals_seq", 4, 2, 19, 19},
        AttentionCase{"window_above_seq", 4, 4, 19, 40},
        // Tiled: uneven last tile, grouped-query and multi-head, a window of one token.
        AttentionCase{"window_5_gqa", 4, 2, 23, 5}, AttentionCase{"window_5_mha", 2, 2, 23, 5},
        AttentionCase{"window_1", 2, 1, 9, 1}, AttentionCase{"window_18_of_19", 4, 1, 19, 18},
        // Window beyond the tile cap: tiles of kSlidingWindowMaxTileRows rows, interior and early
        // tiles with their own masks.
        AttentionCase{"window_1100", 2, 1, 2500, 1100}),
    [](const auto& info) { return info.param.name; });

// Within the window the sliding layer is SDPA's causal kernel itself, bit for bit.
TEST(CausalAttentionTest, UpToTheWindowItIsTheCausalKernel) {
  Inputs in = MakeInputs(4, 2, 16, 3);
  const torch::Tensor causal = at::scaled_dot_product_attention(
      in.q, in.k, in.v, {}, 0.0, /*is_causal=*/true, std::nullopt, /*enable_gqa=*/true);
  EXPECT_TRUE(torch::equal(CausalAttention(in.q, in.k, in.v, 16), causal));
  EXPECT_TRUE(torch::equal(CausalAttention(in.q, in.k, in.v, 0), causal));
  // Beyond it the window changes the result: the last query no longer sees the first key.
  EXPECT_GT((CausalAttention(in.q, in.k, in.v, 8) - causal).abs().max().item<double>(), 1e-3);
}

// A recomputed block must reproduce its forward: the same inputs give the same bits.
TEST(CausalAttentionTest, TiledForwardIsDeterministic) {
  Inputs in = MakeInputs(4, 2, 40, 9);
  EXPECT_TRUE(
      torch::equal(CausalAttention(in.q, in.k, in.v, 6), CausalAttention(in.q, in.k, in.v, 6)));
}

// With a window of one token each query sees only itself: the output is its value.
TEST(CausalAttentionTest, WindowOfOneReturnsTheValues) {
  Inputs in = MakeInputs(2, 2, 12, 4);
  const torch::Tensor out = CausalAttention(in.q, in.k, in.v, 1);
  EXPECT_LT((out - in.v).abs().max().item<double>(), 1e-6);
}

TEST(SlidingWindowBytesTest, ZeroUntilTiledThenBoundedByTheWindow) {
  ModelSpec m;
  m.hidden_size = 4096;
  m.num_heads = 32;
  m.num_kv_heads = 8;
  // Not tiled: no extra bytes.
  EXPECT_EQ(SlidingWindowAttentionMemory(m, 0, 1, 8192, 2).backward_transient, 0);
  EXPECT_EQ(SlidingWindowAttentionMemory(m, 4096, 1, 4096, 2).forward_transient, 0);
  // Tiled, bf16, window 4096 at 8192 tokens: tiles of 1024 rows over 5119 keys.
  const SlidingWindowAttentionBytes b = SlidingWindowAttentionMemory(m, 4096, 1, 8192, 2);
  const int64_t mask = 2 * 1024 * 5120 * 2;
  const int64_t repeated = 2 * 5119 * 4096 * 2;
  EXPECT_EQ(b.forward_transient, mask + repeated + 1024 * 4096 * 2);
  const int64_t full_grads = 8192 * (4096 + 2 * 1024) * 2;
  const int64_t fp32_sums = 2 * 8192 * 1024 * 4;
  // The key and value gradients of a tile: the 4 query heads of a kv head summed in fp32.
  const int64_t tile = mask + repeated + 1024 * 4096 * 2 + 32 * 1024 * 4 + 2 * 5119 * 1024 * 4 +
                       repeated + 1024 * 4096 * 2 + 1024 * 4096 * 4;
  EXPECT_EQ(b.backward_transient, full_grads + fp32_sums + tile);
  // The per-tile share does not grow with the sequence: doubling it adds only full-size terms.
  const SlidingWindowAttentionBytes twice = SlidingWindowAttentionMemory(m, 4096, 1, 16384, 2);
  EXPECT_EQ(twice.forward_transient, b.forward_transient);
  EXPECT_EQ(twice.backward_transient - b.backward_transient, full_grads + fp32_sums);
}

// ---- the model: sliding layers through every block mode ----

ModelSpec SlidingSpec(const std::string& family, int64_t window, std::vector<int64_t> layers) {
  ModelSpec s;
  s.name = "tiny-sliding-" + family;
  s.family = family;
  s.hidden_size = 64;
  s.num_layers = 4;
  s.num_heads = 4;
  s.num_kv_heads = 2;
  s.intermediate_size = 96;
  s.vocab_size = 128;
  s.rope_theta = 10000.0;
  if (family == "qwen2") s.qkv_bias = true;
  s.sliding_window = window;
  s.sliding_layers = std::move(layers);
  return s;
}

std::unique_ptr<LlamaModel> MakeModel(const ModelSpec& spec) {
  LlamaModelOptions options;
  options.spec = spec;
  options.seed = 3;
  auto model = LlamaModel::Create(options);
  EXPECT_TRUE(model.ok()) << model.status();
  return model.ok() ? std::move(model).value() : nullptr;
}

std::map<std::string, torch::Tensor> TakeGrads(LlamaModel& model) {
  std::map<std::string, torch::Tensor> grads;
  for (auto& p : model.Params()) {
    grads[p.name] = p.param.grad().clone();
    p.param.mutable_grad().reset();
  }
  return grads;
}

struct Batch {
  torch::Tensor ids, targets;
};

Batch MakeBatch(int64_t seq) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(11);
  Batch b;
  b.ids = torch::randint(128, {2, seq}, gen, torch::kLong);
  b.targets = torch::randint(128, {2, seq}, gen, torch::kLong);
  return b;
}

// Sliding layers in the grouped loss (recomputed in CKPT and HS_OFFLOAD, offloaded in SWAP) give
// the plain-autograd loss and gradients bit for bit.
TEST(SlidingWindowModelTest, GroupedModesAreBitExact) {
  using M = BlockMode;
  auto model = MakeModel(SlidingSpec("mistral", 5, {0, 1, 2, 3}));
  ASSERT_NE(model, nullptr);
  auto offloader = ActivationOffloader::Create({});
  ASSERT_TRUE(offloader.ok());
  const Batch b = MakeBatch(21);
  const torch::Tensor ref = model->Loss(b.ids, b.targets);
  ref.backward();
  const auto expected = TakeGrads(*model);
  for (const BlockModes& modes :
       {BlockModes{M::kCkpt, M::kCkpt, M::kCkpt, M::kCkpt},
        BlockModes{M::kSwap, M::kSwap, M::kSwap, M::kSwap},
        BlockModes{M::kHsOffload, M::kHsOffload, M::kHsOffload, M::kHsOffload},
        BlockModes{M::kSwap, M::kCkpt, M::kHsOffload, M::kNone}}) {
    const torch::Tensor got = model->Loss(b.ids, b.targets, modes, nullptr, offloader->get());
    got.backward();
    EXPECT_TRUE(torch::equal(ref, got)) << ref.item<double>() << " vs " << got.item<double>();
    for (const auto& [name, g] : TakeGrads(*model)) {
      EXPECT_TRUE(torch::equal(expected.at(name), g)) << name;
    }
  }
}

// Only the listed layers slide: a window on layers 1 and 3 differs from none and from all four;
// a window of at least the sequence changes nothing.
TEST(SlidingWindowModelTest, OnlyTheListedLayersSlide) {
  const Batch b = MakeBatch(21);
  auto loss = [&](const ModelSpec& spec) {
    auto model = MakeModel(spec);
    return model->Loss(b.ids, b.targets).item<double>();
  };
  const double full = loss(SlidingSpec("qwen2", 0, {}));
  const double some = loss(SlidingSpec("qwen2", 4, {1, 3}));
  const double all = loss(SlidingSpec("qwen2", 4, {0, 1, 2, 3}));
  EXPECT_NE(full, some);
  EXPECT_NE(some, all);
  EXPECT_EQ(loss(SlidingSpec("qwen2", 21, {1, 3})), full);
}

// Sequences beyond the window are accepted now; a spec whose window and layers disagree is not.
TEST(SlidingWindowModelTest, AcceptsLongSequencesRejectsInconsistentSpecs) {
  auto model = MakeModel(SlidingSpec("mistral", 4, {0, 1, 2, 3}));
  ASSERT_NE(model, nullptr);
  EXPECT_TRUE(model->CheckSequenceLength(4096).ok());
  LlamaModelOptions options;
  options.spec = SlidingSpec("mistral", 4, {});
  EXPECT_FALSE(LlamaModel::Create(options).ok());
  options.spec = SlidingSpec("mistral", 4, {2, 1});
  EXPECT_FALSE(LlamaModel::Create(options).ok());
  options.spec = SlidingSpec("mistral", 0, {1});
  EXPECT_FALSE(LlamaModel::Create(options).ok());
}

}  // namespace
}  // namespace memplan
