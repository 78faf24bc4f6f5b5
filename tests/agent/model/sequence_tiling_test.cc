// The sequence-tiled MLP ([Sequence-tiled MLP], common/mlp_tiling.h): SequenceTiled equals the
// untiled function in value and gradients; a model whose MLP runs in tiles gives the untiled
// model's loss and gradients in the plain graph and in every block mode (fp32, CPU); with LoRA
// dropout the grouped path replays the plain tiled graph's masks bit for bit.
#include <gtest/gtest.h>

#include <map>
#include <string>
#include <vector>

#include "agent/blocks/activation_offloader.h"
#include "agent/model/llama_model.h"
#include "agent/model/sequence_tiling.h"
#include "common/mlp_tiling.h"
#include "tests/agent/tiny_spec.h"

namespace memplan {
namespace {

const bool kSingleThread = [] {
  torch::set_num_threads(1);
  return true;
}();

torch::Tensor Draw(std::vector<int64_t> sizes, uint64_t seed) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  return torch::randn(sizes, gen, torch::kFloat32);
}

void ExpectClose(const torch::Tensor& want, const torch::Tensor& got, const std::string& what) {
  ASSERT_TRUE(want.defined() && got.defined()) << what;
  const double scale = want.abs().max().item<double>() + 1e-12;
  const double diff = (want - got).abs().max().item<double>();
  EXPECT_LE(diff, 1e-5 * scale) << what << ": max diff " << diff << " of max " << scale;
}

TEST(MlpTilingTest, RuleTilesOnlyAboveTheThreshold) {
  // qwen3-8b (I = 12288, bf16): 65 536 tokens hold 1.5 GiB per intermediate (whole), 131 072
  // hold 3 GiB (tiled, 256 MiB tiles of 10 922 tokens).
  EXPECT_EQ(MlpTileRows(65536, 12288, 2), 0);
  EXPECT_EQ(MlpTileRows(131072, 12288, 2), (int64_t{256} << 20) / (12288 * 2));
  EXPECT_EQ(MlpTileRows(131072, 12288, 2), 10922);
  EXPECT_EQ(MlpTileRows(87382, 12288, 2), 10922);  // just over 2 GiB
  EXPECT_EQ(MlpTileRows(87381, 12288, 2), 0);
  EXPECT_GE(MlpTileRows(int64_t{1} << 40, int64_t{1} << 30, 4), 1);
}

TEST(SequenceTilingTest, EqualsTheUntiledFunctionAndItsGradients) {
  const torch::Tensor w1 = Draw({24, 8}, 1).requires_grad_(true);
  const torch::Tensor w2 = Draw({8, 24}, 2).requires_grad_(true);
  auto fn = [&](const torch::Tensor& in) {
    return torch::nn::functional::linear(torch::silu(torch::nn::functional::linear(in, w1)), w2);
  };
  for (bool input_grad : {true, false}) {
    const torch::Tensor x = Draw({2, 13, 8}, 3).requires_grad_(input_grad);
    const torch::Tensor up = Draw({2, 13, 8}, 4);
    const torch::Tensor want = fn(x);
    (want * up).sum().backward();
    const torch::Tensor want_w1 = w1.grad().clone(), want_w2 = w2.grad().clone();
    const torch::Tensor want_x = input_grad ? x.grad().clone() : torch::Tensor();
    w1.mutable_grad().reset();
    w2.mutable_grad().reset();
    if (input_grad) x.mutable_grad().reset();

    const torch::Tensor got = SequenceTiled(fn, x, 5);  // 26 rows: tiles of 5, 5, ..., 1
    ASSERT_EQ(got.sizes(), want.sizes());
    ExpectClose(want, got, "value");
    (got * up).sum().backward();
    ExpectClose(want_w1, w1.grad(), "w1 grad");
    ExpectClose(want_w2, w2.grad(), "w2 grad");
    if (input_grad) ExpectClose(want_x, x.grad(), "x grad");
    w1.mutable_grad().reset();
    w2.mutable_grad().reset();
  }
}

TEST(SequenceTilingTest, NoGradForwardRunsTheTilesWithoutANode) {
  const torch::Tensor w = Draw({8, 8}, 5).requires_grad_(true);
  auto fn = [&](const torch::Tensor& in) { return torch::nn::functional::linear(in, w); };
  const torch::Tensor x = Draw({3, 7, 8}, 6);
  torch::NoGradGuard no_grad;
  const torch::Tensor got = SequenceTiled(fn, x, 4);
  EXPECT_FALSE(got.requires_grad());
  ExpectClose(fn(x), got, "value");
}

std::unique_ptr<LlamaModel> MakeModel(int64_t mlp_tile_rows, const LoraOptions& lora = {}) {
  LlamaModelOptions o;
  o.spec = testing::TinySpec(false, "qwen3");
  o.seed = 7;
  o.mlp_tile_rows = mlp_tile_rows;
  o.lora = lora;
  auto model = LlamaModel::Create(o);
  EXPECT_TRUE(model.ok()) << model.status();
  return std::move(model).value();
}

struct Batch {
  torch::Tensor ids, labels;
};

Batch MakeBatch(uint64_t seed) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  Batch b;
  b.ids = torch::randint(128, {2, 11}, gen, torch::kLong);
  b.labels = torch::randint(128, {2, 11}, gen, torch::kLong);
  b.labels.index_put_({0, 3}, -100);
  return b;
}

std::map<std::string, torch::Tensor> TakeGrads(const std::vector<NamedParam>& params) {
  std::map<std::string, torch::Tensor> grads;
  for (const auto& p : params) {
    EXPECT_TRUE(p.param.grad().defined()) << p.name;
    if (!p.param.grad().defined()) continue;
    grads[p.name] = p.param.grad().clone();
    p.param.mutable_grad().reset();
  }
  return grads;
}

class TiledModelTest : public ::testing::TestWithParam<BlockMode> {};

// Full fine-tune: tiles of 4 tokens (22 per micro-batch) against the untiled model, same seed.
TEST_P(TiledModelTest, FullFineTuneEqualsTheUntiledModel) {
  auto whole = MakeModel(-1);
  auto tiled = MakeModel(4);
  auto offloader = ActivationOffloader::Create({});
  ASSERT_TRUE(offloader.ok());
  const BlockModes modes(static_cast<size_t>(whole->num_blocks()), GetParam());
  const Batch b = MakeBatch(21);

  const torch::Tensor want = whole->Loss(b.ids, b.labels);
  want.backward();
  const torch::Tensor got = tiled->Loss(b.ids, b.labels, modes, nullptr, offloader->get());
  got.backward();
  ExpectClose(want, got, "loss");
  auto want_grads = TakeGrads(whole->Params());
  auto got_grads = TakeGrads(tiled->Params());
  ASSERT_EQ(want_grads.size(), got_grads.size());
  for (const auto& [name, g] : want_grads) ExpectClose(g, got_grads[name], name);
}

// LoRA with dropout on the MLP's projections: the tiles draw their masks in forward, and the
// grouped path (recomputes included) replays them exactly as the plain tiled graph does.
TEST_P(TiledModelTest, LoraDropoutReplaysThePlainTiledGraph) {
  LoraOptions lora;
  lora.rank = 4;
  lora.alpha = 8;
  lora.dropout = 0.2;
  lora.targets = {"q_proj", "gate_proj", "up_proj", "down_proj"};
  auto model = MakeModel(4, lora);
  {
    torch::NoGradGuard no_grad;
    for (auto& p : model->TrainableParams()) p.param.add_(Draw(p.param.sizes().vec(), 31) * 0.05);
  }
  auto offloader = ActivationOffloader::Create({});
  ASSERT_TRUE(offloader.ok());
  const BlockModes modes(static_cast<size_t>(model->num_blocks()), GetParam());
  const Batch b = MakeBatch(22);

  torch::manual_seed(77);
  const torch::Tensor want = model->Loss(b.ids, b.labels);
  want.backward();
  auto want_grads = TakeGrads(model->TrainableParams());
  torch::manual_seed(77);
  const torch::Tensor got = model->Loss(b.ids, b.labels, modes, nullptr, offloader->get());
  got.backward();
  auto got_grads = TakeGrads(model->TrainableParams());
  EXPECT_TRUE(torch::equal(want, got)) << want.item<double>() << " vs " << got.item<double>();
  ASSERT_EQ(want_grads.size(), got_grads.size());
  for (const auto& [name, g] : want_grads) {
    EXPECT_TRUE(torch::equal(g, got_grads[name]))
        << name << " max diff " << (g - got_grads[name]).abs().max().item<double>();
  }
  for (const auto& p : model->Params()) EXPECT_FALSE(p.param.grad().defined()) << p.name;
}

INSTANTIATE_TEST_SUITE_P(Modes, TiledModelTest,
                         ::testing::Values(BlockMode::kNone, BlockMode::kCkpt, BlockMode::kSwap,
                                           BlockMode::kHsOffload),
                         [](const ::testing::TestParamInfo<BlockMode>& info) {
                           return std::string(BlockModeName(info.param));
                         });

}  // namespace
}  // namespace memplan
