#include "agent/io/checkpoint.h"

#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <map>
#include <string>

#include "agent/io/file_system.h"
#include "common/param_shapes.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace memplan::io {
namespace {

using ::testing::HasSubstr;

ModelSpec TinySpec() {
  ModelSpec m;
  m.name = "tiny-llama";
  m.family = "llama";
  m.hidden_size = 16;
  m.num_layers = 2;
  m.num_heads = 4;
  m.num_kv_heads = 2;
  m.intermediate_size = 24;
  m.vocab_size = 40;
  m.tie_word_embeddings = true;
  return m;
}

TrainerState Trainer(int64_t step) {
  TrainerState t;
  t.step = step;
  t.data_position = 4 * step;
  t.data_seed = 99;
  t.rng_seed = 5;
  t.max_grad_norm = 1.0;
  t.optimizer.lr = 1e-2;
  t.model = TinySpec();
  t.param_dtype = DType::kFloat32;
  t.workload = {.micro_batch = 2, .seq_len = 8, .world_size = 1, .grad_accum = 4};
  t.plan_id = "plan-1";
  return t;
}

// Parameters as the model lists them: the tied head aliases the embedding.
std::vector<NamedParam> Params(uint64_t seed) {
  torch::manual_seed(seed);
  std::vector<NamedParam> out;
  for (const ParamShape& p : HfParamShapes(TinySpec())) {
    out.push_back({p.name, torch::randn(p.shape).requires_grad_(true)});
  }
  out.push_back({"lm_head.weight", out.front().param});
  return out;
}

std::vector<NamedParam> State(const std::vector<NamedParam>& params, int64_t step) {
  std::vector<NamedParam> out;
  for (size_t i = 0; i + 1 < params.size(); ++i) {
    out.push_back({params[i].name + ".exp_avg", torch::randn(params[i].param.sizes())});
    out.push_back({params[i].name + ".exp_avg_sq", torch::rand(params[i].param.sizes())});
  }
  out.push_back({"step", torch::tensor(step)});
  return out;
}

std::string NewDir(const std::string& name) {
  // Torch-linked binary: std::filesystem is unusable here (see agent/io/file_system.h).
  const std::string dir = JoinPath(JoinPath(::testing::TempDir(), "checkpoint_test"), name);
  EXPECT_TRUE(RemoveAll(dir).ok());
  EXPECT_TRUE(CreateDirectories(dir).ok());
  return dir;
}

std::vector<std::string> Listing(const std::string& dir) {
  absl::StatusOr<std::vector<std::string>> names = ListDirectory(dir);
  EXPECT_TRUE(names.ok()) << names.status();
  return names.ok() ? *names : std::vector<std::string>();
}

TEST(CheckpointTest, SaveLoadRoundTrip) {
  const std::string root = NewDir("roundtrip");
  const std::string dir = root + "/ckpt";
  const std::vector<NamedParam> params = Params(1);
  const std::vector<NamedParam> state = State(params, 3);
  ASSERT_TRUE(SaveCheckpoint(dir, Trainer(3), params, state).ok());
  EXPECT_EQ(Listing(dir), (std::vector<std::string>{"config.json", "model.safetensors",
                                                    "optimizer.safetensors", "trainer.json"}));
  EXPECT_EQ(Listing(root), (std::vector<std::string>{"ckpt"}));  // no temporary left behind

  absl::StatusOr<Checkpoint> ckpt = LoadCheckpoint(dir);
  ASSERT_TRUE(ckpt.ok()) << ckpt.status();
  EXPECT_EQ(ckpt->trainer.step, 3);
  EXPECT_EQ(ckpt->trainer.data_position, 12);
  EXPECT_EQ(ckpt->trainer.model.name, "tiny-llama");
  EXPECT_EQ(ckpt->trainer.plan_id, "plan-1");
  // The tied head is stored once, under the embedding's name.
  ASSERT_EQ(ckpt->params.size(), params.size() - 1);
  for (size_t i = 0; i < ckpt->params.size(); ++i) {
    EXPECT_EQ(ckpt->params[i].name, params[i].name);
    EXPECT_TRUE(torch::equal(ckpt->params[i].param, params[i].param.detach()));
  }
  ASSERT_EQ(ckpt->optimizer_state.size(), state.size());
  for (size_t i = 0; i < state.size(); ++i) {
    EXPECT_EQ(ckpt->optimizer_state[i].name, state[i].name);
    EXPECT_TRUE(torch::equal(ckpt->optimizer_state[i].param, state[i].param));
  }
}

// adamw8bit's state ([8-bit optimizer state], common/optimizer_bytes.h): uint8 codes of the
// parameter's shape and fp32 absmax per 256 elements, saved and loaded as they are; wrong
// shapes, dtypes and a missing piece are refused, naming the entry.
TEST(CheckpointTest, SavesAndValidatesEightBitState) {
  const std::string dir = NewDir("eight_bit") + "/ckpt";
  const std::vector<NamedParam> params = Params(4);
  std::vector<NamedParam> state;
  for (size_t i = 0; i + 1 < params.size(); ++i) {
    const torch::Tensor& p = params[i].param;
    const int64_t blocks = (p.numel() + 255) / 256;
    for (const char* moment : {".exp_avg", ".exp_avg_sq"}) {
      state.push_back({params[i].name + moment + ".q8",
                       torch::randint(256, p.sizes(), torch::kUInt8)});
      state.push_back({params[i].name + moment + ".absmax", torch::rand({blocks})});
    }
  }
  state.push_back({"step", torch::tensor(int64_t{7})});
  ASSERT_TRUE(SaveCheckpoint(dir, Trainer(7), params, state).ok());
  absl::StatusOr<Checkpoint> ckpt = LoadCheckpoint(dir);
  ASSERT_TRUE(ckpt.ok()) << ckpt.status();
  ASSERT_EQ(ckpt->optimizer_state.size(), state.size());
  for (size_t i = 0; i < state.size(); ++i) {
    EXPECT_EQ(ckpt->optimizer_state[i].name, state[i].name);
    EXPECT_TRUE(torch::equal(ckpt->optimizer_state[i].param, state[i].param)) << state[i].name;
  }
  auto refused = [&](std::vector<NamedParam> bad, const std::string& name) {
    const absl::Status s = ValidateOptimizerState(params, bad);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << name;
    EXPECT_NE(s.message().find(name), absl::string_view::npos) << s;
  };
  std::vector<NamedParam> bad = state;
  bad[0].param = bad[0].param.to(torch::kFloat32);  // codes must be uint8
  refused(bad, state[0].name);
  bad = state;
  bad[1].param = torch::rand({bad[1].param.numel() + 1});  // one absmax per 256 elements
  refused(bad, state[1].name);
  bad = state;
  bad.erase(bad.begin() + 1);  // exp_avg.absmax missing
  refused(bad, params[0].name);
}

TEST(CheckpointTest, ReplacesAnExistingCheckpointAtomically) {
  const std::string root = NewDir("replace");
  const std::string dir = root + "/ckpt";
  ASSERT_TRUE(SaveCheckpoint(dir, Trainer(1), Params(1), {}).ok());
  const std::vector<NamedParam> second = Params(2);
  ASSERT_TRUE(SaveCheckpoint(dir, Trainer(2), second, State(second, 2)).ok());
  EXPECT_EQ(Listing(root), (std::vector<std::string>{"ckpt"}));
  absl::StatusOr<Checkpoint> ckpt = LoadCheckpoint(dir);
  ASSERT_TRUE(ckpt.ok()) << ckpt.status();
  EXPECT_EQ(ckpt->trainer.step, 2);
  EXPECT_TRUE(torch::equal(ckpt->params[0].param, second[0].param.detach()));

  // A failed save (invalid state) leaves the previous checkpoint and no temporary.
  std::vector<NamedParam> bad = State(second, 3);
  bad.pop_back();  // no "step"
  EXPECT_THAT(std::string(SaveCheckpoint(dir, Trainer(3), second, bad).message()),
              HasSubstr("lacks \"step\""));
  EXPECT_EQ(Listing(root), (std::vector<std::string>{"ckpt"}));
  ASSERT_TRUE(LoadCheckpoint(dir).ok());
  EXPECT_EQ(LoadCheckpoint(dir)->trainer.step, 2);
}

TEST(CheckpointTest, RefusesToReplaceUnrelatedDirectory) {
  const std::string dir = NewDir("precious");
  std::ofstream(JoinPath(dir, "thesis.tex")) << "do not delete";
  EXPECT_EQ(SaveCheckpoint(dir, Trainer(1), Params(1), {}).code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(PathExists(JoinPath(dir, "thesis.tex")));
}

TEST(CheckpointTest, SaveValidatesAgainstTheModel) {
  const std::string dir = NewDir("validate") + "/ckpt";
  std::vector<NamedParam> params = Params(1);
  auto error = [&dir](const std::vector<NamedParam>& p, const std::vector<NamedParam>& s) {
    return std::string(SaveCheckpoint(dir, Trainer(1), p, s).message());
  };
  std::vector<NamedParam> missing(params.begin() + 1, params.end() - 1);
  EXPECT_THAT(error(missing, {}), HasSubstr("missing \"model.embed_tokens.weight\""));
  std::vector<NamedParam> extra = params;
  extra.push_back({"lora_A", torch::zeros({2})});
  EXPECT_THAT(error(extra, {}), HasSubstr("unexpected \"lora_A\""));
  // A [16] vector: the first block's input norm (its place follows common/param_shapes.h).
  const size_t norm = static_cast<size_t>(
      std::find_if(params.begin(), params.end(),
                   [](const NamedParam& p) {
                     return p.name == "model.layers.0.input_layernorm.weight";
                   }) -
      params.begin());
  ASSERT_LT(norm, params.size());
  std::vector<NamedParam> reshaped = params;
  reshaped[norm].param = torch::zeros({17});
  EXPECT_THAT(error(reshaped, {}), HasSubstr("has shape [17], the model needs [16]"));
  std::vector<NamedParam> half = params;
  half[norm].param = torch::zeros({16}, torch::kBFloat16);
  EXPECT_THAT(error(half, {}), HasSubstr("param_dtype is fp32"));

  EXPECT_THAT(error(params, {{"step", torch::tensor(1.5)}}), HasSubstr("integer scalar"));
  EXPECT_THAT(error(params, {{"step", torch::tensor(int64_t{1})},
                             {"model.norm.weight.exp_avg", torch::zeros({16})}}),
              HasSubstr("only one of exp_avg"));
  EXPECT_THAT(error(params, {{"step", torch::tensor(int64_t{1})},
                             {"model.norm.weight.momentum", torch::zeros({16})}}),
              HasSubstr("is not \"step\""));
  EXPECT_THAT(error(params, {{"step", torch::tensor(int64_t{1})},
                             {"model.norm.weight.exp_avg", torch::zeros({15})},
                             {"model.norm.weight.exp_avg_sq", torch::zeros({16})}}),
              HasSubstr("floating state required"));
  EXPECT_FALSE(PathExists(dir));
}

TEST(CheckpointTest, LoadDetectsCorruption) {
  const std::string root = NewDir("corrupt");
  auto fresh = [&root](const std::string& name) {
    const std::string dir = root + "/" + name;
    const std::vector<NamedParam> params = Params(1);
    EXPECT_TRUE(SaveCheckpoint(dir, Trainer(1), params, State(params, 1)).ok());
    return dir;
  };
  {  // Truncated parameter file: size differs from trainer.json.
    const std::string dir = fresh("truncated");
    const std::string params = JoinPath(dir, "model.safetensors");
    ASSERT_EQ(::truncate(params.c_str(), *FileSizeBytes(params) - 4), 0);
    EXPECT_EQ(LoadCheckpoint(dir).status().code(), absl::StatusCode::kDataLoss);
  }
  {  // Same size, corrupt header.
    const std::string dir = fresh("header");
    std::fstream f(JoinPath(dir, "model.safetensors"),
                   std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(8);
    f.put('[');
    f.close();
    EXPECT_EQ(LoadCheckpoint(dir).status().code(), absl::StatusCode::kInvalidArgument);
  }
  {  // Missing optimizer file.
    const std::string dir = fresh("missing");
    ASSERT_EQ(::unlink(JoinPath(dir, "optimizer.safetensors").c_str()), 0);
    EXPECT_FALSE(LoadCheckpoint(dir).ok());
  }
  {  // trainer.json edited to another model: the parameters no longer match.
    const std::string dir = fresh("model");
    std::ifstream in(JoinPath(dir, "trainer.json"));
    std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    const size_t at = text.find("\"num_layers\": 2");
    ASSERT_NE(at, std::string::npos);
    text.replace(at, 15, "\"num_layers\": 3");
    std::ofstream(JoinPath(dir, "trainer.json"), std::ios::trunc) << text;
    EXPECT_THAT(std::string(LoadCheckpoint(dir).status().message()),
                HasSubstr("missing \"model.layers.2.input_layernorm.weight\""));
  }
  EXPECT_EQ(LoadCheckpoint(root + "/none").status().code(), absl::StatusCode::kNotFound);
}

TEST(CopyParamsByNameTest, CopiesIntoTiedTargetsAndChecksCoverage) {
  const std::vector<NamedParam> source = {{"emb", torch::ones({2, 3})},
                                          {"w", torch::full({2}, 2.0)}};
  torch::Tensor emb = torch::zeros({2, 3}, torch::kBFloat16);
  torch::Tensor w = torch::zeros({2}).requires_grad_(true);
  ASSERT_TRUE(CopyParamsByName(source, {{"head", emb}, {"emb", emb}, {"w", w}}).ok());
  EXPECT_TRUE(torch::equal(emb, torch::ones({2, 3}, torch::kBFloat16)));
  EXPECT_TRUE(torch::equal(w.detach(), torch::full({2}, 2.0)));

  torch::Tensor other = torch::zeros({2});
  EXPECT_THAT(std::string(CopyParamsByName(source, {{"emb", emb}}).message()),
              HasSubstr("matching no target: w"));
  EXPECT_THAT(
      std::string(CopyParamsByName(source, {{"emb", emb}, {"w", w}, {"x", other}}).message()),
      HasSubstr("no source value for: x"));
  EXPECT_THAT(
      std::string(CopyParamsByName(source, {{"emb", torch::zeros({3, 2})}, {"w", w}}).message()),
      HasSubstr("source [2, 3] vs target [3, 2]"));
}

// Trains a tiny model with torch::optim::AdamW, checkpoints it mid-way through the layout-free
// format, resumes into fresh objects, and checks the continued run matches bit for bit.
TEST(AdamWStateTest, ResumeThroughACheckpointIsBitExact) {
  auto make_params = [] { return Params(7); };
  auto loss_of = [](const std::vector<NamedParam>& params, int64_t step) {
    torch::Tensor loss = torch::zeros({});
    for (size_t i = 0; i + 1 < params.size(); ++i) {
      loss = loss + (params[i].param * (0.1 * static_cast<double>(step + 1))).sin().sum();
    }
    return loss;
  };
  auto unique = [](const std::vector<NamedParam>& params) {
    std::vector<torch::Tensor> out;
    for (size_t i = 0; i + 1 < params.size(); ++i) out.push_back(params[i].param);
    return out;
  };
  auto options = torch::optim::AdamWOptions(1e-2).betas({0.9, 0.95}).weight_decay(0.1);

  // Reference: 5 uninterrupted steps.
  std::vector<NamedParam> ref = make_params();
  torch::optim::AdamW ref_opt(unique(ref), options);
  for (int64_t s = 0; s < 5; ++s) {
    ref_opt.zero_grad();
    loss_of(ref, s).backward();
    ref_opt.step();
  }

  // Interrupted: 3 steps, checkpoint, resume into fresh objects, 2 more steps.
  std::vector<NamedParam> run = make_params();
  torch::optim::AdamW run_opt(unique(run), options);
  for (int64_t s = 0; s < 3; ++s) {
    run_opt.zero_grad();
    loss_of(run, s).backward();
    run_opt.step();
  }
  absl::StatusOr<std::vector<NamedParam>> exported = ExportAdamWState(run_opt, run);
  ASSERT_TRUE(exported.ok()) << exported.status();
  const std::string dir = NewDir("adamw") + "/ckpt";
  ASSERT_TRUE(SaveCheckpoint(dir, Trainer(3), run, *exported).ok());

  absl::StatusOr<Checkpoint> ckpt = LoadCheckpoint(dir);
  ASSERT_TRUE(ckpt.ok()) << ckpt.status();
  std::vector<NamedParam> resumed = Params(123);  // different initial values
  ASSERT_TRUE(CopyParamsByName(ckpt->params, resumed).ok());
  torch::optim::AdamW resumed_opt(unique(resumed), options);
  ASSERT_TRUE(ImportAdamWState(ckpt->optimizer_state, resumed, resumed_opt).ok());
  for (int64_t s = ckpt->trainer.step; s < 5; ++s) {
    resumed_opt.zero_grad();
    loss_of(resumed, s).backward();
    resumed_opt.step();
  }
  for (size_t i = 0; i + 1 < ref.size(); ++i) {
    EXPECT_TRUE(torch::equal(resumed[i].param, ref[i].param)) << ref[i].name;
  }

  // Importing state for a parameter the optimizer does not own is refused.
  torch::optim::AdamW empty_opt(
      std::vector<torch::Tensor>{torch::zeros({1}, torch::requires_grad())}, options);
  EXPECT_FALSE(ImportAdamWState(ckpt->optimizer_state, resumed, empty_opt).ok());
}

}  // namespace
}  // namespace memplan::io

namespace memplan::io {
namespace {

// [Per-rank checkpoints] Splits every tensor of (params, state) over `world` ranks at uneven cut
// points, as ranks would write them, and returns each rank's pieces.
std::vector<std::vector<TensorPiece>> SplitOverRanks(const std::vector<NamedParam>& params,
                                                     const std::vector<NamedParam>& state,
                                                     int world) {
  std::vector<std::vector<TensorPiece>> out(world);
  auto split = [&](const std::string& name, const torch::Tensor& t) {
    const torch::Tensor flat = t.detach().reshape({-1});
    const int64_t n = flat.numel();
    for (int r = 0; r < world; ++r) {
      // Rank r gets [n r^2 / W^2, n (r+1)^2 / W^2): unequal pieces, some of them empty.
      const int64_t lo = n * r * r / (world * world), hi = n * (r + 1) * (r + 1) / (world * world);
      if (hi > lo) out[r].push_back({name, lo, flat.narrow(0, lo, hi - lo).clone()});
    }
  };
  for (size_t i = 0; i + 1 < params.size(); ++i) split(params[i].name, params[i].param);
  for (const NamedParam& s : state) {
    if (s.name == "step") {
      out[0].push_back({"step", 0, s.param.reshape({1})});
    } else {
      split(s.name, s.param);
    }
  }
  return out;
}

TrainerState ShardedTrainer(int64_t step, int world) {
  TrainerState t = Trainer(step);
  t.workload.world_size = world;
  return t;
}

absl::Status SaveOverRanks(const std::string& dir, const TrainerState& trainer,
                           const std::vector<std::vector<TensorPiece>>& pieces) {
  const int world = static_cast<int>(pieces.size());
  const std::string staged = ShardedCheckpointStaging(dir, trainer.step, world);
  if (absl::Status s = BeginShardedCheckpoint(dir, staged); !s.ok()) return s;
  for (int r = 0; r < world; ++r) {
    if (absl::Status s = WriteCheckpointShard(staged, r, world, pieces[r]); !s.ok()) return s;
  }
  return FinishShardedCheckpoint(staged, dir, trainer, world);
}

TEST(PerRankCheckpointTest, PiecesOfThreeRanksLoadWholeAndByRange) {
  const std::string dir = JoinPath(NewDir("per_rank"), "ckpt");
  const std::vector<NamedParam> params = Params(11);
  const std::vector<NamedParam> state = State(params, 7);
  ASSERT_TRUE(SaveOverRanks(dir, ShardedTrainer(7, 3), SplitOverRanks(params, state, 3)).ok());
  // No gathered file: trainer.json, config.json and one file per rank.
  EXPECT_THAT(Listing(dir), ::testing::UnorderedElementsAre(
                                "config.json", "trainer.json", "rank-00000-of-00003.safetensors",
                                "rank-00001-of-00003.safetensors",
                                "rank-00002-of-00003.safetensors"));
  EXPECT_TRUE(IsPerRankCheckpoint(dir));

  // Assembled: the same checkpoint a single writer would have saved.
  absl::StatusOr<Checkpoint> loaded = LoadCheckpoint(dir);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_EQ(loaded->trainer.step, 7);
  ASSERT_EQ(loaded->params.size(), params.size() - 1);
  for (size_t i = 0; i + 1 < params.size(); ++i) {
    EXPECT_EQ(loaded->params[i].name, params[i].name);
    EXPECT_TRUE(torch::equal(loaded->params[i].param, params[i].param.detach()));
  }
  std::map<std::string, torch::Tensor> by_name;
  for (const NamedParam& s : loaded->optimizer_state) by_name[s.name] = s.param;
  ASSERT_EQ(by_name.size(), state.size());
  for (const NamedParam& s : state) EXPECT_TRUE(torch::equal(by_name[s.name], s.param)) << s.name;

  // By range: across piece boundaries, and out of range.
  absl::StatusOr<std::unique_ptr<CheckpointPieces>> pieces = CheckpointPieces::Open(dir);
  ASSERT_TRUE(pieces.ok()) << pieces.status();
  EXPECT_EQ((*pieces)->world_size(), 3);
  const NamedParam& emb = params.front();
  const int64_t n = emb.param.numel();
  EXPECT_EQ((*pieces)->Numel(emb.name), n);
  absl::StatusOr<torch::Tensor> mid = (*pieces)->Read(emb.name, n / 10, n / 2);
  ASSERT_TRUE(mid.ok()) << mid.status();
  EXPECT_TRUE(torch::equal(*mid, emb.param.detach().reshape({-1}).narrow(0, n / 10, n / 2)));
  EXPECT_EQ((*pieces)->Read(emb.name, n - 1, 2).status().code(), absl::StatusCode::kOutOfRange);
  EXPECT_EQ((*pieces)->Read("nope", 0, 1).status().code(), absl::StatusCode::kNotFound);
}

TEST(PerRankCheckpointTest, RefusesPiecesThatDoNotTileTheModel) {
  const std::vector<NamedParam> params = Params(12);
  const std::vector<NamedParam> state = State(params, 2);
  // A rank's file lost: a gap in every tensor; Finish refuses to publish.
  std::vector<std::vector<TensorPiece>> pieces = SplitOverRanks(params, state, 2);
  pieces[1].clear();
  const std::string dir = JoinPath(NewDir("per_rank_gap"), "ckpt");
  absl::Status s = SaveOverRanks(dir, ShardedTrainer(2, 2), pieces);
  EXPECT_FALSE(s.ok());
  EXPECT_FALSE(PathExists(dir));
  // Overlapping pieces: the same range written by two ranks.
  pieces = SplitOverRanks(params, state, 2);
  pieces[1].push_back(pieces[0].front());
  s = SaveOverRanks(dir, ShardedTrainer(2, 2), pieces);
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
  EXPECT_THAT(s.message(), HasSubstr("overlap"));
  // State of an unknown tensor.
  pieces = SplitOverRanks(params, state, 2);
  pieces[0].push_back({"model.nope.exp_avg", 0, torch::zeros({3})});
  s = SaveOverRanks(dir, ShardedTrainer(2, 2), pieces);
  EXPECT_THAT(s.message(), HasSubstr("model.nope.exp_avg"));
  EXPECT_FALSE(PathExists(dir));
}

TEST(PerRankCheckpointTest, ReplacesAnEarlierCheckpointAndDetectsATruncatedFile) {
  const std::string dir = JoinPath(NewDir("per_rank_replace"), "ckpt");
  const std::vector<NamedParam> first = Params(13);
  ASSERT_TRUE(SaveOverRanks(dir, ShardedTrainer(1, 2), SplitOverRanks(first, State(first, 1), 2))
                  .ok());
  const std::vector<NamedParam> second = Params(14);
  ASSERT_TRUE(
      SaveOverRanks(dir, ShardedTrainer(2, 3), SplitOverRanks(second, State(second, 2), 3)).ok());
  absl::StatusOr<Checkpoint> loaded = LoadCheckpoint(dir);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_EQ(loaded->trainer.step, 2);
  EXPECT_TRUE(torch::equal(loaded->params[1].param, second[1].param.detach()));
  EXPECT_EQ(Listing(dir).size(), 5u);  // the 2-rank files are gone with the old checkpoint
  // A rank file cut short: trainer.json's size check catches it.
  const std::string file = JoinPath(dir, CheckpointShardFile(1, 3));
  ASSERT_EQ(::truncate(file.c_str(), 100), 0);
  EXPECT_EQ(LoadCheckpoint(dir).status().code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(CheckpointPieces::Open(dir).status().code(), absl::StatusCode::kDataLoss);
}

}  // namespace
}  // namespace memplan::io
