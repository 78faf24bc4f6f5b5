// [OSFT checkpoints] (agent/io/osft_checkpoint.h): an OSFT run saved after two steps and resumed
// into a fresh model and trainer takes the same next steps as the run that never stopped (fp32 on
// the CPU: bit for bit); model.safetensors holds each split weight merged from its factors; a
// resume with another rank ratio, other targets or without OSFT is refused naming the flag.
#include "agent/io/osft_checkpoint.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <stdlib.h>

#include <map>
#include <string>
#include <vector>

#include "agent/io/checkpoint.h"
#include "agent/io/file_system.h"
#include "agent/io/safetensors_torch.h"
#include "agent/train/trainer.h"
#include "tests/agent/tiny_spec.h"

namespace memplan {
namespace {

using ::testing::HasSubstr;

LlamaModelOptions Options(double ratio, std::vector<std::string> targets) {
  LlamaModelOptions o;
  o.spec = testing::TinySpec(/*tied=*/true, "qwen2");
  o.seed = 5;
  o.osft.rank_ratio = ratio;
  o.osft.targets = std::move(targets);
  return o;
}

const std::vector<std::string> kTargets = {"q_proj", "v_proj", "o_proj", "up_proj", "down_proj"};

std::vector<MicroBatch> StepBatches(int64_t step) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(100 + step);
  std::vector<MicroBatch> out;
  for (int i = 0; i < 2; ++i) {
    out.push_back({at::randint(0, 128, {2, 12}, gen, torch::kInt64),
                   at::randint(0, 128, {2, 12}, gen, torch::kInt64),
                   {}});
  }
  return out;
}

struct OsftRun {
  std::unique_ptr<LlamaModel> model;
  std::unique_ptr<Trainer> trainer;
};

// `shaped`: the factors are shaped for a checkpoint instead of split ([OSFT resume without the
// SVD], agent/model/osft.h).
OsftRun Make(const LlamaModelOptions& o, bool shaped = false) {
  OsftRun r;
  auto model = LlamaModel::Create(o);
  EXPECT_TRUE(model.ok()) << model.status();
  r.model = *std::move(model);
  TrainerOptions t;
  t.grad_accum = 2;
  t.adamw.lr = 3e-3;
  t.max_grad_norm = 1.0;
  t.block_modes = BlockModes(4, BlockMode::kCkpt);
  t.osft_factors_from_checkpoint = shaped;
  auto trainer = Trainer::Create(r.model.get(), t);
  EXPECT_TRUE(trainer.ok()) << trainer.status();
  r.trainer = *std::move(trainer);
  return r;
}

std::map<std::string, torch::Tensor> ByName(const std::vector<NamedParam>& v) {
  std::map<std::string, torch::Tensor> out;
  for (const NamedParam& p : v) out[p.name] = p.param;
  return out;
}

class OsftCheckpointTest : public ::testing::Test {
 protected:
  void SetUp() override {
    torch::set_num_threads(1);
    std::string tmpl = ::testing::TempDir() + "/memplan_osft_ckpt_XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl.data()), nullptr);
    root_ = tmpl;
  }
  void TearDown() override { io::RemoveAll(root_).IgnoreError(); }
  std::string root_;
};

TEST_F(OsftCheckpointTest, ResumedRunEqualsTheStraightOneAndExportsMergedWeights) {
  const std::string dir = root_ + "/ckpt";
  OsftRun straight = Make(Options(0.5, kTargets));
  std::vector<double> losses;
  for (int64_t step = 0; step < 4; ++step) {
    auto stats = straight.trainer->Step(StepBatches(step));
    ASSERT_TRUE(stats.ok()) << stats.status();
    losses.push_back(stats->loss);
  }

  OsftRun first = Make(Options(0.5, kTargets));
  for (int64_t step = 0; step < 2; ++step) {
    auto stats = first.trainer->Step(StepBatches(step));
    ASSERT_TRUE(stats.ok()) << stats.status();
    EXPECT_EQ(stats->loss, losses[static_cast<size_t>(step)]);
  }
  io::TrainerState state;
  state.data_position = 4;
  ASSERT_TRUE(first.trainer->SaveCheckpoint(dir, state).ok());
  EXPECT_TRUE(io::IsRegularFile(io::JoinPath(dir, io::kOsftFactorsFile)));
  EXPECT_TRUE(io::IsRegularFile(io::JoinPath(dir, io::kOsftConfigFile)));

  // model.safetensors: Hugging Face names only, every split weight the product of its factors.
  auto exported = io::ReadSafetensorsFile(io::JoinPath(dir, io::kCheckpointParamsFile));
  ASSERT_TRUE(exported.ok()) << exported.status();
  const auto weights = ByName(*exported);
  std::vector<NamedParam> all = first.model->Params();
  for (const NamedParam& p : first.model->TrainableParams()) all.push_back(p);
  const auto live = ByName(all);
  int merged = 0;
  for (const auto& [name, w] : weights) {
    EXPECT_EQ(name.find(".osft_"), std::string::npos) << name;
    const std::string path = name.substr(0, name.size() - 7);  // without ".weight"
    if (live.count(name) != 0) {
      EXPECT_TRUE(torch::equal(w, live.at(name))) << name;  // an untargeted parameter as it is
      continue;
    }
    ASSERT_EQ(live.count(path + ".osft_u_low"), 1u) << name;
    OsftFactors f;
    f.u_high = live.at(path + ".osft_u_high"), f.s_high = live.at(path + ".osft_s_high");
    f.v_high = live.at(path + ".osft_v_high"), f.u_low = live.at(path + ".osft_u_low");
    f.s_low = live.at(path + ".osft_s_low"), f.v_low = live.at(path + ".osft_v_low");
    EXPECT_TRUE(torch::equal(w, io::OsftMergedWeight(f, torch::kFloat32))) << name;
    torch::NoGradGuard no_grad;
    const torch::Tensor dense = torch::mm(torch::cat({f.u_high * f.s_high, f.u_low * f.s_low}, 1),
                                          torch::cat({f.v_high, f.v_low}, 1).t());
    EXPECT_LT((w - dense).abs().max().item<double>(), 1e-5 * dense.abs().max().item<double>())
        << name;
    ++merged;
  }
  EXPECT_EQ(merged, 4 * static_cast<int>(kTargets.size()));
  EXPECT_EQ(weights.count("model.layers.1.self_attn.k_proj.weight"), 1u);

  auto loaded = io::LoadCheckpoint(dir);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_EQ(loaded->osft.settings.rank_ratio, 0.5);
  EXPECT_EQ(loaded->osft.settings.targets, kTargets);
  EXPECT_EQ(loaded->osft.factors.size(), 4u * kTargets.size() * 6u);
  // Resumed into a fresh model that splits its own (initial) weights, the checkpoint's factors
  // replacing them, and into one whose factors are only shaped for them: no SVD runs, the same
  // steps bit for bit.
  const auto want = ByName(straight.trainer->Params());
  const auto frozen = ByName(straight.model->Params());
  for (const bool shaped : {false, true}) {
    SCOPED_TRACE(shaped ? "shaped for the checkpoint" : "split, then overwritten");
    OsftRun resumed = Make(Options(0.5, kTargets), shaped);
    EXPECT_EQ(resumed.model->osft_factor_origin().svd_splits, shaped ? 0 : 20);
    EXPECT_EQ(resumed.model->osft_factor_origin().shaped, shaped ? 20 : 0);
    ASSERT_TRUE(resumed.trainer->RestoreCheckpoint(*loaded).ok());
    EXPECT_EQ(resumed.trainer->step(), 2);
    for (int64_t step = 2; step < 4; ++step) {
      auto stats = resumed.trainer->Step(StepBatches(step));
      ASSERT_TRUE(stats.ok()) << stats.status();
      EXPECT_EQ(stats->loss, losses[static_cast<size_t>(step)]) << "step " << step + 1;
    }
    for (const NamedParam& p : resumed.trainer->Params()) {
      EXPECT_TRUE(torch::equal(p.param, want.at(p.name))) << p.name;
    }
    for (const NamedParam& p : resumed.model->Params()) {
      EXPECT_TRUE(torch::equal(p.param, frozen.at(p.name))) << p.name;
    }
  }
}

// [OSFT resume without the SVD] (agent/model/osft.h): the shaped factors are the split's in name,
// order, shape, dtype, layout and trainability, without an SVD; nothing trains on them until a
// checkpoint has filled them.
TEST_F(OsftCheckpointTest, ShapedFactorsAreTheSplitsWithoutAnSvdAndWaitForTheCheckpoint) {
  OsftRun split = Make(Options(0.5, kTargets));
  OsftRun shaped = Make(Options(0.5, kTargets), /*shaped=*/true);
  EXPECT_EQ(split.model->osft_factor_origin().svd_splits, 20);
  EXPECT_EQ(shaped.model->osft_factor_origin().svd_splits, 0);
  EXPECT_EQ(shaped.model->osft_factor_origin().shaped, 20);
  auto same = [](const std::vector<NamedParam>& a, const std::vector<NamedParam>& b) {
    ASSERT_EQ(a.size(), b.size());
    for (size_t i = 0; i < a.size(); ++i) {
      EXPECT_EQ(a[i].name, b[i].name);
      EXPECT_EQ(a[i].param.sizes(), b[i].param.sizes()) << a[i].name;
      EXPECT_EQ(a[i].param.strides(), b[i].param.strides()) << a[i].name;
      EXPECT_EQ(a[i].param.scalar_type(), b[i].param.scalar_type()) << a[i].name;
      EXPECT_EQ(a[i].param.requires_grad(), b[i].param.requires_grad()) << a[i].name;
    }
  };
  same(split.model->Params(), shaped.model->Params());
  same(split.model->TrainableParams(), shaped.model->TrainableParams());

  const absl::Status refused = shaped.trainer->Step(StepBatches(0)).status();
  EXPECT_EQ(refused.code(), absl::StatusCode::kFailedPrecondition) << refused;
  EXPECT_THAT(std::string(refused.message()), HasSubstr("RestoreCheckpoint first"));
  EXPECT_EQ(shaped.trainer->EvalLoss(StepBatches(0)[0]).status().code(),
            absl::StatusCode::kFailedPrecondition);
  // A refused restore (another split) leaves it waiting.
  ASSERT_TRUE(split.trainer->SaveCheckpoint(root_ + "/ckpt", io::TrainerState()).ok());
  auto loaded = io::LoadCheckpoint(root_ + "/ckpt");
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  OsftRun other = Make(Options(0.25, kTargets), /*shaped=*/true);
  EXPECT_FALSE(other.trainer->RestoreCheckpoint(*loaded).ok());
  EXPECT_FALSE(other.trainer->Step(StepBatches(0)).ok());
  ASSERT_TRUE(shaped.trainer->RestoreCheckpoint(*loaded).ok());
  EXPECT_TRUE(shaped.trainer->Step(StepBatches(0)).ok());
}

TEST_F(OsftCheckpointTest, ResumeWithAnotherSplitIsRefusedNamingTheFlag) {
  const std::string dir = root_ + "/ckpt";
  OsftRun first = Make(Options(0.5, kTargets));
  ASSERT_TRUE(first.trainer->Step(StepBatches(0)).ok());
  ASSERT_TRUE(first.trainer->SaveCheckpoint(dir, io::TrainerState()).ok());
  auto loaded = io::LoadCheckpoint(dir);
  ASSERT_TRUE(loaded.ok()) << loaded.status();

  auto refusal = [&loaded](const LlamaModelOptions& o) {
    OsftRun r = Make(o);
    const absl::Status s = r.trainer->RestoreCheckpoint(*loaded);
    EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
    return std::string(s.message());
  };
  EXPECT_THAT(refusal(Options(0.25, kTargets)), HasSubstr("--osft-rank-ratio 0.25 differs"));
  EXPECT_THAT(refusal(Options(0.5, {"q_proj", "v_proj"})), HasSubstr("--osft-targets"));
  // The targets in another order are the same split.
  OsftRun reordered = Make(Options(0.5, {"down_proj", "up_proj", "o_proj", "v_proj", "q_proj"}));
  EXPECT_TRUE(reordered.trainer->RestoreCheckpoint(*loaded).ok());
  // A full fine-tune does not resume an OSFT checkpoint, nor OSFT a full fine-tune's.
  LlamaModelOptions full = Options(0.5, kTargets);
  full.osft = OsftOptions();
  EXPECT_THAT(refusal(full), HasSubstr("resume it with --osft-rank-ratio 0.5"));
  OsftRun plain = Make(full);
  ASSERT_TRUE(plain.trainer->SaveCheckpoint(root_ + "/full", io::TrainerState()).ok());
  loaded = io::LoadCheckpoint(root_ + "/full");
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_THAT(refusal(Options(0.5, kTargets)),
              HasSubstr("--osft-rank-ratio: the checkpoint is not an OSFT run's"));
}

// The factors are checked against the split osft_config.json records.
TEST_F(OsftCheckpointTest, FactorsThatDoNotMatchTheSplitAreRefused) {
  OsftRun first = Make(Options(0.5, {"q_proj"}));
  io::TrainerState state;
  state.model = first.model->spec();
  std::vector<NamedParam> named = first.model->Params();
  for (const NamedParam& p : first.model->TrainableParams()) named.push_back(p);
  auto parts = io::SplitOsftCheckpointParts(named, torch::kFloat32);
  ASSERT_TRUE(parts.ok()) << parts.status();
  io::OsftCheckpoint osft;
  osft.settings.rank_ratio = 0.5;
  osft.settings.targets = {"q_proj", "v_proj"};
  osft.factors = parts->factors;
  EXPECT_EQ(osft.factors.size(), 4u * 6u);
  const absl::Status s = io::SaveCheckpoint(root_ + "/bad", state, parts->params, {}, osft);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), HasSubstr("missing \"model.layers.0.self_attn.v_proj"));
  osft.settings.targets = {"q_proj", "q_proj"};
  EXPECT_THAT(
      std::string(io::SaveCheckpoint(root_ + "/bad", state, parts->params, {}, osft).message()),
      HasSubstr("unknown or repeated"));
  osft.settings.targets = {"q_proj"};
  EXPECT_TRUE(io::SaveCheckpoint(root_ + "/good", state, parts->params, {}, osft).ok());
  osft.settings = io::OsftSettings();
  EXPECT_THAT(
      std::string(io::SaveCheckpoint(root_ + "/none", state, parts->params, {}, osft).message()),
      HasSubstr("without the split's settings"));
}

}  // namespace
}  // namespace memplan
