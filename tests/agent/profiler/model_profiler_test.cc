#include "agent/profiler/model_profiler.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <memory>

#include "agent/client/record_json.h"

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
    // Identical shapes allocate identically on the CPU.
    EXPECT_EQ(b.saved_bytes, t.blocks[0].saved_bytes);
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
  EXPECT_GT(r->step_peak_bytes, t.forward_end_bytes);

  // The passes leave no gradients behind.
  for (const NamedParam& p : model->Params()) EXPECT_FALSE(p.param.grad().defined()) << p.name;
}

TEST(ModelProfilerTest, CheckpointedBlocksKeepOnlyTheirOutput) {
  const ModelSpec spec = TinySpec(/*tied=*/true);
  auto model = MakeModel(spec);
  absl::StatusOr<ProfileResult> r = ProfileModel(*model, Options(1, 32));
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->ckpt_groups.size(), r->groups.size());
  const int64_t input_bytes = 32 * spec.hidden_size * 4;
  for (int i = 1; i <= spec.num_layers; ++i) {
    const GroupMeasurement& c = r->ckpt_groups[i];
    const int64_t kept = c.forward_end_bytes - c.forward_start_bytes;
    // The output, plus the saved RNG state a recompute restores (a few KiB).
    EXPECT_GE(kept, input_bytes);
    EXPECT_LT(kept, input_bytes + (16 << 10));
    EXPECT_LT(kept, r->trace.blocks[i - 1].saved_bytes);
  }
  // Tied: the head owns only the final norm; the shared weight is the embedding's.
  EXPECT_EQ(r->trace.head.param_bytes, spec.hidden_size * 4);
  EXPECT_EQ(r->trace.embedding.param_bytes, spec.vocab_size * spec.hidden_size * 4);
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
