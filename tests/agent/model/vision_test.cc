// Qwen2.5-VL in the agent's model: M-RoPE positions (agent/model/mrope.h), the vision tower
// (agent/model/vision_tower.h) and LlamaModel's image inputs. Parity with transformers is
// tests/parity/vl_parity_test.py; here: positions by hand, grouped == plain bit for bit with
// images in every block mode, the tower's checkpointed blocks == its kept ones, and the refusals.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "agent/blocks/group_runner.h"
#include "agent/model/llama_model.h"
#include "agent/model/mrope.h"
#include "agent/model/vision_tower.h"
#include "common/param_shapes.h"
#include "tests/agent/tiny_spec.h"

namespace memplan {
namespace {

const bool kSingleThread = [] {
  torch::set_num_threads(1);
  return true;
}();

constexpr int64_t kImage = testing::kTinyVlImage, kVideo = testing::kTinyVlVideo,
                  kStart = testing::kTinyVlStart, kEnd = testing::kTinyVlEnd;

ModelSpec VlSpec() { return testing::TinyVlSpec(3); }

// Two images: 6x10 patches (3x5 merged: windows of 2x2, 2x1, 1x2, 1x1 cells) and 4x4 patches.
VisionInputs TwoImages(const ModelSpec& s) {
  VisionInputs in;
  in.image_grid_thw = torch::tensor({1, 6, 10, 1, 4, 4}, torch::kLong).view({2, 3});
  auto gen = at::make_generator<at::CPUGeneratorImpl>(7);
  in.pixel_values = torch::randn({60 + 16, s.vision.PatchDim()}, gen);
  return in;
}

// Row 0: text, image 0 (15 tokens), text; row 1: text, image 1 (4 tokens), text.
std::vector<int64_t> Row(int64_t before, int64_t image_tokens, int64_t after, int64_t seq) {
  std::vector<int64_t> row;
  for (int64_t i = 0; i < before; ++i) row.push_back(1 + i % 80);
  row.push_back(kStart);
  for (int64_t i = 0; i < image_tokens; ++i) row.push_back(kImage);
  row.push_back(kEnd);
  for (int64_t i = 0; i < after; ++i) row.push_back(3 + i % 70);
  while (static_cast<int64_t>(row.size()) < seq) row.push_back(5);
  return row;
}

torch::Tensor Ids() {
  std::vector<int64_t> a = Row(2, 15, 3, 24), b = Row(5, 4, 2, 24);
  a.insert(a.end(), b.begin(), b.end());
  return torch::tensor(a, torch::kLong).view({2, 24});
}

TEST(MropeTest, PositionsAsGetRopeIndex) {
  const ModelSpec s = VlSpec();
  const torch::Tensor ids = Ids();
  absl::StatusOr<torch::Tensor> p = MropePositions(s, ids, TwoImages(s).image_grid_thw);
  ASSERT_TRUE(p.ok()) << p.status();
  ASSERT_EQ(p->sizes(), (std::vector<int64_t>{3, 2, 24}));
  // Row 0: text 0..2 (two tokens and vision_start), image at 3 (3 rows x 5 columns), text resumes
  // at 3 + max(6, 10) / 2 = 8.
  for (int64_t c = 0; c < 3; ++c) {
    for (int64_t t = 0; t < 3; ++t) EXPECT_EQ((*p)[c][0][t].item<int64_t>(), t);
  }
  for (int64_t k = 0; k < 15; ++k) {
    EXPECT_EQ((*p)[0][0][3 + k].item<int64_t>(), 3);
    EXPECT_EQ((*p)[1][0][3 + k].item<int64_t>(), 3 + k / 5);
    EXPECT_EQ((*p)[2][0][3 + k].item<int64_t>(), 3 + k % 5);
  }
  for (int64_t c = 0; c < 3; ++c) EXPECT_EQ((*p)[c][0][18].item<int64_t>(), 8);  // vision_end
  // Row 1 starts over at 0 and uses image 1: 2x2 cells at 6, text resumes at 8.
  EXPECT_EQ((*p)[1][1][6 + 3].item<int64_t>(), 7);
  EXPECT_EQ((*p)[2][1][6 + 3].item<int64_t>(), 7);
  for (int64_t c = 0; c < 3; ++c) EXPECT_EQ((*p)[c][1][10].item<int64_t>(), 8);

  // Without images the three streams are the plain positions.
  absl::StatusOr<torch::Tensor> text =
      MropePositions(s, torch::full({1, 5}, 4, torch::kLong), torch::Tensor());
  ASSERT_TRUE(text.ok());
  EXPECT_TRUE(torch::equal(*text, torch::arange(5).expand({3, 1, 5})));
}

TEST(MropeTest, RunsAndGridsMustAgree) {
  const ModelSpec s = VlSpec();
  const torch::Tensor grids = TwoImages(s).image_grid_thw;
  torch::Tensor ids = Ids();
  EXPECT_FALSE(MropePositions(s, ids, grids.slice(0, 0, 1)).ok());  // two runs, one image
  EXPECT_FALSE(MropePositions(s, ids.slice(0, 0, 1), grids).ok());  // one run, two images
  torch::Tensor short_run = ids.clone();
  short_run[0][4] = 7;  // splits image 0's run
  absl::StatusOr<torch::Tensor> p = MropePositions(s, short_run, grids);
  ASSERT_FALSE(p.ok());
  EXPECT_NE(p.status().message().find("needs 15 image tokens"), std::string::npos) << p.status();
  torch::Tensor video = ids.clone();
  video[1][0] = kVideo;
  p = MropePositions(s, video, grids);
  ASSERT_FALSE(p.ok());
  EXPECT_NE(p.status().message().find("videos are not supported"), std::string::npos);
}

std::unique_ptr<LlamaModel> Model(const ModelSpec& s, bool vision_checkpoint = false) {
  LlamaModelOptions o;
  o.spec = s;
  o.seed = 3;
  o.vision_checkpoint = vision_checkpoint;
  auto m = LlamaModel::Create(o);
  EXPECT_TRUE(m.ok()) << m.status();
  return std::move(m).value();
}

// VlSpec as `family` builds it: "qwen2_5_vl", or "qwen2_vl" (no windows, an integer mlp_ratio).
ModelSpec VlSpecOf(const std::string& family) {
  ModelSpec s = VlSpec();
  if (family == "qwen2_vl") {
    s.family = family;
    s.vision.window_size = 0;
    s.vision.fullatt_block_indexes.clear();
    s.vision.intermediate_size = 2 * s.vision.hidden_size;  // an integer mlp_ratio
  }
  return s;
}

// The next token of each of `ids`, image tokens masked.
torch::Tensor Targets(const torch::Tensor& ids) {
  torch::Tensor targets = torch::roll(ids, -1, 1);
  targets.masked_fill_(ids == kImage, -100);
  return targets;
}

// Every parameter of `want` has a gradient and `got`'s equals it bit for bit; `what` names the
// run in failures.
void ExpectSameGrads(LlamaModel& got, LlamaModel& want, const std::string& what) {
  const auto a = got.Params();
  const auto b = want.Params();
  ASSERT_EQ(a.size(), b.size()) << what;
  for (size_t i = 0; i < a.size(); ++i) {
    ASSERT_TRUE(b[i].param.grad().defined()) << b[i].name << " in " << what;
    EXPECT_TRUE(torch::equal(a[i].param.grad(), b[i].param.grad())) << a[i].name << " in " << what;
  }
}

TEST(VisionModelTest, VisionParametersInGroupZeroInHuggingFaceOrder) {
  const ModelSpec s = VlSpec();
  auto m = Model(s);
  const ParamGroups groups = m->ParamGroups();
  ASSERT_EQ(groups.size(), 4u);
  ASSERT_EQ(groups[0].size(), 1u + 1 + 3 * 12 + 5);
  EXPECT_EQ(groups[0][0].name, "model.embed_tokens.weight");
  EXPECT_EQ(groups[0][1].name, "visual.patch_embed.proj.weight");
  EXPECT_EQ(groups[0][1].param.sizes(), (std::vector<int64_t>{16, 3, 2, 2, 2}));
  EXPECT_EQ(groups[0][4].name, "visual.blocks.0.attn.qkv.weight");
  EXPECT_EQ(groups[0].back().name, "visual.merger.mlp.2.bias");
  int64_t numel = 0;
  for (const ParamShape& p : HfParamShapes(s)) numel += p.numel();
  int64_t model_numel = 0;
  for (const NamedParam& p : m->Params()) model_numel += p.param.numel();
  EXPECT_EQ(numel, model_numel);
}

TEST(VisionModelTest, ImagesChangeOnlyTheirOwnTokensAndLaterOnes) {
  const ModelSpec s = VlSpec();
  auto m = Model(s);
  torch::NoGradGuard no_grad;
  const torch::Tensor ids = Ids();
  VisionInputs images = TwoImages(s);
  const torch::Tensor a = m->Logits(ids, images);
  images.pixel_values = images.pixel_values.clone();
  images.pixel_values.slice(0, 60).mul_(2);  // image 1 only: row 1
  const torch::Tensor b = m->Logits(ids, images);
  EXPECT_TRUE(torch::equal(a[0], b[0]));
  // Row 1's image tokens start at 6 (five text tokens, vision_start).
  EXPECT_TRUE(torch::equal(a[1].slice(0, 0, 6), b[1].slice(0, 0, 6)));
  for (int64_t t = 6; t < 24; ++t) EXPECT_FALSE(torch::allclose(a[1][t], b[1][t])) << t;
}

TEST(VisionModelTest, GroupedEqualsPlainWithImagesInEveryMode) {
  const ModelSpec s = VlSpec();
  const torch::Tensor ids = Ids();
  const torch::Tensor targets = Targets(ids);
  const VisionInputs images = TwoImages(s);
  auto ref = Model(s);
  const torch::Tensor ref_loss = ref->Loss(ids, targets, images);
  ref_loss.backward();
  for (BlockMode mode : {BlockMode::kNone, BlockMode::kCkpt, BlockMode::kSwap,
                         BlockMode::kHsOffload}) {
    auto m = Model(s);
    const torch::Tensor loss =
        m->Loss(ids, targets, BlockModes(s.num_layers, mode), nullptr, nullptr, images);
    loss.backward();
    EXPECT_TRUE(torch::equal(loss, ref_loss)) << BlockModeName(mode);
    ASSERT_NO_FATAL_FAILURE(ExpectSameGrads(*m, *ref, std::string(BlockModeName(mode))));
  }
}

// [Vision block checkpointing]: the tower's blocks recomputed in backward give the output and
// every gradient (parameters and pixels) of the tower kept whole, bit for bit, run plainly and
// nested in a group as LlamaModel runs it, for both tower variants; under no grad it is the same
// function.
TEST(VisionTowerTest, CheckpointedBlocksEqualKeptBlocks) {
  for (const std::string family : {"qwen2_5_vl", "qwen2_vl"}) {
    const ModelSpec s = VlSpecOf(family);
    VisionInputs images = TwoImages(s);
    auto run = [&](bool checkpoint, bool grouped) {
      VisionParams p = VisionParams::Shaped(s);
      auto gen = at::make_generator<at::CPUGeneratorImpl>(5);
      for (size_t i = 0; i < p.tensors.size(); ++i) {
        p.tensors[i] = (torch::randn(p.shapes[i], gen) * 0.1).requires_grad_(true);
      }
      VisionInputs in = images;
      in.pixel_values = images.pixel_values.clone().requires_grad_(true);
      torch::Tensor out;
      if (grouped) {
        GroupSpec group;
        group.body = [&](const torch::Tensor&) { return VisionTowerForward(s, p, in, checkpoint); };
        out = RunGroup(group, torch::zeros({1}), GroupRunnerOptions{});
      } else {
        out = VisionTowerForward(s, p, in, checkpoint);
      }
      auto gen_grad = at::make_generator<at::CPUGeneratorImpl>(9);
      out.backward(torch::randn(out.sizes(), gen_grad));
      std::vector<torch::Tensor> grads = {out.detach()};
      for (const torch::Tensor& t : p.tensors) grads.push_back(t.grad());
      if (in.pixel_values.grad().defined()) grads.push_back(in.pixel_values.grad());
      return grads;
    };
    for (bool grouped : {false, true}) {
      const std::vector<torch::Tensor> want = run(false, grouped);
      const std::vector<torch::Tensor> got = run(true, grouped);
      ASSERT_EQ(got.size(), want.size());
      for (size_t i = 0; i < got.size(); ++i) {
        ASSERT_TRUE(want[i].defined()) << i;
        EXPECT_TRUE(torch::equal(got[i], want[i]))
            << family << (grouped ? " grouped" : " plain") << " tensor " << i;
      }
    }
    VisionParams p = VisionParams::Shaped(s);
    for (size_t i = 0; i < p.tensors.size(); ++i) p.tensors[i] = torch::ones(p.shapes[i]) * 0.01;
    torch::NoGradGuard no_grad;
    EXPECT_TRUE(torch::equal(VisionTowerForward(s, p, images, true),
                             VisionTowerForward(s, p, images, false)))
        << family;
  }
}

// [Vision block checkpointing] through LlamaModelOptions::vision_checkpoint: the model's loss and
// every gradient equal those with the tower kept whole, bit for bit, plain and grouped, for both
// tower variants; its logits (no grad) too.
TEST(VisionModelTest, CheckpointedTowerEqualsKeptTower) {
  for (const std::string family : {"qwen2_5_vl", "qwen2_vl"}) {
    const ModelSpec s = VlSpecOf(family);
    const torch::Tensor ids = Ids();
    const torch::Tensor targets = Targets(ids);
    const VisionInputs images = TwoImages(s);
    for (bool grouped : {false, true}) {
      auto kept = Model(s);
      auto ckpt = Model(s, /*vision_checkpoint=*/true);
      const BlockModes modes(s.num_layers, BlockMode::kNone);
      const torch::Tensor want = grouped ? kept->Loss(ids, targets, modes, nullptr, nullptr, images)
                                         : kept->Loss(ids, targets, images);
      const torch::Tensor got = grouped ? ckpt->Loss(ids, targets, modes, nullptr, nullptr, images)
                                        : ckpt->Loss(ids, targets, images);
      want.backward();
      got.backward();
      EXPECT_TRUE(torch::equal(got, want)) << family << (grouped ? " grouped" : " plain");
      ASSERT_NO_FATAL_FAILURE(
          ExpectSameGrads(*ckpt, *kept, family + (grouped ? " grouped" : " plain")));
      torch::NoGradGuard no_grad;
      EXPECT_TRUE(torch::equal(ckpt->Logits(ids, images), kept->Logits(ids, images))) << family;
    }
  }
}

// LoRA on the language model's attention: the tower is frozen with the base and trains nothing;
// targets PEFT would also match in the tower (its MLP's gate/up/down_proj) and QLoRA are refused.
TEST(VisionModelTest, LoraOnAttentionOnly) {
  LlamaModelOptions o;
  o.spec = VlSpec();
  o.lora.rank = 4;
  o.lora.targets = {"q_proj", "v_proj"};
  auto m = LlamaModel::Create(o);
  ASSERT_TRUE(m.ok()) << m.status();
  for (const NamedParam& p : (*m)->Params()) EXPECT_FALSE(p.param.requires_grad()) << p.name;
  for (const NamedParam& p : (*m)->TrainableParams()) {
    EXPECT_EQ(p.name.rfind("model.layers.", 0), 0u) << p.name;
  }
  const torch::Tensor ids = Ids();
  torch::Tensor targets = torch::roll(ids, -1, 1);
  (*m)->Loss(ids, targets, TwoImages(o.spec)).backward();
  for (const NamedParam& p : (*m)->TrainableParams()) {
    EXPECT_TRUE(p.param.grad().defined()) << p.name;
  }
  o.lora.targets = {"q_proj", "gate_proj"};
  auto mlp = LlamaModel::Create(o);
  ASSERT_FALSE(mlp.ok());
  EXPECT_NE(mlp.status().message().find("visual.blocks.N.mlp.gate_proj"), std::string::npos)
      << mlp.status();
  o.lora.targets = {"q_proj"};
  o.lora.nf4_base = true;
  auto qlora = LlamaModel::Create(o);
  ASSERT_FALSE(qlora.ok());
  EXPECT_NE(qlora.status().message().find("QLoRA"), std::string::npos) << qlora.status();
}

TEST(VisionModelTest, Refusals) {
  const ModelSpec s = VlSpec();
  auto m = Model(s);
  const torch::Tensor ids = Ids();
  // Image tokens without their images.
  EXPECT_THROW(m->Logits(ids), c10::Error);
  // Pixel values that do not match the grids.
  VisionInputs bad = TwoImages(s);
  bad.pixel_values = bad.pixel_values.slice(0, 0, 70);
  EXPECT_THROW(m->Logits(ids, bad), c10::Error);
  // Images for a model without a vision tower.
  ModelSpec text = s;
  text.family = "qwen2";
  text.vision = VisionSpec();
  text.mrope_section.clear();
  auto t = Model(text);
  EXPECT_THROW(t->Logits(ids, TwoImages(s)), c10::Error);
}

}  // namespace
}  // namespace memplan
