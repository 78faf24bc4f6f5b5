#include "agent/train/trainer.h"

#include <ftw.h>
#include <gtest/gtest.h>
#include <stdlib.h>
#include <unistd.h>

#include <cstdio>
#include <limits>
#include <map>
#include <string>
#include <vector>

#include "tests/agent/tiny_spec.h"

namespace memplan {
namespace {

// The CI machine is shared; a single intra-op thread avoids OpenMP spin contention. Both paths of
// every comparison run with the same setting.
const bool kSingleThread = [] {
  torch::set_num_threads(1);
  return true;
}();

using testing::TinySpec;

std::unique_ptr<LlamaModel> MakeModel(const ModelSpec& spec) {
  LlamaModelOptions options;
  options.spec = spec;
  options.seed = 5;
  auto model = LlamaModel::Create(options);
  EXPECT_TRUE(model.ok()) << model.status();
  return std::move(model).value();
}

std::vector<MicroBatch> Batches(int64_t step, int grad_accum, int64_t vocab) {
  std::vector<MicroBatch> out;
  for (int i = 0; i < grad_accum; ++i) {
    auto gen = at::make_generator<at::CPUGeneratorImpl>(1000 + step * 16 + i);
    MicroBatch b;
    b.input_ids = torch::randint(vocab, {2, 16}, gen, torch::kLong);
    b.labels = b.input_ids.clone();
    b.labels.index_put_({1, 0}, -100);
    out.push_back(b);
  }
  return out;
}

TrainerOptions BaseOptions(int n_blocks) {
  TrainerOptions o;
  o.grad_accum = 2;
  o.max_grad_norm = 0.5;  // small enough to clip
  o.adamw.lr = 1e-2;
  o.adamw.weight_decay = 0.1;
  o.block_modes.assign(n_blocks, BlockMode::kNone);
  return o;
}

// std::filesystem is off limits here: libtorch.so exports its own copies of some of its symbols,
// which crash when mixed with the system libstdc++ (seen with remove_all).
std::string MakeTempDir() {
  std::string tmpl = ::testing::TempDir() + "/memplan_trainer_XXXXXX";
  EXPECT_NE(::mkdtemp(tmpl.data()), nullptr);
  return tmpl;
}

void RemoveTree(const std::string& dir) {
  ::nftw(
      dir.c_str(),
      [](const char* path, const struct stat*, int, struct FTW*) { return ::remove(path); }, 16,
      FTW_DEPTH | FTW_PHYS);
}

std::map<std::string, torch::Tensor> ByName(const std::vector<NamedParam>& v) {
  std::map<std::string, torch::Tensor> out;
  for (const auto& p : v) out[p.name] = p.param;
  return out;
}

void ExpectEqualByName(const std::vector<NamedParam>& expected, const std::vector<NamedParam>& got,
                       const std::string& what) {
  auto e = ByName(expected);
  auto g = ByName(got);
  ASSERT_EQ(e.size(), g.size()) << what;
  for (const auto& [name, t] : e) {
    ASSERT_TRUE(g.count(name)) << what << " " << name;
    ASSERT_TRUE(t.defined() && g[name].defined()) << what << " " << name;
    const torch::Tensor other = g[name].to(t.scalar_type());
    EXPECT_TRUE(torch::equal(t, other))
        << what << " " << name << " max diff " << (t - other).abs().max().item<double>();
  }
}

struct PlanCase {
  std::string name;
  bool tied = false;
  std::string family = "llama";
  std::vector<BlockMode> modes = {};  // empty: all NONE
  bool managed = false;
  int n_persist = 0;
  int n_buffer = 2;
  HostMemoryKind host = HostMemoryKind::kPinned;
  int64_t chunk_bytes = 128 << 10;  // one tiny block (~121 KiB) per chunk
};

// Readable parameter names in test output and ctest.
void PrintTo(const PlanCase& c, std::ostream* os) { *os << c.name; }

// The reference run: plain autograd, all params on the device, torch::optim::AdamW.
struct Reference {
  explicit Reference(const PlanCase& c) {
    model = MakeModel(TinySpec(c.tied, c.family));
    TrainerOptions o = BaseOptions(model->num_blocks());
    o.plain_reference = true;
    auto t = Trainer::Create(model.get(), o);
    EXPECT_TRUE(t.ok()) << t.status();
    trainer = std::move(t).value();
  }
  std::unique_ptr<LlamaModel> model;
  std::unique_ptr<Trainer> trainer;
};

std::unique_ptr<Trainer> MakeTrainer(const PlanCase& c, LlamaModel* model) {
  TrainerOptions o = BaseOptions(model->num_blocks());
  if (!c.modes.empty()) o.block_modes = c.modes;
  o.managed = c.managed;
  o.chunks.chunk_bytes = c.chunk_bytes;
  o.chunks.n_persist = c.n_persist;
  o.chunks.n_buffer = c.n_buffer;
  o.chunks.host_memory = c.host;
  o.chunks.cpu_threads = 2;
  auto t = Trainer::Create(model, o);
  EXPECT_TRUE(t.ok()) << t.status();
  return t.ok() ? std::move(t).value() : nullptr;
}

using M = BlockMode;

class PlanMatrixTest : public ::testing::TestWithParam<PlanCase> {};

TEST_P(PlanMatrixTest, SameLossGradsAndParamsAsReference) {
  const PlanCase& c = GetParam();
  Reference ref(c);
  auto model = MakeModel(TinySpec(c.tied, c.family));
  auto trainer = MakeTrainer(c, model.get());
  ASSERT_NE(trainer, nullptr);
  const int64_t vocab = model->spec().vocab_size;

  // Step 1 in two halves: loss and accumulated gradients.
  auto ref_loss = ref.trainer->ForwardBackward(Batches(0, 2, vocab));
  auto loss = trainer->ForwardBackward(Batches(0, 2, vocab));
  ASSERT_TRUE(ref_loss.ok() && loss.ok()) << ref_loss.status() << loss.status();
  EXPECT_EQ(*ref_loss, *loss);
  ExpectEqualByName(ref.trainer->Grads(), trainer->Grads(), "grads");
  auto ref_norm = ref.trainer->OptimizerStep();
  auto norm = trainer->OptimizerStep();
  ASSERT_TRUE(ref_norm.ok() && norm.ok()) << ref_norm.status() << norm.status();
  EXPECT_EQ(*ref_norm, *norm);
  EXPECT_GT(*norm, 0.5);  // clipping was active

  // Steps 2-4: losses and final parameters.
  for (int64_t step = 1; step < 4; ++step) {
    auto r = ref.trainer->Step(Batches(step, 2, vocab));
    auto s = trainer->Step(Batches(step, 2, vocab));
    ASSERT_TRUE(r.ok() && s.ok()) << r.status() << s.status();
    EXPECT_EQ(r->loss, s->loss) << "step " << step;
    EXPECT_EQ(s->step, step + 1);
  }
  ExpectEqualByName(ref.trainer->Params(), trainer->Params(), "params");

  // The plan really was applied.
  if (c.managed) {
    const ChunkMemoryStats stats = trainer->chunk_manager()->MemoryStats();
    EXPECT_GE(stats.n_chunks, 5);  // embedding, one per block, head
    EXPECT_EQ(stats.n_persist, std::min(c.n_persist, stats.n_chunks));
  }
  bool offloads = false;
  for (BlockMode m : c.modes) offloads = offloads || m == M::kSwap || m == M::kHsOffload;
  if (offloads) {
    EXPECT_GT(trainer->offloader()->Stats().offloaded_bytes, 0);
    EXPECT_EQ(trainer->offloader()->Stats().host_bytes, 0);
  }
}

const std::vector<M> kMixed = {M::kSwap, M::kHsOffload, M::kCkpt, M::kNone};
INSTANTIATE_TEST_SUITE_P(
    Plans, PlanMatrixTest,
    ::testing::Values(
        PlanCase{.name = "unmanaged_grouped_none",
                 .modes = {M::kNone, M::kNone, M::kNone, M::kNone}},
        PlanCase{.name = "unmanaged_ckpt", .modes = {M::kCkpt, M::kCkpt, M::kCkpt, M::kCkpt}},
        PlanCase{.name = "unmanaged_swap", .modes = {M::kSwap, M::kSwap, M::kSwap, M::kSwap}},
        PlanCase{.name = "unmanaged_hs_offload",
                 .modes = {M::kHsOffload, M::kHsOffload, M::kHsOffload, M::kHsOffload}},
        PlanCase{.name = "unmanaged_mixed_tied", .tied = true, .modes = kMixed},
        PlanCase{.name = "all_persistent", .managed = true, .n_persist = 1000},
        PlanCase{.name = "offloaded_1_buffer", .managed = true, .n_buffer = 1},
        PlanCase{.name = "offloaded_2_buffers", .managed = true, .n_buffer = 2},
        PlanCase{.name = "offloaded_pageable",
                 .managed = true,
                 .n_buffer = 2,
                 .host = HostMemoryKind::kPageable},
        PlanCase{.name = "half_persistent_mixed", .modes = kMixed, .managed = true, .n_persist = 3},
        PlanCase{.name = "offloaded_mixed_tied",
                 .tied = true,
                 .modes = kMixed,
                 .managed = true,
                 .n_buffer = 1},
        PlanCase{.name = "qwen2_offloaded_swap",
                 .family = "qwen2",
                 .modes = {M::kSwap, M::kSwap, M::kNone, M::kNone},
                 .managed = true,
                 .n_persist = 2},
        PlanCase{.name = "qwen3_offloaded_hs_tied",
                 .tied = true,
                 .family = "qwen3",
                 .modes = {M::kHsOffload, M::kCkpt, M::kHsOffload, M::kNone},
                 .managed = true,
                 .n_buffer = 2},
        // 8 KiB chunks: every weight matrix (>= 16 KiB) is an oversized chunk with a device
        // buffer of its own; the norms share the regular buffers.
        PlanCase{.name = "oversized_chunks_tied",
                 .tied = true,
                 .modes = kMixed,
                 .managed = true,
                 .n_persist = 1,
                 .n_buffer = 1,
                 .chunk_bytes = 8 << 10}),
    [](const auto& info) { return info.param.name; });

TEST(TrainerTest, RejectsBadOptions) {
  auto model = MakeModel(TinySpec());
  TrainerOptions o;
  o.grad_accum = 0;
  EXPECT_EQ(Trainer::Create(model.get(), o).status().code(), absl::StatusCode::kInvalidArgument);
  o = TrainerOptions();
  o.block_modes = {M::kNone};
  EXPECT_EQ(Trainer::Create(model.get(), o).status().code(), absl::StatusCode::kInvalidArgument);
  o = TrainerOptions();
  auto trainer = Trainer::Create(model.get(), o);
  ASSERT_TRUE(trainer.ok());
  EXPECT_EQ((*trainer)->Step(Batches(0, 2, 128)).status().code(),
            absl::StatusCode::kInvalidArgument);  // grad_accum is 1
}

TEST(TrainerTest, LossGoesDownOnARepeatedBatch) {
  auto model = MakeModel(TinySpec());
  TrainerOptions o = BaseOptions(model->num_blocks());
  o.grad_accum = 1;
  auto trainer = Trainer::Create(model.get(), o);
  ASSERT_TRUE(trainer.ok());
  auto batch = Batches(0, 1, 128);
  auto first = (*trainer)->Step(batch);
  ASSERT_TRUE(first.ok());
  StepStats last;
  for (int i = 0; i < 5; ++i) last = *(*trainer)->Step(batch);
  EXPECT_LT(last.loss, first->loss - 0.5);
  EXPECT_EQ(last.tokens, 32);
  EXPECT_GT(last.tokens_per_second, 0);
  EXPECT_EQ(last.peak_allocated_bytes, 0);  // CPU
}

// Without clipping, offloaded chunks' CPU updates start during backward (the trainer tells the
// chunk manager that nothing will be clipped); with clipping they wait for the global norm.
TEST(TrainerTest, CpuUpdatesOverlapBackwardOnlyWithoutClipping) {
  for (const double clip : {0.0, 0.5}) {
    auto model = MakeModel(TinySpec());
    TrainerOptions o = BaseOptions(model->num_blocks());
    o.grad_accum = 1;
    o.max_grad_norm = clip;
    o.managed = true;
    o.chunks.chunk_bytes = 16 << 10;
    o.chunks.n_persist = 1;
    o.chunks.cpu_threads = 2;
    auto trainer = Trainer::Create(model.get(), o);
    ASSERT_TRUE(trainer.ok()) << trainer.status();
    const int offloaded = (*trainer)->chunk_manager()->MemoryStats().n_chunks - 1;
    ASSERT_GT(offloaded, 1);
    for (int step = 0; step < 2; ++step) {
      absl::StatusOr<StepStats> stats = (*trainer)->Step(Batches(step, 1, 128));
      ASSERT_TRUE(stats.ok()) << stats.status();
      // Every offloaded chunk's update started before OptimizerStep() without clipping; none
      // with clipping.
      EXPECT_EQ(stats->offloaded_updates_in_backward, clip == 0 ? offloaded : 0) << "clip " << clip;
    }
  }
}

// Resume under a different plan: save after two steps of plan A, restore into plan B (and into
// the unmanaged reference), and the next step's loss and parameters match continuing plan A.
TEST(TrainerTest, CheckpointResumesExactlyUnderAnotherPlan) {
  const std::string root = MakeTempDir();
  const std::string dir = root + "/ckpt";
  PlanCase plan_a{.name = "a", .modes = kMixed, .managed = true, .n_buffer = 1};
  PlanCase plan_b{.name = "b",
                  .modes = {M::kCkpt, M::kNone, M::kSwap, M::kHsOffload},
                  .managed = true,
                  .n_persist = 2,
                  .host = HostMemoryKind::kPageable};
  PlanCase plan_c{.name = "c"};  // unmanaged

  auto model_a = MakeModel(TinySpec());
  auto a = MakeTrainer(plan_a, model_a.get());
  for (int64_t step = 0; step < 2; ++step) ASSERT_TRUE(a->Step(Batches(step, 2, 128)).ok());
  io::TrainerState state;
  state.data_position = 4;
  ASSERT_TRUE(a->SaveCheckpoint(dir, state).ok());
  auto loaded = io::LoadCheckpoint(dir);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_EQ(loaded->trainer.step, 2);

  auto continued = a->Step(Batches(2, 2, 128));
  ASSERT_TRUE(continued.ok());
  for (const PlanCase& plan : {plan_b, plan_c}) {
    auto model = MakeModel(TinySpec());
    auto trainer = MakeTrainer(plan, model.get());
    ASSERT_TRUE(trainer->RestoreCheckpoint(*loaded).ok()) << plan.name;
    EXPECT_EQ(trainer->step(), 2);
    auto resumed = trainer->Step(Batches(2, 2, 128));
    ASSERT_TRUE(resumed.ok()) << resumed.status();
    EXPECT_EQ(resumed->loss, continued->loss) << plan.name;
    ExpectEqualByName(a->Params(), trainer->Params(), "params after resume " + plan.name);
  }
  RemoveTree(root);
}

// Every optimizer the planner offers, managed (some chunks persistent, some offloaded) against
// the unmanaged trainer, bit for bit on CPU after two steps:
//   adamw_bf16: at::_fused_adamw_ on the bf16 parameters on both paths (torch.optim.AdamW with
//     fused=True); offloaded grads summed in bf16 as autograd sums the unmanaged .grad;
//   sgd (fp32): torch::optim::SGD unmanaged, the chunk manager's SGD managed.
struct OptimizerPlanCase {
  std::string name;
  OptimizerKind optimizer;
  DType dtype;
  bool tied;
  int grad_accum;
  double max_grad_norm;
  int n_persist;
};
void PrintTo(const OptimizerPlanCase& c, std::ostream* os) { *os << c.name; }

std::unique_ptr<LlamaModel> MakeTypedModel(const ModelSpec& spec, DType dtype) {
  LlamaModelOptions options;
  options.spec = spec;
  options.seed = 5;
  options.dtype = dtype;
  auto model = LlamaModel::Create(options);
  EXPECT_TRUE(model.ok()) << model.status();
  return std::move(model).value();
}

TrainerOptions OptimizerOptions(const OptimizerPlanCase& c, int n_blocks, bool managed) {
  TrainerOptions o = BaseOptions(n_blocks);
  o.optimizer = c.optimizer;
  o.grad_accum = c.grad_accum;
  o.max_grad_norm = c.max_grad_norm;
  o.managed = managed;
  o.chunks.chunk_bytes = 64 << 10;  // a tiny bf16 block per chunk
  o.chunks.n_persist = c.n_persist;
  o.chunks.n_buffer = 2;
  o.chunks.host_memory = HostMemoryKind::kPageable;
  o.chunks.cpu_threads = 2;
  return o;
}

class OptimizerPlanTest : public ::testing::TestWithParam<OptimizerPlanCase> {};

TEST_P(OptimizerPlanTest, ManagedEqualsUnmanaged) {
  const OptimizerPlanCase& c = GetParam();
  auto ref_model = MakeTypedModel(TinySpec(c.tied), c.dtype);
  auto model = MakeTypedModel(TinySpec(c.tied), c.dtype);
  auto reference =
      Trainer::Create(ref_model.get(), OptimizerOptions(c, ref_model->num_blocks(), false));
  ASSERT_TRUE(reference.ok()) << reference.status();
  auto managed = Trainer::Create(model.get(), OptimizerOptions(c, model->num_blocks(), true));
  ASSERT_TRUE(managed.ok()) << managed.status();
  const ChunkMemoryStats stats = (*managed)->chunk_manager()->MemoryStats();
  ASSERT_GT(stats.n_persist, 0);
  ASSERT_LT(stats.n_persist, stats.n_chunks) << "some chunks must be offloaded";
  ExpectEqualByName((*reference)->Params(), (*managed)->Params(), "initial params");
  std::vector<NamedParam> before = (*reference)->Params();
  for (int64_t step = 0; step < 2; ++step) {
    auto r = (*reference)->Step(Batches(step, c.grad_accum, 128));
    auto m = (*managed)->Step(Batches(step, c.grad_accum, 128));
    ASSERT_TRUE(r.ok()) << r.status();
    ASSERT_TRUE(m.ok()) << m.status();
    EXPECT_EQ(r->loss, m->loss) << "step " << step;
    if (c.max_grad_norm > 0) {
      EXPECT_EQ(r->grad_norm, m->grad_norm) << "step " << step;
    }
  }
  const std::vector<NamedParam> params = (*reference)->Params();
  for (const NamedParam& p : params) {
    EXPECT_EQ(p.param.scalar_type(),
              c.dtype == DType::kBFloat16 ? torch::kBFloat16 : torch::kFloat32);
  }
  ExpectEqualByName(params, (*managed)->Params(), "params after 2 steps");
  EXPECT_FALSE(torch::equal(ByName(before).begin()->second, ByName(params).begin()->second))
      << "the optimizer should move the parameters";
  // Optimizer state: the same tensors on both paths (bf16 moments for adamw_bf16, none for sgd).
  auto ref_state = (*reference)->OptimizerState();
  auto state = (*managed)->OptimizerState();
  ASSERT_TRUE(ref_state.ok() && state.ok());
  if (c.optimizer == OptimizerKind::kSgd) {
    EXPECT_TRUE(ref_state->empty());
    EXPECT_TRUE(state->empty());
  } else {
    for (const NamedParam& s : *state) {
      if (s.name != "step") {
        EXPECT_EQ(s.param.scalar_type(), torch::kBFloat16) << s.name;
      }
    }
    ExpectEqualByName(*ref_state, *state, "optimizer state");
  }
}

INSTANTIATE_TEST_SUITE_P(
    Optimizers, OptimizerPlanTest,
    ::testing::Values(
        // name, optimizer, dtype, tied, grad_accum, max_grad_norm, n_persist
        OptimizerPlanCase{"adamw_bf16_accum1", OptimizerKind::kAdamWBf16States, DType::kBFloat16,
                          false, 1, 0, 2},
        OptimizerPlanCase{"adamw_bf16_accum1_clip_tied", OptimizerKind::kAdamWBf16States,
                          DType::kBFloat16, true, 1, 0.5, 3},
        OptimizerPlanCase{"adamw_bf16_accum2", OptimizerKind::kAdamWBf16States, DType::kBFloat16,
                          true, 2, 0, 1},
        OptimizerPlanCase{"adamw_bf16_accum2_clip", OptimizerKind::kAdamWBf16States,
                          DType::kBFloat16, false, 2, 0.5, 2},
        OptimizerPlanCase{"sgd_accum1", OptimizerKind::kSgd, DType::kFloat32, true, 1, 0, 2},
        OptimizerPlanCase{"sgd_accum1_clip", OptimizerKind::kSgd, DType::kFloat32, false, 1, 0.5,
                          1},
        OptimizerPlanCase{"sgd_accum2", OptimizerKind::kSgd, DType::kFloat32, false, 2, 0, 3},
        OptimizerPlanCase{"sgd_accum2_clip_tied", OptimizerKind::kSgd, DType::kFloat32, true, 2,
                          0.5, 2}),
    [](const auto& info) { return info.param.name; });

TEST(TrainerTest, Bf16AdamWNeedsABf16Model) {
  auto model = MakeModel(TinySpec());  // fp32
  TrainerOptions o;
  o.optimizer = OptimizerKind::kAdamWBf16States;
  const absl::Status status = Trainer::Create(model.get(), o).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(status.message().find("--optimizer adamw_bf16"), std::string::npos) << status;
  EXPECT_NE(status.message().find("--dtype bf16"), std::string::npos) << status;
}

// adamw_bf16 state survives a checkpoint across plans; another optimizer cannot resume it.
TEST(TrainerTest, Bf16AdamWCheckpointResumesAndOtherOptimizersAreRefused) {
  const std::string root = MakeTempDir();
  const std::string dir = root + "/ckpt";
  OptimizerPlanCase c{"", OptimizerKind::kAdamWBf16States, DType::kBFloat16, false, 1, 0.5, 2};
  auto model_a = MakeTypedModel(TinySpec(), c.dtype);
  auto a = Trainer::Create(model_a.get(), OptimizerOptions(c, model_a->num_blocks(), true));
  ASSERT_TRUE(a.ok()) << a.status();
  for (int64_t step = 0; step < 2; ++step) ASSERT_TRUE((*a)->Step(Batches(step, 1, 128)).ok());
  ASSERT_TRUE((*a)->SaveCheckpoint(dir, io::TrainerState()).ok());
  auto loaded = io::LoadCheckpoint(dir);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_EQ(loaded->trainer.optimizer.kind, "adamw_bf16");
  auto continued = (*a)->Step(Batches(2, 1, 128));
  ASSERT_TRUE(continued.ok());

  auto model_b = MakeTypedModel(TinySpec(), c.dtype);
  auto b = Trainer::Create(model_b.get(), OptimizerOptions(c, model_b->num_blocks(), false));
  ASSERT_TRUE(b.ok());
  ASSERT_TRUE((*b)->RestoreCheckpoint(*loaded).ok());
  auto resumed = (*b)->Step(Batches(2, 1, 128));
  ASSERT_TRUE(resumed.ok());
  EXPECT_EQ(resumed->loss, continued->loss);
  ExpectEqualByName((*a)->Params(), (*b)->Params(), "params after resume");

  OptimizerPlanCase other = c;
  other.optimizer = OptimizerKind::kAdamW;
  auto model_c = MakeTypedModel(TinySpec(), c.dtype);
  auto d = Trainer::Create(model_c.get(), OptimizerOptions(other, model_c->num_blocks(), true));
  ASSERT_TRUE(d.ok());
  const absl::Status refused = (*d)->RestoreCheckpoint(*loaded);
  EXPECT_EQ(refused.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(refused.message().find("adamw_bf16"), std::string::npos) << refused;
  EXPECT_NE(refused.message().find("--optimizer"), std::string::npos) << refused;
  RemoveTree(root);
}

// [Non-finite steps]
void Poison(LlamaModel* model, const std::string& name) {
  torch::NoGradGuard no_grad;
  for (const NamedParam& p : model->TrainableParams()) {
    if (p.name == name) p.param.detach().fill_(std::numeric_limits<float>::quiet_NaN());
  }
}

// Parameters equal by name, a NaN equal to a NaN: nothing was updated.
void ExpectUnchanged(const std::vector<NamedParam>& before, const std::vector<NamedParam>& after) {
  auto b = ByName(before);
  auto a = ByName(after);
  ASSERT_EQ(a.size(), b.size());
  for (const auto& [name, t] : b) {
    EXPECT_TRUE(torch::allclose(t, a[name], 0, 0, /*equal_nan=*/true)) << name;
  }
}

// --skip-nonfinite without clipping; managed: offloaded chunks that, without the option, would
// start their CPU updates during backward.
TrainerOptions SkipNonfiniteOptions(int num_blocks, bool managed, int grad_accum) {
  TrainerOptions o = BaseOptions(num_blocks);
  o.skip_nonfinite = true;
  o.grad_accum = grad_accum;
  o.max_grad_norm = 0;
  o.managed = managed;
  o.chunks.chunk_bytes = 128 << 10;
  o.chunks.n_persist = 1;
  o.chunks.host_memory = HostMemoryKind::kPageable;
  o.chunks.cpu_threads = 2;
  return o;
}

TEST(TrainerNonFiniteTest, NaNWeightsStopTheRunBeforeTheUpdateNamingTheStep) {
  auto model = MakeModel(TinySpec());
  Poison(model.get(), "model.norm.weight");
  auto trainer = Trainer::Create(model.get(), BaseOptions(model->num_blocks()));
  ASSERT_TRUE(trainer.ok()) << trainer.status();
  const std::vector<NamedParam> before = (*trainer)->Params();
  auto step = (*trainer)->Step(Batches(0, 2, model->spec().vocab_size));
  ASSERT_FALSE(step.ok());
  EXPECT_EQ(step.status().code(), absl::StatusCode::kAborted);
  EXPECT_NE(step.status().message().find("step 1: the loss is nan"), std::string::npos)
      << step.status();
  EXPECT_NE(step.status().message().find("--skip-nonfinite"), std::string::npos);
  EXPECT_EQ((*trainer)->step(), 0);
  ExpectUnchanged(before, (*trainer)->Params());
}

TEST(TrainerNonFiniteTest, NonFiniteGradientsWithAFiniteLossAreFoundWithAndWithoutClipping) {
  for (const double clip : {0.0, 0.5}) {
    auto model = MakeModel(TinySpec());
    for (const NamedParam& p : model->TrainableParams()) {
      if (p.name == "model.layers.1.mlp.down_proj.weight") {
        p.param.register_hook([](torch::Tensor g) { return g * std::numeric_limits<float>::infinity(); });
      }
    }
    TrainerOptions o = BaseOptions(model->num_blocks());
    o.max_grad_norm = clip;
    auto trainer = Trainer::Create(model.get(), o);
    ASSERT_TRUE(trainer.ok()) << trainer.status();
    const std::vector<NamedParam> before = (*trainer)->Params();
    auto step = (*trainer)->Step(Batches(0, 2, model->spec().vocab_size));
    ASSERT_EQ(step.status().code(), absl::StatusCode::kAborted) << "clip " << clip;
    EXPECT_NE(step.status().message().find(clip > 0 ? "step 1: the global gradient norm is"
                                                    : "step 1: the gradient of model.layers.1.mlp.down_proj.weight holds NaN"),
              std::string::npos)
        << step.status();
    ExpectUnchanged(before, (*trainer)->Params());
  }
}

TEST(TrainerNonFiniteTest, SkipDropsTheStepUnmanagedAndManagedUpToTheLimit) {
  for (const bool managed : {false, true}) {
    auto model = MakeModel(TinySpec());
    Poison(model.get(), "model.norm.weight");
    TrainerOptions o = SkipNonfiniteOptions(model->num_blocks(), managed, /*grad_accum=*/1);
    o.max_consecutive_nonfinite_skips = 2;
    auto trainer = Trainer::Create(model.get(), o);
    ASSERT_TRUE(trainer.ok()) << trainer.status();
    const std::vector<NamedParam> before = (*trainer)->Params();
    for (int64_t i = 0; i < 2; ++i) {
      auto step = (*trainer)->Step(Batches(i, 1, model->spec().vocab_size));
      ASSERT_TRUE(step.ok()) << step.status();
      EXPECT_TRUE(step->skipped);
      EXPECT_EQ(step->step, i + 1);
      EXPECT_EQ(step->nonfinite, "the loss is nan");
    }
    ExpectUnchanged(before, (*trainer)->Params());
    auto state = (*trainer)->OptimizerState();
    ASSERT_TRUE(state.ok());
    EXPECT_TRUE(state->empty()) << "managed " << managed;  // never updated: no state
    auto third = (*trainer)->Step(Batches(2, 1, model->spec().vocab_size));
    EXPECT_EQ(third.status().code(), absl::StatusCode::kAborted);
    EXPECT_NE(third.status().message().find("3 non-finite steps in a row"), std::string::npos)
        << third.status();
  }
}

// A finite loss with an infinite gradient: a managed run (the norm is known only inside the chunk
// manager's step) skips it without updating anything, with one micro-batch and with several, and
// the next finite step updates as usual.
TEST(TrainerNonFiniteTest, ManagedSkipsAFiniteLossWithANonFiniteGradient) {
  for (const int accum : {1, 2}) {
    auto model = MakeModel(TinySpec());
    auto poisoned = std::make_shared<bool>(true);
    for (const NamedParam& p : model->TrainableParams()) {
      if (p.name == "model.layers.1.mlp.down_proj.weight") {
        p.param.register_hook([poisoned](torch::Tensor g) {
          return *poisoned ? g * std::numeric_limits<float>::infinity() : g;
        });
      }
    }
    TrainerOptions o = SkipNonfiniteOptions(model->num_blocks(), /*managed=*/true, accum);
    auto trainer = Trainer::Create(model.get(), o);
    ASSERT_TRUE(trainer.ok()) << trainer.status();
    const std::vector<NamedParam> before = (*trainer)->Params();
    auto step = (*trainer)->Step(Batches(0, accum, model->spec().vocab_size));
    ASSERT_TRUE(step.ok()) << "accum " << accum << ": " << step.status();
    EXPECT_TRUE(step->skipped) << "accum " << accum;
    EXPECT_NE(step->nonfinite.find("the global gradient norm is"), std::string::npos)
        << step->nonfinite;
    ExpectUnchanged(before, (*trainer)->Params());
    EXPECT_EQ((*trainer)->chunk_manager()->UpdatesStartedBeforeStep(), 0);

    *poisoned = false;
    auto next = (*trainer)->Step(Batches(accum, accum, model->spec().vocab_size));
    ASSERT_TRUE(next.ok()) << next.status();
    EXPECT_FALSE(next->skipped);
    EXPECT_TRUE(std::isfinite(next->loss));
    int changed = 0;
    auto after = ByName((*trainer)->Params());
    for (const auto& [name, t] : ByName(before)) {
      EXPECT_TRUE(torch::isfinite(after[name]).all().item<bool>()) << name;
      if (!torch::equal(t, after[name])) ++changed;
    }
    EXPECT_GT(changed, 0) << "accum " << accum << ": the finite step updated nothing";
  }
}

}  // namespace
}  // namespace memplan
