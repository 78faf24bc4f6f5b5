// OSFT (agent/model/osft.h): the SVD split and its rank rule, the factorized linear against the
// dense one, the factored gradient projection against the dense projector, and OSFT through
// LlamaModel and the Trainer (frozen high factors, projected low gradients, AdamW on the low
// factors, refusals). Parity with the PyTorch reference: tests/parity/osft_parity_test.py.
#include <gtest/gtest.h>

#include <map>
#include <string>
#include <vector>

#include "agent/model/osft.h"
#include "agent/train/trainer.h"
#include "common/osft_cost.h"
#include "tests/agent/tiny_spec.h"

namespace memplan {
namespace {

const bool kSingleThread = [] {
  torch::set_num_threads(1);
  return true;
}();

torch::Tensor Randn(std::vector<int64_t> sizes, uint64_t seed) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  return at::empty(sizes, torch::kFloat32).normal_(0, 1, gen);
}

double RelErr(const torch::Tensor& got, const torch::Tensor& want) {
  return (got - want).abs().max().item<double>() / want.abs().max().item<double>();
}

OsftFactors Split(const torch::Tensor& w, double ratio) {
  return OsftSplit(w, ratio, torch::kCPU, torch::TensorOptions().dtype(torch::kFloat32));
}

TEST(OsftSplitRanks, FrozenPartIsTheComplementOfTheRatio) {
  EXPECT_EQ(OsftSplitRanks(48, 32, 0.5).high, 16);
  EXPECT_EQ(OsftSplitRanks(48, 32, 0.5).low, 16);
  EXPECT_EQ(OsftSplitRanks(32, 48, 0.25).high, 24);
  EXPECT_EQ(OsftSplitRanks(32, 48, 0.25).low, 8);
  // At least one direction on each side.
  EXPECT_EQ(OsftSplitRanks(8, 8, 0.01).low, 1);
  EXPECT_EQ(OsftSplitRanks(8, 8, 0.99).high, 1);
}

TEST(OsftSplit, FactorsRebuildTheWeightWithOrthonormalCanonicalVectors) {
  const torch::Tensor w = Randn({24, 16}, 1);
  const OsftFactors f = Split(w, 0.5);
  ASSERT_EQ(f.u_high.sizes(), (std::vector<int64_t>{24, 8}));
  ASSERT_EQ(f.v_low.sizes(), (std::vector<int64_t>{16, 8}));
  const torch::Tensor rebuilt = torch::mm(f.u_high * f.s_high, f.v_high.t()) +
                                torch::mm(f.u_low * f.s_low, f.v_low.t());
  EXPECT_LT(RelErr(rebuilt, w), 1e-5);
  const torch::Tensor u = torch::cat({f.u_high, f.u_low}, 1);
  EXPECT_LT((torch::mm(u.t(), u) - torch::eye(16)).abs().max().item<double>(), 1e-5);
  EXPECT_GE(f.s_high.min().item<double>(), f.s_low.max().item<double>());
  // Canonical sign: each left vector's largest-magnitude entry is positive.
  const torch::Tensor idx = u.abs().argmax(0, true);
  EXPECT_TRUE(u.gather(0, idx).gt(0).all().item<bool>());
  EXPECT_FALSE(f.u_high.requires_grad());
  EXPECT_TRUE(f.u_low.requires_grad() && f.s_low.requires_grad() && f.v_low.requires_grad());
}

// On CUDA the split takes cuSOLVER's gesvda (wide matrices transposed) and checks it by
// reconstruction: tall and wide weights rebuild, with the CPU split's spectrum.
TEST(OsftSplit, OnCudaTallAndWideWeightsRebuildWithTheCpuSpectrum) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "needs a CUDA device";
  for (const std::vector<int64_t>& shape : {std::vector<int64_t>{384, 128}, {128, 384}}) {
    const torch::Tensor w = Randn(shape, 11);
    const OsftFactors f = OsftSplit(w, 0.5, torch::kCUDA,
                                    torch::TensorOptions().dtype(torch::kFloat32).device(torch::kCUDA));
    const torch::Tensor rebuilt = (torch::mm(f.u_high * f.s_high, f.v_high.t()) +
                                   torch::mm(f.u_low * f.s_low, f.v_low.t())).cpu();
    EXPECT_LT(RelErr(rebuilt, w), 1e-4) << shape[0] << "x" << shape[1];
    const OsftFactors cpu = Split(w, 0.5);
    EXPECT_LT(RelErr(f.s_high.cpu(), cpu.s_high), 1e-4);
    EXPECT_LT(RelErr(f.s_low.cpu(), cpu.s_low), 1e-4);
    EXPECT_EQ(f.u_low.size(0), shape[0]);
    EXPECT_EQ(f.v_low.size(0), shape[1]);
  }
}

TEST(OsftLinear, EqualsTheDenseLinearWithBias) {
  const torch::Tensor w = Randn({24, 16}, 2);
  const torch::Tensor b = Randn({24}, 3);
  const torch::Tensor x = Randn({2, 5, 16}, 4);
  const OsftFactors f = Split(w, 0.5);
  const torch::Tensor y = OsftLinear(x, f, b);
  ASSERT_EQ(y.sizes(), (std::vector<int64_t>{2, 5, 24}));
  EXPECT_LT(RelErr(y, torch::matmul(x, w.t()) + b), 1e-5);
  EXPECT_LT(RelErr(OsftLinear(x, f, torch::Tensor()), torch::matmul(x, w.t())), 1e-5);
}

TEST(ProjectOsftGrads, EqualsTheDenseProjectorAndLeavesNoFrozenComponent) {
  const OsftFactors f = Split(Randn({24, 16}, 5), 0.5);
  const torch::Tensor x = Randn({7, 16}, 6);
  OsftLinear(x, f, torch::Tensor()).pow(2).sum().backward();
  const torch::Tensor du = f.u_low.grad().clone();
  const torch::Tensor dv = f.v_low.grad().clone();
  const torch::Tensor ds = f.s_low.grad().clone();
  ProjectOsftGrads(f);
  const torch::Tensor pu = torch::eye(24) - torch::mm(f.u_high, f.u_high.t());
  const torch::Tensor pv = torch::eye(16) - torch::mm(f.v_high, f.v_high.t());
  EXPECT_LT(RelErr(f.u_low.grad(), torch::mm(pu, du)), 1e-5);
  EXPECT_LT(RelErr(f.v_low.grad(), torch::mm(pv, dv)), 1e-5);
  EXPECT_TRUE(torch::equal(f.s_low.grad(), ds));
  // What is left in the frozen subspaces: rounding, relative to the gradient's magnitude.
  EXPECT_LT(torch::mm(f.u_high.t(), f.u_low.grad()).abs().max().item<double>() /
                du.abs().max().item<double>(),
            1e-5);
  EXPECT_LT(torch::mm(f.v_high.t(), f.v_low.grad()).abs().max().item<double>() /
                dv.abs().max().item<double>(),
            1e-5);
}

LlamaModelOptions OsftModelOptions(std::vector<std::string> targets, const std::string& family) {
  LlamaModelOptions o;
  o.spec = testing::TinySpec(/*tied=*/false, family);
  o.seed = 3;
  o.osft.rank_ratio = 0.5;
  o.osft.targets = std::move(targets);
  return o;
}

std::vector<MicroBatch> Batches(uint64_t seed) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  std::vector<MicroBatch> out;
  for (int i = 0; i < 2; ++i) {
    torch::Tensor ids = at::randint(0, 128, {2, 12}, gen, torch::kInt64);
    torch::Tensor labels = at::randint(0, 128, {2, 12}, gen, torch::kInt64);
    out.push_back({ids, labels, {}});
  }
  return out;
}

TEST(OsftModel, SplitKeepsTheLossAndListsFactorsInTheWeightsPlace) {
  auto model = LlamaModel::Create(OsftModelOptions({"q_proj", "v_proj", "down_proj"}, "qwen2"));
  ASSERT_TRUE(model.ok()) << model.status();
  const MicroBatch batch = Batches(9)[0];
  torch::NoGradGuard no_grad;
  const double dense = (*model)->Loss(batch.input_ids, batch.labels).item<double>();
  ASSERT_TRUE((*model)->SplitOsft().ok());
  EXPECT_TRUE((*model)->osft_split());
  const double factored = (*model)->Loss(batch.input_ids, batch.labels).item<double>();
  EXPECT_NEAR(factored, dense, 1e-5 * std::abs(dense));
  std::map<std::string, torch::Tensor> params;
  for (const NamedParam& p : (*model)->Params()) params[p.name] = p.param;
  EXPECT_EQ(params.count("model.layers.0.self_attn.q_proj.weight"), 0u);
  EXPECT_EQ(params.count("model.layers.0.self_attn.q_proj.osft_u_high"), 1u);
  EXPECT_EQ(params.count("model.layers.0.self_attn.q_proj.bias"), 1u);
  EXPECT_EQ(params.count("model.layers.0.self_attn.k_proj.weight"), 1u);
  for (const auto& [name, p] : params) EXPECT_FALSE(p.requires_grad()) << name;
  const std::vector<NamedParam> trainable = (*model)->TrainableParams();
  ASSERT_EQ(trainable.size(), 4u * 3u * 3u);  // blocks x modules x (u, s, v)
  EXPECT_EQ(trainable[0].name, "model.layers.0.self_attn.q_proj.osft_u_low");
  EXPECT_EQ(trainable[2].name, "model.layers.0.self_attn.q_proj.osft_v_low");
  for (const NamedParam& p : trainable) EXPECT_TRUE(p.param.requires_grad()) << p.name;
  // The grouped loss runs the same factorized projections.
  const double grouped = (*model)
                             ->Loss(batch.input_ids, batch.labels,
                                    BlockModes(4, BlockMode::kCkpt), nullptr)
                             .item<double>();
  EXPECT_EQ(grouped, factored);
}

TEST(OsftTrainer, StepsUpdateOnlyTheLowFactorsWithProjectedGradients) {
  auto model = LlamaModel::Create(OsftModelOptions(
      {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"}, "llama"));
  ASSERT_TRUE(model.ok()) << model.status();
  TrainerOptions options;
  options.grad_accum = 2;
  options.adamw.lr = 1e-3;
  options.block_modes = BlockModes(4, BlockMode::kCkpt);
  auto trainer = Trainer::Create(model->get(), options);
  ASSERT_TRUE(trainer.ok()) << trainer.status();
  std::map<std::string, torch::Tensor> frozen_before;
  for (const NamedParam& p : (*model)->Params()) frozen_before[p.name] = p.param.detach().clone();
  const std::vector<NamedParam> before = (*trainer)->Params();
  auto loss = (*trainer)->ForwardBackward(Batches(4));
  ASSERT_TRUE(loss.ok()) << loss.status();
  std::map<std::string, torch::Tensor> grads;
  for (const NamedParam& g : (*trainer)->Grads()) grads[g.name] = g.param;
  std::map<std::string, torch::Tensor> params;
  for (const NamedParam& p : (*model)->Params()) params[p.name] = p.param;
  const std::string q = "model.layers.2.self_attn.q_proj.osft_";
  const std::string down = "model.layers.1.mlp.down_proj.osft_";
  for (const std::string& m : {q, down}) {
    EXPECT_LT(torch::mm(params[m + "u_high"].t(), grads[m + "u_low"]).abs().max().item<double>(),
              1e-6);
    EXPECT_LT(torch::mm(params[m + "v_high"].t(), grads[m + "v_low"]).abs().max().item<double>(),
              1e-6);
    EXPECT_GT(grads[m + "s_low"].abs().max().item<double>(), 0);
  }
  ASSERT_TRUE((*trainer)->OptimizerStep().ok());
  auto second = (*trainer)->Step(Batches(4));
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_LT(second->loss, *loss);
  for (const NamedParam& p : (*model)->Params()) {
    EXPECT_TRUE(torch::equal(p.param, frozen_before[p.name])) << p.name;
  }
  const std::vector<NamedParam> after = (*trainer)->Params();
  ASSERT_EQ(after.size(), before.size());
  for (size_t i = 0; i < after.size(); ++i) {
    EXPECT_FALSE(torch::equal(after[i].param, before[i].param)) << after[i].name;
  }
}

// [Sequence-tiled MLP] reruns the projections tile by tile in backward: the factors' gradients
// are the untiled ones.
TEST(OsftModel, TiledMlpGivesTheUntiledGradients) {
  std::map<std::string, torch::Tensor> grads[2];
  for (int tiled = 0; tiled < 2; ++tiled) {
    LlamaModelOptions o = OsftModelOptions({"gate_proj", "up_proj", "down_proj", "q_proj"}, "llama");
    o.mlp_tile_rows = tiled ? 5 : -1;
    auto model = LlamaModel::Create(o);
    ASSERT_TRUE(model.ok()) << model.status();
    ASSERT_TRUE((*model)->SplitOsft().ok());
    const MicroBatch batch = Batches(6)[0];
    (*model)->Loss(batch.input_ids, batch.labels, BlockModes(4, BlockMode::kNone), nullptr)
        .backward();
    (*model)->ProjectOsftGrads();
    for (const NamedParam& p : (*model)->TrainableParams()) {
      ASSERT_TRUE(p.param.grad().defined()) << p.name;
      grads[tiled][p.name] = p.param.grad();
    }
  }
  for (const auto& [name, g] : grads[0]) EXPECT_LT(RelErr(grads[1][name], g), 1e-5) << name;
}

// The planner's price (common/osft_cost.h) counts what the agent holds after the split.
TEST(OsftTrainer, PlannerCountsAreTheModelsAfterTheSplit) {
  LlamaModelOptions o = OsftModelOptions(
      {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"}, "qwen2");
  o.osft.rank_ratio = 0.3;
  auto model = LlamaModel::Create(o);
  ASSERT_TRUE(model.ok()) << model.status();
  TrainerOptions options;
  options.grad_accum = 2;
  auto trainer = Trainer::Create(model->get(), options);
  ASSERT_TRUE(trainer.ok()) << trainer.status();
  OsftWorkload w;
  w.rank_ratio = o.osft.rank_ratio;
  w.targets = o.osft.targets;
  w.dtype_bytes = 4;
  auto cost = EstimateOsftCost(o.spec, w);
  ASSERT_TRUE(cost.ok()) << cost.status();
  int64_t frozen = 0, trainable = 0;
  for (const NamedParam& p : (*model)->Params()) frozen += p.param.numel();
  for (const NamedParam& p : (*model)->TrainableParams()) trainable += p.param.numel();
  EXPECT_EQ(frozen, cost->frozen_params);
  EXPECT_EQ(trainable, cost->trainable_params);
  ASSERT_TRUE((*trainer)->ForwardBackward(Batches(2)).ok());
  int64_t grad_bytes = 0;
  for (const NamedParam& g : (*trainer)->Grads()) grad_bytes += g.param.numel() * 4;
  EXPECT_EQ(grad_bytes, cost->grad_bytes);
}

TEST(OsftOptions, RefusesWhatItCannotRun) {
  LlamaModelOptions o = OsftModelOptions({"q_proj"}, "llama");
  o.osft.rank_ratio = 1.0;
  EXPECT_EQ(LlamaModel::Create(o).status().code(), absl::StatusCode::kInvalidArgument);
  o.osft.rank_ratio = 0.5;
  o.osft.targets = {"q_proj", "q_proj"};
  EXPECT_EQ(LlamaModel::Create(o).status().code(), absl::StatusCode::kInvalidArgument);
  o.osft.targets = {"qproj"};
  EXPECT_EQ(LlamaModel::Create(o).status().code(), absl::StatusCode::kInvalidArgument);
  o.osft.targets = {"q_proj"};
  o.lora.rank = 4;
  o.lora.targets = {"v_proj"};
  EXPECT_EQ(LlamaModel::Create(o).status().code(), absl::StatusCode::kInvalidArgument);
  o.lora = LoraOptions();
  auto model = LlamaModel::Create(o);
  ASSERT_TRUE(model.ok()) << model.status();
  TrainerOptions managed;
  managed.managed = true;
  managed.chunks.chunk_bytes = 1 << 16;
  EXPECT_EQ(Trainer::Create(model->get(), managed).status().code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace memplan
