#include "agent/model/llama_model.h"
#include "agent/model/normal_draw.h"

#include <gtest/gtest.h>

#include <set>
#include <string>
#include <vector>

#include "agent/blocks/activation_offloader.h"

namespace memplan {
namespace {

// The CI machine is shared; a single intra-op thread avoids OpenMP spin contention. Both sides of
// every comparison run with the same setting.
const bool kSingleThread = [] {
  torch::set_num_threads(1);
  return true;
}();

ModelSpec TinySpec(const std::string& family = "llama") {
  ModelSpec s;
  s.name = "tiny-" + family;
  s.family = family;
  s.hidden_size = 64;
  s.num_layers = 4;
  s.num_heads = 4;
  s.num_kv_heads = 2;
  s.intermediate_size = 96;
  s.vocab_size = 128;
  s.rope_theta = 10000.0;
  s.rms_norm_eps = 1e-5;
  if (family == "qwen2") s.qkv_bias = true;
  if (family == "qwen3") {
    s.qk_norm = true;
    s.head_dim = 32;  // Qwen3 decouples head_dim from hidden / heads
  }
  return s;
}

std::unique_ptr<LlamaModel> MakeModel(const ModelSpec& spec, uint64_t seed = 1) {
  LlamaModelOptions options;
  options.spec = spec;
  options.seed = seed;
  auto model = LlamaModel::Create(options);
  EXPECT_TRUE(model.ok()) << model.status();
  return std::move(model).value();
}

struct Batch {
  torch::Tensor ids;
  torch::Tensor labels;
};

Batch MakeBatch(int64_t vocab, uint64_t seed, int64_t batch = 2, int64_t seq = 16) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  Batch b;
  b.ids = torch::randint(vocab, {batch, seq}, gen, torch::kLong);
  b.labels = b.ids.clone();
  b.labels.index_put_({0, 3}, -100);  // an ignored position
  return b;
}

// name -> gradient (cloned), and resets .grad.
std::map<std::string, torch::Tensor> TakeGrads(LlamaModel& model) {
  std::map<std::string, torch::Tensor> grads;
  for (auto& p : model.Params()) {
    EXPECT_TRUE(p.param.grad().defined()) << p.name;
    if (!p.param.grad().defined()) continue;
    grads[p.name] = p.param.grad().clone();
    p.param.mutable_grad().reset();
  }
  return grads;
}

void ExpectSameGrads(const std::map<std::string, torch::Tensor>& expected,
                     const std::map<std::string, torch::Tensor>& got) {
  ASSERT_EQ(expected.size(), got.size());
  for (const auto& [name, g] : expected) {
    auto it = got.find(name);
    ASSERT_NE(it, got.end()) << name;
    EXPECT_TRUE(torch::equal(g, it->second))
        << name << " max diff " << (g - it->second).abs().max().item<double>();
  }
}

TEST(LlamaModelTest, HuggingFaceNamesAndGroups) {
  auto model = MakeModel(TinySpec("qwen2"));
  auto groups = model->ParamGroups();
  ASSERT_EQ(groups.size(), 6u);
  EXPECT_EQ(groups[0][0].name, "model.embed_tokens.weight");
  std::vector<std::string> block0;
  for (const auto& p : groups[1]) block0.push_back(p.name);
  EXPECT_EQ(block0,
            (std::vector<std::string>{
                "model.layers.0.self_attn.q_proj.weight", "model.layers.0.self_attn.q_proj.bias",
                "model.layers.0.self_attn.k_proj.weight", "model.layers.0.self_attn.k_proj.bias",
                "model.layers.0.self_attn.v_proj.weight", "model.layers.0.self_attn.v_proj.bias",
                "model.layers.0.self_attn.o_proj.weight", "model.layers.0.mlp.gate_proj.weight",
                "model.layers.0.mlp.up_proj.weight", "model.layers.0.mlp.down_proj.weight",
                "model.layers.0.input_layernorm.weight",
                "model.layers.0.post_attention_layernorm.weight"}));
  EXPECT_EQ(groups[5][0].name, "model.norm.weight");
  EXPECT_EQ(groups[5][1].name, "lm_head.weight");
  EXPECT_EQ(groups[1][2].param.sizes(), (std::vector<int64_t>{2 * 16, 64}));  // kv heads
}

TEST(LlamaModelTest, TiedHeadListsTheEmbeddingTwiceButParamsOnce) {
  ModelSpec spec = TinySpec();
  spec.tie_word_embeddings = true;
  auto model = MakeModel(spec);
  auto groups = model->ParamGroups();
  EXPECT_EQ(groups.back().back().name, "model.embed_tokens.weight");
  EXPECT_TRUE(groups.back().back().param.is_same(groups[0][0].param));
  std::set<std::string> names;
  for (const auto& p : model->Params()) EXPECT_TRUE(names.insert(p.name).second) << p.name;
  EXPECT_EQ(names.count("lm_head.weight"), 0u);
}

TEST(LlamaModelTest, InitIsDeterministicAndHasTheDocumentedStatistics) {
  auto a = MakeModel(TinySpec("qwen3"), 7);
  auto b = MakeModel(TinySpec("qwen3"), 7);
  auto c = MakeModel(TinySpec("qwen3"), 8);
  auto pa = a->Params(), pb = b->Params(), pc = c->Params();
  ASSERT_EQ(pa.size(), pb.size());
  for (size_t i = 0; i < pa.size(); ++i) EXPECT_TRUE(torch::equal(pa[i].param, pb[i].param));
  EXPECT_FALSE(torch::equal(pa[0].param, pc[0].param));
  const torch::Tensor embed = pa[0].param.detach();
  EXPECT_NEAR(embed.std().item<double>(), 0.02, 0.002);
  for (const auto& p : pa) {
    if (p.name.find("norm") != std::string::npos) {
      EXPECT_TRUE(torch::equal(p.param, torch::ones_like(p.param))) << p.name;
    }
  }
}

// [Sharded loading] InitialValues gives any range of any parameter exactly as Create draws it,
// from a model created on kMeta (no values) as from a materialised one, in the model dtype.
TEST(LlamaModelTest, InitialValuesAreCreatesValuesForAnyRange) {
  for (const std::string family : {"llama", "qwen2", "qwen3"}) {
    for (const DType dtype : {DType::kFloat32, DType::kBFloat16}) {
      SCOPED_TRACE(family + " " + std::string(DTypeName(dtype)));
      LlamaModelOptions options;
      options.spec = TinySpec(family);
      options.seed = 5;
      options.dtype = dtype;
      auto real = LlamaModel::Create(options);
      options.deferred_values = true;
      auto deferred = LlamaModel::Create(options);
      options.param_device = torch::kMeta;
      auto meta = LlamaModel::Create(options);
      ASSERT_TRUE(real.ok() && meta.ok() && deferred.ok());
      // Deferred parameters have their shapes and no memory of their own.
      const std::vector<NamedParam> deferred_params = (*deferred)->Params();
      ASSERT_EQ(deferred_params.size(), (*real)->Params().size());
      for (size_t i = 0; i < deferred_params.size(); ++i) {
        const torch::Tensor& t = deferred_params[i].param;
        EXPECT_EQ(t.storage().nbytes(), static_cast<size_t>(t.element_size())) << i;
        EXPECT_EQ(t.sizes(), (*real)->Params()[i].param.sizes()) << i;
        EXPECT_EQ(t.scalar_type(), (*real)->Params()[i].param.scalar_type()) << i;
      }
      const std::vector<NamedParam> params = (*real)->Params();
      ASSERT_EQ(params.size(), (*meta)->Params().size());
      for (const NamedParam& p : params) {
        EXPECT_TRUE((*meta)->Params()[&p - params.data()].param.is_meta());
        const torch::Tensor flat = p.param.detach().reshape({-1});
        const int64_t n = flat.numel();
        for (const auto& [begin, len] : std::vector<std::pair<int64_t, int64_t>>{
                 {0, n}, {n / 3, n / 2}, {n - 1, 1}, {0, 0}}) {
          for (LlamaModel* m : {real->get(), meta->get(), deferred->get()}) {
            absl::StatusOr<torch::Tensor> got = m->InitialValues(p.name, begin, len);
            ASSERT_TRUE(got.ok()) << p.name << ": " << got.status();
            EXPECT_EQ(got->scalar_type(), flat.scalar_type());
            EXPECT_TRUE(torch::equal(*got, flat.narrow(0, begin, len))) << p.name;
          }
        }
      }
      EXPECT_EQ((*meta)->InitialValues("no.such.weight", 0, 1).status().code(),
                absl::StatusCode::kNotFound);
      const int64_t n = params[0].param.numel();
      EXPECT_EQ((*meta)->InitialValues(params[0].name, n - 1, 2).status().code(),
                absl::StatusCode::kOutOfRange);
    }
  }
}

// [Segmented draws] A parameter of more than 2^22 elements (here the embedding: three segments)
// is drawn by segments: any range, across segment boundaries too, is what Create gives it, and
// the segments are draws of their own (not one segment repeated).
TEST(LlamaModelTest, InitialValuesOfASegmentedDrawAreCreatesValues) {
  constexpr int64_t kSegment = kDrawSegment;
  LlamaModelOptions options;
  options.spec = TinySpec("llama");
  options.spec.vocab_size = 2 * kSegment / options.spec.hidden_size + 7;
  options.seed = 11;
  auto real = LlamaModel::Create(options);
  options.param_device = torch::kMeta;
  auto meta = LlamaModel::Create(options);
  ASSERT_TRUE(real.ok() && meta.ok());
  const NamedParam embed = (*real)->Params()[0];
  const torch::Tensor flat = embed.param.detach().reshape({-1});
  const int64_t n = flat.numel();
  ASSERT_GT(n, 2 * kSegment);
  for (const auto& [begin, len] : std::vector<std::pair<int64_t, int64_t>>{
           {0, n}, {kSegment - 5, 10}, {kSegment, kSegment}, {kSegment / 2, kSegment + 100},
           {n - 3, 3}}) {
    absl::StatusOr<torch::Tensor> got = (*meta)->InitialValues(embed.name, begin, len);
    ASSERT_TRUE(got.ok()) << got.status();
    EXPECT_TRUE(torch::equal(*got, flat.narrow(0, begin, len))) << begin << " " << len;
  }
  EXPECT_FALSE(torch::equal(flat.narrow(0, 0, 1024), flat.narrow(0, kSegment, 1024)));
  EXPECT_NEAR(flat.std().item<double>(), 0.02, 1e-4);
}

// The threads that draw the segments do not change the values; a range inside one segment is
// that segment's elements.
TEST(NormalDrawTest, ThreadsDoNotChangeTheValues) {
  const int64_t n = 3 * kDrawSegment + 17;
  const torch::Tensor one = DrawNormalRange(9, n, 0, n, 1);
  EXPECT_TRUE(torch::equal(one, DrawNormalRange(9, n, 0, n, 4)));
  EXPECT_TRUE(torch::equal(one.narrow(0, kDrawSegment + 3, 5),
                           DrawNormalRange(9, n, kDrawSegment + 3, 5, 3)));
  EXPECT_FALSE(torch::equal(one, DrawNormalRange(10, n, 0, n, 4)));
}

// A draw in bf16 (or fp16) is the fp32 draw rounded as torch rounds it, whole or in part, on any
// number of threads.
TEST(NormalDrawTest, ADrawInBf16IsTheFp32DrawRounded) {
  const int64_t n = 2 * kDrawSegment + 29;
  const torch::Tensor fp32 = DrawNormalRange(5, n, 0, n, 2);
  EXPECT_TRUE(torch::equal(DrawNormalRange(5, n, 0, n, 3, torch::kBFloat16),
                           fp32.to(torch::kBFloat16)));
  const int64_t begin = kDrawSegment - 7, len = kDrawSegment + 20;
  const torch::Tensor part = DrawNormalRange(5, n, begin, len, 2, torch::kBFloat16);
  EXPECT_EQ(part.scalar_type(), torch::kBFloat16);
  EXPECT_TRUE(torch::equal(part, fp32.narrow(0, begin, len).to(torch::kBFloat16)));
  EXPECT_TRUE(torch::equal(DrawNormalRange(5, n, begin, len, 3, torch::kHalf),
                           fp32.narrow(0, begin, len).to(torch::kHalf)));
  // A range inside one fp32 segment that does not cover it (the segment is drawn whole).
  EXPECT_TRUE(torch::equal(DrawNormalRange(5, n, 11, 100, 1), fp32.narrow(0, 11, 100)));
}

TEST(LlamaModelTest, RejectsInvalidSpec) {
  ModelSpec spec = TinySpec();
  spec.num_kv_heads = 3;
  LlamaModelOptions options;
  options.spec = spec;
  EXPECT_EQ(LlamaModel::Create(options).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(LlamaModelTest, UntrainedLossIsNearLogVocab) {
  auto model = MakeModel(TinySpec());
  Batch b = MakeBatch(128, 3);
  const double loss = model->Loss(b.ids, b.labels).item<double>();
  EXPECT_NEAR(loss, std::log(128.0), 0.3);
}

TEST(LlamaModelTest, IgnoredLabelsDoNotContribute) {
  auto model = MakeModel(TinySpec());
  Batch b = MakeBatch(128, 3);
  torch::Tensor all_ignored = torch::full_like(b.labels, -100);
  all_ignored.index_put_({0, 5}, b.labels.index({0, 5}));
  // Only position 5 has a target: changing any other target changes nothing.
  torch::Tensor changed = all_ignored.clone();
  changed.index_put_({1, 7}, -100);
  EXPECT_TRUE(torch::equal(model->Loss(b.ids, all_ignored), model->Loss(b.ids, changed)));
}

// Grouped loss + gradients against the plain-autograd reference, bit for bit.
using M = BlockMode;

struct ModeCase {
  std::string name;
  std::string family;
  bool tied;
  std::vector<BlockMode> modes;
};

// Readable parameter names in test output and ctest.
void PrintTo(const ModeCase& c, std::ostream* os) { *os << c.name; }

class GroupedLossTest : public ::testing::TestWithParam<ModeCase> {};

TEST_P(GroupedLossTest, BitExactAgainstReference) {
  const ModeCase& c = GetParam();
  ModelSpec spec = TinySpec(c.family);
  spec.tie_word_embeddings = c.tied;
  auto model = MakeModel(spec);
  auto offloader = ActivationOffloader::Create({});
  ASSERT_TRUE(offloader.ok());

  // Two micro-batches accumulated: also checks accumulation order into .grad.
  Batch b1 = MakeBatch(spec.vocab_size, 21);
  Batch b2 = MakeBatch(spec.vocab_size, 22);
  torch::Tensor ref1 = model->Loss(b1.ids, b1.labels);
  (ref1 / 2).backward();
  torch::Tensor ref2 = model->Loss(b2.ids, b2.labels);
  (ref2 / 2).backward();
  auto expected = TakeGrads(*model);

  torch::Tensor got1 = model->Loss(b1.ids, b1.labels, c.modes, nullptr, offloader->get());
  (got1 / 2).backward();
  torch::Tensor got2 = model->Loss(b2.ids, b2.labels, c.modes, nullptr, offloader->get());
  (got2 / 2).backward();
  EXPECT_TRUE(torch::equal(ref1, got1)) << ref1.item<double>() << " vs " << got1.item<double>();
  EXPECT_TRUE(torch::equal(ref2, got2));
  ExpectSameGrads(expected, TakeGrads(*model));
  EXPECT_EQ((*offloader)->Stats().host_bytes, 0);
  bool offloads = false;
  for (BlockMode m : c.modes) offloads = offloads || m == M::kSwap || m == M::kHsOffload;
  EXPECT_EQ((*offloader)->Stats().offloaded_bytes > 0, offloads);
}

INSTANTIATE_TEST_SUITE_P(
    Modes, GroupedLossTest,
    ::testing::Values(
        ModeCase{"none", "llama", false, {M::kNone, M::kNone, M::kNone, M::kNone}},
        ModeCase{"ckpt", "llama", false, {M::kCkpt, M::kCkpt, M::kCkpt, M::kCkpt}},
        ModeCase{"swap", "llama", false, {M::kSwap, M::kSwap, M::kSwap, M::kSwap}},
        ModeCase{"hs_offload",
                 "llama",
                 false,
                 {M::kHsOffload, M::kHsOffload, M::kHsOffload, M::kHsOffload}},
        ModeCase{"mixed", "llama", false, {M::kSwap, M::kHsOffload, M::kCkpt, M::kNone}},
        ModeCase{"mixed_tied", "llama", true, {M::kHsOffload, M::kCkpt, M::kSwap, M::kNone}},
        ModeCase{"none_tied", "llama", true, {M::kNone, M::kNone, M::kNone, M::kNone}},
        ModeCase{"qwen2_mixed", "qwen2", false, {M::kCkpt, M::kSwap, M::kHsOffload, M::kNone}},
        ModeCase{"qwen3_mixed", "qwen3", true, {M::kSwap, M::kCkpt, M::kNone, M::kHsOffload}},
        ModeCase{"mistral_swap", "mistral", false, {M::kSwap, M::kSwap, M::kNone, M::kNone}}),
    [](const auto& info) { return info.param.name; });

// [Chunked head]: the LM head + loss over 5 tokens at a time (uneven last chunk, an ignored
// target) gives the unchunked loss and gradients within fp32 rounding, plain and grouped, tied and
// untied; and, where a row chunk holds the whole micro-batch, the plain path bit for bit.
TEST(LlamaModelTest, ChunkedHeadMatchesTheFullLogits) {
  for (const bool tied : {false, true}) {
    ModelSpec spec = TinySpec();
    spec.tie_word_embeddings = tied;
    Batch b = MakeBatch(spec.vocab_size, 11, 2, 13);
    b.labels.index_put_({1, 12}, -100);
    auto full = MakeModel(spec, 3);
    const torch::Tensor want = full->Loss(b.ids, b.labels);
    want.backward();
    const auto want_grads = TakeGrads(*full);

    for (const bool grouped : {false, true}) {
      LlamaModelOptions options;
      options.spec = spec;
      options.seed = 3;
      options.head_chunk_rows = 5;
      auto chunked = LlamaModel::Create(options);
      ASSERT_TRUE(chunked.ok()) << chunked.status();
      const torch::Tensor got =
          grouped ? (*chunked)->Loss(b.ids, b.labels,
                                     std::vector<BlockMode>((*chunked)->num_blocks(), M::kCkpt),
                                     nullptr)
                  : (*chunked)->Loss(b.ids, b.labels);
      got.backward();
      EXPECT_NEAR(got.item<double>(), want.item<double>(), 1e-6 * want.item<double>())
          << "tied " << tied << " grouped " << grouped;
      for (const auto& [name, g] : TakeGrads(**chunked)) {
        const torch::Tensor& w = want_grads.at(name);
        const double err = (g - w).abs().max().item<double>() / w.abs().max().item<double>();
        EXPECT_LT(err, 1e-5) << name << " tied " << tied << " grouped " << grouped;
      }
    }
  }
}

TEST(LlamaModelTest, WrongNumberOfModesThrows) {
  auto model = MakeModel(TinySpec());
  Batch b = MakeBatch(128, 3);
  EXPECT_THROW(model->Loss(b.ids, b.labels, {BlockMode::kNone}, nullptr), c10::Error);
}

TEST(LlamaModelTest, DefaultOffloaderIsCreatedWhenNeeded) {
  auto model = MakeModel(TinySpec());
  Batch b = MakeBatch(128, 3);
  torch::Tensor ref = model->Loss(b.ids, b.labels);
  torch::Tensor got =
      model->Loss(b.ids, b.labels, std::vector<BlockMode>(4, BlockMode::kSwap), nullptr);
  EXPECT_TRUE(torch::equal(ref, got));
}

}  // namespace
}  // namespace memplan
