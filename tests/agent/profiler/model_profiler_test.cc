#include "agent/profiler/model_profiler.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <memory>

#include "agent/client/record_json.h"
#include "agent/profiler/on_demand_profiler.h"

namespace memplan {
namespace {

ModelSpec TinySpec(bool tied) {
  ModelSpec s;
  s.name = "profiler-tiny";
  s.hidden_size = 64;
  s.num_layers = 3;
  s.num_heads = 4;
  s.num_kv_heads = 2;
  s.intermediate_size = 160;
  s.vocab_size = 512;
  s.tie_word_embeddings = tied;
  return s;
}

std::unique_ptr<LlamaModel> MakeModel(const ModelSpec& spec) {
  LlamaModelOptions o;
  o.spec = spec;
  o.dtype = DType::kFloat32;
  o.seed = 3;
  auto model = LlamaModel::Create(o);
  EXPECT_TRUE(model.ok()) << model.status();
  return std::move(model).value();
}

ProfilerOptions Options(int64_t batch, int64_t seq) {
  ProfilerOptions o;
  o.workload.micro_batch = batch;
  o.workload.seq_len = seq;
  o.hardware_name = "test-cpu";
  o.chunk_bytes = 64 << 10;
  return o;
}

int64_t Bytes(const std::vector<NamedParam>& params) {
  int64_t total = 0;
  for (const NamedParam& p : params) total += p.param.numel() * p.param.element_size();
  return total;
}

TEST(ModelProfilerTest, TinyModelTraceIsConsistent) {
  const ModelSpec spec = TinySpec(/*tied=*/false);
  auto model = MakeModel(spec);
  const int64_t batch = 2, seq = 16;
  absl::StatusOr<ProfileResult> r = ProfileModel(*model, Options(batch, seq));
  ASSERT_TRUE(r.ok()) << r.status();
  const Trace& t = r->trace;
  EXPECT_EQ(r->memory_source, "cpu_allocator_reports");
  EXPECT_FALSE(t.analytic);
  EXPECT_EQ(t.hardware_name, "test-cpu");
  EXPECT_EQ(t.param_dtype, DType::kFloat32);
  EXPECT_EQ(t.workload.micro_batch, batch);
  EXPECT_EQ(t.workload.seq_len, seq);
  ASSERT_EQ(static_cast<int>(t.blocks.size()), spec.num_layers);

  const int64_t input_bytes = batch * seq * spec.hidden_size * 4;
  const ParamGroups groups = model->ParamGroups();
  for (int i = 0; i < spec.num_layers; ++i) {
    const BlockTrace& b = t.blocks[i];
    SCOPED_TRACE(i);
    EXPECT_EQ(b.input_bytes, input_bytes);
    EXPECT_EQ(b.param_bytes, Bytes(groups[i + 1]));
    // A block keeps its input-sized output plus several hidden-, q/k/v- and MLP-sized tensors.
    EXPECT_GT(b.saved_bytes, 4 * input_bytes);
    EXPECT_GT(b.forward_seconds, 0);
    EXPECT_GT(b.backward_seconds, 0);
    EXPECT_GT(b.recompute_seconds, 0);
    EXPECT_GT(b.backward_transient_bytes, 0);
    // Identical shapes allocate identically on the CPU, and the blocks share one median time.
    EXPECT_EQ(b.saved_bytes, t.blocks[0].saved_bytes);
    EXPECT_EQ(b.forward_seconds, t.blocks[0].forward_seconds);
    EXPECT_EQ(b.recompute_seconds, t.blocks[0].recompute_seconds);
  }
  EXPECT_EQ(t.embedding.param_bytes, spec.vocab_size * spec.hidden_size * 4);
  EXPECT_EQ(t.head.param_bytes, (spec.vocab_size + 1) * spec.hidden_size * 4);
  EXPECT_GT(t.head.saved_bytes, batch * seq * spec.vocab_size * 4)
      << "the head keeps at least the fp32 log-probabilities";
  EXPECT_GT(t.embedding.forward_seconds, 0);
  EXPECT_GT(t.head.backward_seconds, 0);

  // Everything alive at the end of forward is attributed to some group, except the rotary
  // cos/sin tables the model builds before the first group ([seq, head_dim] each, fp32).
  int64_t attributed = t.embedding.saved_bytes + t.head.saved_bytes;
  for (const BlockTrace& b : t.blocks) attributed += b.saved_bytes;
  const int64_t rope_bytes = 2 * seq * spec.HeadDim() * 4;
  EXPECT_EQ(t.forward_end_bytes, attributed + rope_bytes);

  // Model state and chunk layout.
  int64_t numel = 0;
  for (const NamedParam& p : model->Params()) numel += p.param.numel();
  EXPECT_EQ(t.total_param_count, numel);
  EXPECT_EQ(t.trainable_param_count, numel);
  EXPECT_EQ(r->param_bytes, numel * 4);
  EXPECT_EQ(r->grad_bytes, numel * 4) << "every parameter gets an fp32 gradient";
  EXPECT_EQ(t.chunk_bytes, 64 << 10);
  int64_t chunked = 0;
  for (int64_t c : t.chunk_param_bytes) chunked += c;
  EXPECT_GE(chunked, numel * 4);
  EXPECT_GT(r->step_peak_bytes, 0);

  // The passes leave no gradients behind.
  for (const NamedParam& p : model->Params()) EXPECT_FALSE(p.param.grad().defined()) << p.name;
}

TEST(ModelProfilerTest, CheckpointedBlocksKeepOnlyTheirOutput) {
  const ModelSpec spec = TinySpec(/*tied=*/true);
  auto model = MakeModel(spec);
  absl::StatusOr<ProfileResult> r = ProfileModel(*model, Options(1, 32));
  ASSERT_TRUE(r.ok()) << r.status();
  // Two passes (a warm-up and the timed one), odd blocks checkpointed in both.
  EXPECT_EQ(r->passes, 2);
  EXPECT_TRUE(r->ckpt_groups.empty());
  ASSERT_EQ(static_cast<int>(r->block_modes.size()), spec.num_layers);
  const int64_t input_bytes = 32 * spec.hidden_size * 4;
  for (int i = 0; i < spec.num_layers; ++i) {
    SCOPED_TRACE(i);
    EXPECT_EQ(r->block_modes[i], i % 2 == 1 ? BlockMode::kCkpt : BlockMode::kNone);
    const GroupMeasurement& m = r->groups[i + 1];
    const int64_t kept = m.forward_end_bytes - m.forward_start_bytes;
    if (r->block_modes[i] == BlockMode::kCkpt) {
      // The output, plus the saved RNG state a recompute restores (a few KiB).
      EXPECT_GE(kept, input_bytes);
      EXPECT_LT(kept, input_bytes + (16 << 10));
      // The trace describes the block in NONE mode: its NONE neighbour's figures.
      EXPECT_EQ(r->trace.blocks[i].saved_bytes, r->trace.blocks[i - 1].saved_bytes);
      EXPECT_LT(kept, r->trace.blocks[i].saved_bytes);
    } else {
      EXPECT_EQ(r->trace.blocks[i].saved_bytes, kept);
    }
    EXPECT_GT(r->trace.blocks[i].recompute_seconds, 0);
  }
  // Tied: the head owns only the final norm; the shared weight is the embedding's.
  EXPECT_EQ(r->trace.head.param_bytes, spec.hidden_size * 4);
  EXPECT_EQ(r->trace.embedding.param_bytes, spec.vocab_size * spec.hidden_size * 4);
}

// The interleaved pass reconstructs the all-NONE trace: the memory figures equal those of a
// profile that ran every block NONE (identical shapes allocate identically on the CPU).
TEST(ModelProfilerTest, InterleavedPassGivesTheAllNoneMemoryFigures) {
  const ModelSpec spec = TinySpec(/*tied=*/false);
  auto model = MakeModel(spec);
  ProfilerOptions none = Options(2, 16);
  none.measure_recompute = false;
  absl::StatusOr<ProfileResult> a = ProfileModel(*model, none);
  absl::StatusOr<ProfileResult> b = ProfileModel(*model, Options(2, 16));
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(a->passes, 2);
  EXPECT_EQ(b->passes, 2);
  for (BlockMode m : a->block_modes) EXPECT_EQ(m, BlockMode::kNone);
  EXPECT_EQ(b->trace.forward_end_bytes, a->trace.forward_end_bytes);
  EXPECT_EQ(b->trace.embedding.saved_bytes, a->trace.embedding.saved_bytes);
  EXPECT_EQ(b->trace.head.saved_bytes, a->trace.head.saved_bytes);
  ASSERT_EQ(a->trace.blocks.size(), b->trace.blocks.size());
  for (size_t i = 0; i < a->trace.blocks.size(); ++i) {
    SCOPED_TRACE(i);
    EXPECT_EQ(b->trace.blocks[i].saved_bytes, a->trace.blocks[i].saved_bytes);
    EXPECT_EQ(b->trace.blocks[i].forward_transient_bytes, a->trace.blocks[i].forward_transient_bytes);
    EXPECT_EQ(b->trace.blocks[i].backward_transient_bytes,
              a->trace.blocks[i].backward_transient_bytes);
  }
}

// A one-block model has no pair: recompute comes from a separate (warmed-up) all-CKPT pass.
TEST(ModelProfilerTest, OneBlockModelGetsASeparateCheckpointPass) {
  ModelSpec spec = TinySpec(/*tied=*/false);
  spec.num_layers = 1;
  auto model = MakeModel(spec);
  absl::StatusOr<ProfileResult> r = ProfileModel(*model, Options(1, 16));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->passes, 4);
  EXPECT_EQ(r->block_modes, BlockModes{BlockMode::kNone});
  EXPECT_EQ(r->ckpt_groups.size(), r->groups.size());
  EXPECT_GT(r->trace.blocks[0].recompute_seconds, 0);
}

// On-demand: parameters in host memory, one group's on the device at a time. Same memory figures
// as the resident profile.
TEST(ModelProfilerTest, OnDemandProfileMatchesTheResidentOne) {
  const ModelSpec spec = TinySpec(/*tied=*/true);
  auto resident = MakeModel(spec);
  absl::StatusOr<ProfileResult> want = ProfileModel(*resident, Options(2, 16));
  ASSERT_TRUE(want.ok()) << want.status();

  LlamaModelOptions o;
  o.spec = spec;
  o.dtype = DType::kFloat32;
  o.seed = 3;
  o.param_device = torch::Device(torch::kCPU);
  auto host = LlamaModel::Create(o);
  ASSERT_TRUE(host.ok()) << host.status();
  const int64_t model_bytes = Bytes((*host)->Params());
  OnDemandOptions od;
  od.host_memory = HostMemoryKind::kPageable;
  od.chunk_bytes = 32 << 10;
  absl::StatusOr<OnDemandProfile> got = ProfileModelOnDemand(**host, Options(2, 16), od);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->host_bytes, got->result.param_bytes) << "parameters only: no optimizer state";
  EXPECT_LT(got->device_buffer_bytes, model_bytes);
  EXPECT_EQ(got->chunk_bytes, 32 << 10);
  EXPECT_EQ(got->result.grad_bytes, 0) << "gradients are dropped group by group";

  const Trace& a = want->trace;
  const Trace& b = got->result.trace;
  EXPECT_EQ(b.forward_end_bytes, a.forward_end_bytes);
  EXPECT_EQ(b.total_param_count, a.total_param_count);
  EXPECT_EQ(b.embedding.param_bytes, a.embedding.param_bytes);
  EXPECT_EQ(b.embedding.saved_bytes, a.embedding.saved_bytes);
  EXPECT_EQ(b.head.saved_bytes, a.head.saved_bytes);
  EXPECT_EQ(b.head.forward_transient_bytes, a.head.forward_transient_bytes);
  ASSERT_EQ(a.blocks.size(), b.blocks.size());
  for (size_t i = 0; i < a.blocks.size(); ++i) {
    SCOPED_TRACE(i);
    EXPECT_EQ(b.blocks[i].param_bytes, a.blocks[i].param_bytes);
    EXPECT_EQ(b.blocks[i].saved_bytes, a.blocks[i].saved_bytes);
    EXPECT_EQ(b.blocks[i].forward_transient_bytes, a.blocks[i].forward_transient_bytes);
    EXPECT_EQ(b.blocks[i].backward_transient_bytes, a.blocks[i].backward_transient_bytes);
    EXPECT_GT(b.blocks[i].forward_seconds, 0);
    EXPECT_GT(b.blocks[i].recompute_seconds, 0);
  }
}

TEST(ModelProfilerTest, OnDemandNeedsAHostResidentModel) {
  auto model = MakeModel(TinySpec(false));
  EXPECT_EQ(ProfileModelOnDemand(*model, Options(1, 8), OnDemandOptions{}).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(ModelProfilerTest, SavedBytesGrowWithTheWorkload) {
  const ModelSpec spec = TinySpec(/*tied=*/false);
  auto model = MakeModel(spec);
  ProfilerOptions small = Options(1, 16);
  small.measure_recompute = false;
  small.warmup_steps = 0;
  ProfilerOptions large = small;
  large.workload.micro_batch = 2;
  absl::StatusOr<ProfileResult> a = ProfileModel(*model, small);
  absl::StatusOr<ProfileResult> b = ProfileModel(*model, large);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_TRUE(a->ckpt_groups.empty());
  // Doubling the batch doubles every per-token tensor a block keeps.
  EXPECT_EQ(b->trace.blocks[0].saved_bytes, 2 * a->trace.blocks[0].saved_bytes);
  EXPECT_EQ(b->trace.blocks[0].input_bytes, 2 * a->trace.blocks[0].input_bytes);
}

TEST(ModelProfilerTest, TraceFileRoundTrips) {
  auto model = MakeModel(TinySpec(false));
  ProfilerOptions o = Options(1, 8);
  o.measure_recompute = false;
  absl::StatusOr<ProfileResult> r = ProfileModel(*model, o);
  ASSERT_TRUE(r.ok());
  absl::StatusOr<Trace> back = TraceFromJson(TraceToJson(r->trace));
  ASSERT_TRUE(back.ok()) << back.status();
  ASSERT_EQ(back->blocks.size(), r->trace.blocks.size());
  EXPECT_EQ(back->blocks[1].saved_bytes, r->trace.blocks[1].saved_bytes);
  EXPECT_EQ(back->forward_end_bytes, r->trace.forward_end_bytes);
  EXPECT_FALSE(back->analytic);
}

TEST(ModelProfilerTest, RejectsBadWorkload) {
  auto model = MakeModel(TinySpec(false));
  ProfilerOptions o = Options(0, 8);
  EXPECT_EQ(ProfileModel(*model, o).status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace memplan
