// LoRA adapters in LlamaModel: frozen base, PEFT's initialisation and names, the grouped loss
// equal to the plain one in every block mode (dropout masks included), option validation.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <string>
#include <vector>

#include "agent/blocks/activation_offloader.h"
#include "agent/model/layers.h"
#include "agent/model/llama_model.h"
#include "common/nf4_bytes.h"

namespace memplan {
namespace {

const bool kSingleThread = [] {
  torch::set_num_threads(1);
  return true;
}();

ModelSpec TinySpec(bool tied = false) {
  ModelSpec s;
  s.name = "tiny-lora";
  s.family = "qwen2";  // qkv biases: the adapter sits beside a biased base projection
  s.hidden_size = 64;
  s.num_layers = 3;
  s.num_heads = 4;
  s.num_kv_heads = 2;
  s.intermediate_size = 96;
  s.vocab_size = 128;
  s.rope_theta = 10000.0;
  s.rms_norm_eps = 1e-5;
  s.qkv_bias = true;
  s.tie_word_embeddings = tied;
  return s;
}

LoraOptions Lora(std::vector<std::string> targets, double dropout = 0) {
  LoraOptions l;
  l.rank = 4;
  l.alpha = 8;
  l.dropout = dropout;
  l.targets = std::move(targets);
  return l;
}

std::unique_ptr<LlamaModel> MakeModel(const ModelSpec& spec, const LoraOptions& lora,
                                      uint64_t seed = 5) {
  LlamaModelOptions o;
  o.spec = spec;
  o.seed = seed;
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
  b.ids = torch::randint(128, {2, 12}, gen, torch::kLong);
  b.labels = torch::randint(128, {2, 12}, gen, torch::kLong);
  b.labels.index_put_({1, 4}, -100);
  return b;
}

// Makes B non-zero so that every adapter matters in forward and gets a gradient through A.
void PerturbAdapters(LlamaModel& model) {
  torch::NoGradGuard no_grad;
  auto gen = at::make_generator<at::CPUGeneratorImpl>(99);
  for (auto& p : model.TrainableParams())
    p.param.add_(at::empty_like(p.param).normal_(0, 0.05, gen));
}

std::map<std::string, torch::Tensor> TakeAdapterGrads(LlamaModel& model) {
  std::map<std::string, torch::Tensor> grads;
  for (auto& p : model.TrainableParams()) {
    EXPECT_TRUE(p.param.grad().defined()) << p.name;
    if (!p.param.grad().defined()) continue;
    grads[p.name] = p.param.grad().clone();
    p.param.mutable_grad().reset();
  }
  return grads;
}

// [Frozen linear] A projection whose weight does not train keeps nothing of its input for
// backward (a LoRA base module without an adapter: what the planner prices); one whose weight
// trains keeps it. The input gradient is the same either way.
TEST(LinearTest, AFrozenWeightKeepsNoInputForBackward) {
  torch::manual_seed(3);
  const torch::Tensor leaf = torch::randn({2, 8, 32}).requires_grad_();
  const torch::Tensor frozen = torch::randn({16, 32});
  const torch::Tensor trained = frozen.clone().requires_grad_();
  std::vector<torch::Tensor> input_grads;
  for (const torch::Tensor& w : {frozen, trained}) {
    SCOPED_TRACE(w.requires_grad() ? "trained" : "frozen");
    torch::Tensor x = leaf * 2;  // an intermediate: only the graph could keep it alive
    const c10::weak_intrusive_ptr<c10::StorageImpl> storage = x.storage().getWeakStorageImpl();
    const torch::Tensor y = Linear(x, w);
    x = torch::Tensor();
    EXPECT_EQ(storage.expired(), !w.requires_grad());
    leaf.mutable_grad() = torch::Tensor();
    y.square().sum().backward();
    input_grads.push_back(leaf.grad().clone());
  }
  EXPECT_TRUE(torch::equal(input_grads[0], input_grads[1]));
}

TEST(LlamaLoraTest, BaseIsFrozenAndAdaptersFollowPeftNamesShapesAndInit) {
  auto model = MakeModel(TinySpec(), Lora({"v_proj", "q_proj", "down_proj"}));
  for (const auto& p : model->Params()) EXPECT_FALSE(p.param.requires_grad()) << p.name;
  const ParamGroups groups = model->AdapterGroups();
  ASSERT_EQ(groups.size(), 5u);
  EXPECT_TRUE(groups[0].empty());
  EXPECT_TRUE(groups[4].empty());
  std::vector<std::string> names;
  for (const auto& p : groups[2]) names.push_back(p.name);
  // Module order is the block's, whatever the order of the targets.
  EXPECT_EQ(names, (std::vector<std::string>{"model.layers.1.self_attn.q_proj.lora_A.weight",
                                             "model.layers.1.self_attn.q_proj.lora_B.weight",
                                             "model.layers.1.self_attn.v_proj.lora_A.weight",
                                             "model.layers.1.self_attn.v_proj.lora_B.weight",
                                             "model.layers.1.mlp.down_proj.lora_A.weight",
                                             "model.layers.1.mlp.down_proj.lora_B.weight"}));
  EXPECT_EQ(groups[2][0].param.sizes(), (std::vector<int64_t>{4, 64}));  // A: [r, in]
  EXPECT_EQ(groups[2][3].param.sizes(), (std::vector<int64_t>{32, 4}));  // v B: [kv out, r]
  EXPECT_EQ(groups[2][4].param.sizes(), (std::vector<int64_t>{4, 96}));  // down A: [r, inter]
  EXPECT_EQ(model->TrainableParams().size(), 3u * 6u);
  for (const auto& p : model->TrainableParams()) {
    EXPECT_TRUE(p.param.requires_grad()) << p.name;
    if (p.name.find("lora_B") != std::string::npos) {
      EXPECT_EQ(p.param.abs().max().item<double>(), 0.0) << p.name;
    } else {
      // kaiming_uniform_(a = sqrt(5)): U(-1/sqrt(in), 1/sqrt(in)); the draws fill the range.
      const double bound = 1.0 / std::sqrt(static_cast<double>(p.param.size(1)));
      EXPECT_LE(p.param.abs().max().item<double>(), bound) << p.name;
      EXPECT_GT(p.param.abs().max().item<double>(), 0.8 * bound) << p.name;
    }
  }
  // Deterministic from the seed; a different seed draws different adapters.
  auto same = MakeModel(TinySpec(), Lora({"q_proj", "v_proj", "down_proj"}));
  auto other = MakeModel(TinySpec(), Lora({"q_proj", "v_proj", "down_proj"}), 6);
  EXPECT_TRUE(torch::equal(model->TrainableParams()[0].param, same->TrainableParams()[0].param));
  EXPECT_FALSE(torch::equal(model->TrainableParams()[0].param, other->TrainableParams()[0].param));
}

TEST(LlamaLoraTest, ZeroBLeavesTheBaseModelAndOnlyAdaptersGetGradients) {
  ModelSpec spec = TinySpec(/*tied=*/true);
  auto base = MakeModel(spec, LoraOptions{});
  auto lora = MakeModel(
      spec, Lora({"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"}));
  Batch b = MakeBatch(3);
  const torch::Tensor want = base->Loss(b.ids, b.labels);
  const torch::Tensor got = lora->Loss(b.ids, b.labels);
  EXPECT_TRUE(torch::allclose(want, got, 1e-6, 0))
      << want.item<double>() << " " << got.item<double>();
  got.backward();
  for (const auto& p : lora->Params()) EXPECT_FALSE(p.param.grad().defined()) << p.name;
  for (const auto& p : lora->TrainableParams()) {
    ASSERT_TRUE(p.param.grad().defined()) << p.name;
    // B = 0: A's gradient is zero, B's is not (x A^T times the upstream gradient).
    const bool is_b = p.name.find("lora_B") != std::string::npos;
    EXPECT_EQ(p.param.grad().abs().max().item<double>() > 0, is_b) << p.name;
  }
}

struct LoraModeCase {
  std::string name;
  bool tied;
  std::vector<BlockMode> modes;
};
void PrintTo(const LoraModeCase& c, std::ostream* os) { *os << c.name; }

class LoraGroupedTest : public ::testing::TestWithParam<LoraModeCase> {};

// Dropout 0.2 draws masks from the CPU generator: the grouped path (with CKPT/HS_OFFLOAD
// recomputing under the forward's RNG state) draws the same ones as the plain graph.
TEST_P(LoraGroupedTest, BitExactAgainstReferenceWithDropout) {
  const LoraModeCase& c = GetParam();
  ModelSpec spec = TinySpec(c.tied);
  auto model = MakeModel(spec, Lora({"q_proj", "v_proj", "o_proj", "up_proj", "down_proj"}, 0.2));
  PerturbAdapters(*model);
  auto offloader = ActivationOffloader::Create({});
  ASSERT_TRUE(offloader.ok());
  Batch b1 = MakeBatch(11), b2 = MakeBatch(12);

  torch::manual_seed(1234);
  torch::Tensor ref1 = model->Loss(b1.ids, b1.labels);
  (ref1 / 2).backward();
  torch::Tensor ref2 = model->Loss(b2.ids, b2.labels);
  (ref2 / 2).backward();
  auto expected = TakeAdapterGrads(*model);

  torch::manual_seed(1234);
  torch::Tensor got1 = model->Loss(b1.ids, b1.labels, c.modes, nullptr, offloader->get());
  (got1 / 2).backward();
  torch::Tensor got2 = model->Loss(b2.ids, b2.labels, c.modes, nullptr, offloader->get());
  (got2 / 2).backward();
  EXPECT_TRUE(torch::equal(ref1, got1)) << ref1.item<double>() << " vs " << got1.item<double>();
  EXPECT_TRUE(torch::equal(ref2, got2));
  auto got = TakeAdapterGrads(*model);
  ASSERT_EQ(expected.size(), got.size());
  for (const auto& [name, g] : expected) {
    EXPECT_TRUE(torch::equal(g, got[name]))
        << name << " max diff " << (g - got[name]).abs().max().item<double>();
  }
  for (const auto& p : model->Params()) EXPECT_FALSE(p.param.grad().defined()) << p.name;

  // Another seed draws other masks: the dropout is live.
  torch::manual_seed(4321);
  EXPECT_FALSE(torch::equal(ref1, model->Loss(b1.ids, b1.labels)));
}

using M = BlockMode;
INSTANTIATE_TEST_SUITE_P(
    Modes, LoraGroupedTest,
    ::testing::Values(LoraModeCase{"none", false, {M::kNone, M::kNone, M::kNone}},
                      LoraModeCase{"ckpt", false, {M::kCkpt, M::kCkpt, M::kCkpt}},
                      LoraModeCase{"swap", false, {M::kSwap, M::kSwap, M::kSwap}},
                      LoraModeCase{
                          "hs_offload", false, {M::kHsOffload, M::kHsOffload, M::kHsOffload}},
                      LoraModeCase{"mixed_tied", true, {M::kCkpt, M::kHsOffload, M::kSwap}}),
    [](const ::testing::TestParamInfo<LoraModeCase>& info) { return info.param.name; });

// [Frozen weights stay on the device] A swapped block copies its activations to the host, not
// the frozen base's projections and norms or RoPE's tables, which stay on the device for the
// whole step anyway and which the planner does not count among a block's saved bytes. Every
// activation grows with the batch: twice the rows must copy exactly twice the bytes, which a
// copied weight or table (the same at any batch) would break.
TEST(LlamaLoraTest, SwapCopiesActivationsNotTheFrozenBase) {
  for (const auto& targets : {std::vector<std::string>{"q_proj", "k_proj", "v_proj", "o_proj"},
                              std::vector<std::string>{"q_proj", "k_proj", "v_proj", "o_proj",
                                                       "gate_proj", "up_proj", "down_proj"}}) {
    SCOPED_TRACE(targets.size() == 4 ? "attention adapters" : "all adapters");
    auto model = MakeModel(TinySpec(), Lora(targets));
    PerturbAdapters(*model);
    std::vector<int64_t> copied;
    for (int64_t rows : {2, 4}) {
      auto offloader = ActivationOffloader::Create({});
      ASSERT_TRUE(offloader.ok());
      auto gen = at::make_generator<at::CPUGeneratorImpl>(7);
      const torch::Tensor ids = torch::randint(128, {rows, 12}, gen, torch::kLong);
      const torch::Tensor labels = torch::randint(128, {rows, 12}, gen, torch::kLong);
      model
          ->Loss(ids, labels, {BlockMode::kSwap, BlockMode::kSwap, BlockMode::kSwap}, nullptr,
                 offloader->get())
          .backward();
      copied.push_back((*offloader)->Stats().offloaded_bytes);
      for (auto& p : model->TrainableParams()) p.param.mutable_grad().reset();
    }
    EXPECT_GT(copied[0], 0);
    EXPECT_EQ(copied[1], 2 * copied[0]) << "at 2 rows " << copied[0] << " bytes";
  }
}

TEST(LlamaLoraTest, LogitsRunWithoutDropout) {
  auto model = MakeModel(TinySpec(), Lora({"q_proj", "up_proj"}, 0.5));
  PerturbAdapters(*model);
  Batch b = MakeBatch(4);
  torch::NoGradGuard no_grad;
  torch::manual_seed(1);
  const torch::Tensor a = model->Logits(b.ids);
  torch::manual_seed(2);
  EXPECT_TRUE(torch::equal(a, model->Logits(b.ids)));
}

TEST(LlamaLoraTest, InvalidOptionsNameTheFieldAndRange) {
  struct Bad {
    LoraOptions lora;
    std::string message;
  };
  std::vector<Bad> cases;
  LoraOptions l = Lora({"q_proj"});
  l.rank = 65;
  cases.push_back({l, "lora.rank = 65; allowed: 1 to hidden_size (64)"});
  l = Lora({"q_proj"});
  l.alpha = 0;
  cases.push_back({l, "lora.alpha = 0"});
  l = Lora({"q_proj"}, 1.0);
  cases.push_back({l, "lora.dropout = 1; allowed: 0 <= dropout < 1"});
  l = Lora({"q_proj", "qkv"});
  cases.push_back({l, "lora.targets has 'qkv'"});
  l = Lora({"q_proj", "q_proj"});
  cases.push_back({l, "lora.targets lists 'q_proj' twice"});
  l = Lora({});
  cases.push_back({l, "lora.targets is empty"});
  for (const Bad& c : cases) {
    LlamaModelOptions o;
    o.spec = TinySpec();
    o.lora = c.lora;
    const auto model = LlamaModel::Create(o);
    ASSERT_FALSE(model.ok()) << c.message;
    EXPECT_EQ(model.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(model.status().message().find(c.message), std::string::npos) << model.status();
  }
  auto all = ParseLoraTargetList("--lora-targets", "all");
  ASSERT_TRUE(all.ok());
  EXPECT_EQ(all->size(), 7u);
  auto some = ParseLoraTargetList("--lora-targets", "q_proj, v_proj");
  ASSERT_TRUE(some.ok());
  EXPECT_EQ(*some, (std::vector<std::string>{"q_proj", "v_proj"}));
  auto bad = ParseLoraTargetList("--lora-targets", "q_proj,attn");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("--lora-targets: unknown module 'attn'"),
            std::string::npos);
  // The planner's query spells the same method, modules in canonical order.
  const TrainingMethod method = LoraTrainingMethod(Lora({"v_proj", "q_proj"}));
  EXPECT_EQ(method.kind, TrainingKind::kLora);
  EXPECT_EQ(method.lora_rank, 4);
  EXPECT_EQ(method.lora_target_modules, (std::vector<std::string>{"q_proj", "v_proj"}));
  LoraOptions q = Lora({"v_proj", "q_proj"});
  q.nf4_base = true;
  EXPECT_EQ(LoraTrainingMethod(q).kind, TrainingKind::kQlora);
}

// [QLoRA] The NF4 base: its parameters are the three parts of every projection in the planner's
// [QLoRA layout], frozen; the model computes exactly what a LoRA model computes on the
// dequantized weights (fp32: same ops on the same values), plain and grouped in every block mode.
LoraOptions Qlora(std::vector<std::string> targets, double dropout = 0) {
  LoraOptions l = Lora(std::move(targets), dropout);
  l.nf4_base = true;
  return l;
}

// A LoRA model (same seed, same adapters) whose projection weights are `qlora`'s dequantized.
std::unique_ptr<LlamaModel> DequantizedTwin(LlamaModel& qlora, LoraOptions lora) {
  lora.nf4_base = false;
  auto twin = MakeModel(qlora.spec(), lora);
  std::vector<NamedParam> values;
  for (const auto& p : qlora.Params()) values.push_back({p.name, p.param.detach()});
  auto base = qlora.DequantizedBase(values);
  EXPECT_TRUE(base.ok()) << base.status();
  std::map<std::string, torch::Tensor> by_name;
  for (const auto& p : *base) by_name[p.name] = p.param;
  torch::NoGradGuard no_grad;
  for (const auto& p : twin->Params()) {
    EXPECT_TRUE(by_name.count(p.name)) << p.name;
    if (by_name.count(p.name)) p.param.copy_(by_name[p.name]);
  }
  for (size_t i = 0; i < twin->TrainableParams().size(); ++i) {
    twin->TrainableParams()[i].param.copy_(qlora.TrainableParams()[i].param);
  }
  return twin;
}

TEST(LlamaQloraTest, BaseIsNf4PartsInTheQloraLayout) {
  const ModelSpec spec = TinySpec(/*tied=*/true);
  auto model = MakeModel(spec, Qlora({"q_proj", "down_proj"}));
  const std::vector<LayoutParam> layout = QloraBaseLayoutParams(spec, 4);
  const ParamGroups groups = model->ParamGroups();
  std::vector<std::string> names;
  for (const auto& g : groups) {
    for (const auto& p : g) names.push_back(p.name);
  }
  names.pop_back();  // the tied head lists the embedding again
  ASSERT_EQ(names.size(), layout.size());
  for (size_t i = 0; i < layout.size(); ++i) EXPECT_EQ(names[i], layout[i].name) << i;
  int parts = 0;
  for (const auto& p : model->Params()) {
    EXPECT_FALSE(p.param.requires_grad()) << p.name;
    const auto it = std::find_if(layout.begin(), layout.end(),
                                 [&p](const LayoutParam& l) { return l.name == p.name; });
    ASSERT_NE(it, layout.end()) << p.name;
    EXPECT_EQ(p.param.numel(), it->numel) << p.name;
    EXPECT_EQ(p.param.element_size(), it->dtype_bytes) << p.name;
    parts += p.name.find(".nf4_") != std::string::npos ? 1 : 0;
  }
  EXPECT_EQ(parts, 3 * 7 * spec.num_layers);
  EXPECT_EQ(model->QuantizedWeightNames().size(), 7u * spec.num_layers);
  EXPECT_EQ(model->QuantizedWeightNames()[0], "model.layers.0.self_attn.q_proj.weight");
  // The dequantized weights are close to the drawn ones (NF4's error, not another weight).
  auto plain = MakeModel(spec, Lora({"q_proj", "down_proj"}));
  std::vector<NamedParam> values;
  for (const auto& p : model->Params()) values.push_back({p.name, p.param.detach()});
  auto base = model->DequantizedBase(values);
  ASSERT_TRUE(base.ok()) << base.status();
  ASSERT_EQ(base->size(), plain->Params().size());
  for (size_t i = 0; i < base->size(); ++i) {
    EXPECT_EQ((*base)[i].name, plain->Params()[i].name);
    const torch::Tensor want = plain->Params()[i].param;
    const double err = ((*base)[i].param - want).abs().max().item<double>();
    EXPECT_LE(err, 0.2 * want.abs().max().item<double>() + 1e-12) << (*base)[i].name;
  }
}

TEST(LlamaQloraTest, LoadQuantizedWeightEqualsQuantizingAtCreation) {
  const ModelSpec spec = TinySpec();
  auto want = MakeModel(spec, Qlora({"v_proj"}));
  auto got = MakeModel(spec, Qlora({"v_proj"}), /*seed=*/6);
  auto plain = MakeModel(spec, Lora({"v_proj"}));  // seed 5: the values `want` quantized
  std::map<std::string, torch::Tensor> source;
  for (const auto& p : plain->Params()) source[p.name] = p.param.detach();
  for (const std::string& name : got->QuantizedWeightNames()) {
    ASSERT_TRUE(got->LoadQuantizedWeight(name, source[name]).ok()) << name;
  }
  const auto w = want->Params(), g = got->Params();
  ASSERT_EQ(w.size(), g.size());
  for (size_t i = 0; i < w.size(); ++i) {
    if (w[i].name.find(".nf4_") == std::string::npos) continue;
    EXPECT_TRUE(torch::equal(w[i].param, g[i].param)) << w[i].name;
  }
  EXPECT_EQ(got->LoadQuantizedWeight("model.layers.0.input_layernorm.weight", source["x"]).code(),
            absl::StatusCode::kNotFound);
  const absl::Status wrong =
      got->LoadQuantizedWeight("model.layers.0.mlp.up_proj.weight", torch::zeros({3, 3}));
  EXPECT_EQ(wrong.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(wrong.message().find("[96, 64]"), std::string::npos) << wrong.message();
}

class QloraGroupedTest : public ::testing::TestWithParam<LoraModeCase> {};

TEST_P(QloraGroupedTest, EqualsLoraOnTheDequantizedBase) {
  const LoraModeCase& c = GetParam();
  const LoraOptions lora =
      Qlora({"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"}, 0.2);
  auto qlora = MakeModel(TinySpec(c.tied), lora);
  PerturbAdapters(*qlora);
  auto twin = DequantizedTwin(*qlora, lora);
  auto offloader = ActivationOffloader::Create({});
  ASSERT_TRUE(offloader.ok());
  const Batch b = MakeBatch(21);

  torch::manual_seed(1234);
  const torch::Tensor want = twin->Loss(b.ids, b.labels);
  want.backward();
  torch::manual_seed(1234);
  const torch::Tensor got = qlora->Loss(b.ids, b.labels, c.modes, nullptr, offloader->get());
  got.backward();
  EXPECT_NEAR(got.item<double>(), want.item<double>(), 1e-6 * std::abs(want.item<double>()));
  auto expected = TakeAdapterGrads(*twin);
  auto grads = TakeAdapterGrads(*qlora);
  ASSERT_EQ(expected.size(), grads.size());
  for (const auto& [name, g] : expected) {
    // fp32: the same GEMMs on the same weights; rounding differences only.
    EXPECT_TRUE(torch::allclose(grads[name], g, 1e-5, 1e-7))
        << name << " max diff " << (g - grads[name]).abs().max().item<double>();
  }
  for (const auto& p : qlora->Params()) EXPECT_FALSE(p.param.grad().defined()) << p.name;
}

INSTANTIATE_TEST_SUITE_P(
    Modes, QloraGroupedTest,
    ::testing::Values(LoraModeCase{"none", false, {M::kNone, M::kNone, M::kNone}},
                      LoraModeCase{"ckpt", false, {M::kCkpt, M::kCkpt, M::kCkpt}},
                      LoraModeCase{"mixed_tied", true, {M::kCkpt, M::kHsOffload, M::kSwap}}),
    [](const ::testing::TestParamInfo<LoraModeCase>& info) { return info.param.name; });

TEST(LlamaQloraTest, Nf4BaseNeedsAdaptersAndMayBeDeferred) {
  LlamaModelOptions o;
  o.spec = TinySpec();
  o.lora.nf4_base = true;
  auto no_rank = LlamaModel::Create(o);
  ASSERT_FALSE(no_rank.ok());
  EXPECT_NE(no_rank.status().message().find("lora.rank must be >= 1"), std::string::npos);
  // [Sharded NF4 loading] deferred: the NF4 parts have their [NF4 storage] shapes and no values;
  // the quantized weights' initial values are drawn by name, as the whole model's are.
  o.lora = Qlora({"q_proj"});
  auto whole = LlamaModel::Create(o);
  ASSERT_TRUE(whole.ok()) << whole.status();
  o.deferred_values = true;
  auto deferred = LlamaModel::Create(o);
  ASSERT_TRUE(deferred.ok()) << deferred.status();
  const std::vector<NamedParam> a = (*whole)->Params(), b = (*deferred)->Params();
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i].name, b[i].name);
    EXPECT_EQ(a[i].param.sizes(), b[i].param.sizes()) << a[i].name;
    EXPECT_EQ(a[i].param.scalar_type(), b[i].param.scalar_type()) << a[i].name;
  }
  const std::string weight = "model.layers.1.mlp.down_proj.weight";
  auto value = (*deferred)->InitialValues(weight, 0, 64 * 96);
  ASSERT_TRUE(value.ok()) << value.status();
  auto q = quant::QuantizeNf4(value->view({64, 96}));
  ASSERT_TRUE(q.ok()) << q.status();
  for (const NamedParam& p : a) {
    if (p.name == weight + ".nf4_data") {
      EXPECT_TRUE(torch::equal(p.param, q->data));
    }
  }
  EXPECT_TRUE((*deferred)->SetQuantizedOffset(weight, q->absmax_offset).ok());
  EXPECT_EQ((*deferred)->SetQuantizedOffset("model.norm.weight", 0).code(),
            absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace memplan
