#include "agent/profiler/model_profiler.h"

#include <algorithm>
#include <chrono>
#include <memory>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "agent/core/seconds_since.h"
#include "agent/io/vl_samples.h"
#include "agent/profiler/memory_probe.h"
#include "common/chunk_packing.h"
#include "common/log.h"
#include "common/status.h"
#include "common/validate.h"
#include "common/vision_cost.h"

namespace memplan {
namespace {

using Clock = std::chrono::steady_clock;

// Brackets every group's forward and backward: the device is synchronised at each boundary so
// the wall time is the group's own, and the probe's peak is reset so the peak is the group's.
// The inner manager (if any) moves parameters outside these windows.
class GroupRecorder final : public ParamResidency {
 public:
  GroupRecorder(MemoryProbe* probe, ParamResidency* inner, int num_groups)
      : probe_(probe), inner_(inner), groups_(static_cast<size_t>(num_groups)) {}

  void PreForward(int group) override {
    if (inner_ != nullptr) inner_->PreForward(group);
    GroupMeasurement& m = groups_.at(static_cast<size_t>(group));
    probe_->Synchronize();
    m.forward_start_bytes = probe_->AllocatedBytes();
    probe_->ResetPeak();
    start_ = Clock::now();
  }

  void PostForward(int group) override {
    GroupMeasurement& m = groups_.at(static_cast<size_t>(group));
    probe_->Synchronize();
    m.forward_seconds = SecondsSince(start_);
    m.forward_end_bytes = probe_->AllocatedBytes();
    m.forward_peak_bytes = probe_->PeakAllocatedBytes();
    step_peak_bytes_ = std::max(step_peak_bytes_, m.forward_peak_bytes);
    if (inner_ != nullptr) inner_->PostForward(group);
  }

  void PreBackward(int group) override {
    if (inner_ != nullptr) inner_->PreBackward(group);
    GroupMeasurement& m = groups_.at(static_cast<size_t>(group));
    probe_->Synchronize();
    m.backward_start_bytes = probe_->AllocatedBytes();
    probe_->ResetPeak();
    start_ = Clock::now();
  }

  void PostBackward(int group) override {
    GroupMeasurement& m = groups_.at(static_cast<size_t>(group));
    probe_->Synchronize();
    m.backward_seconds = SecondsSince(start_);
    m.backward_end_bytes = probe_->AllocatedBytes();
    m.backward_peak_bytes = probe_->PeakAllocatedBytes();
    step_peak_bytes_ = std::max(step_peak_bytes_, m.backward_peak_bytes);
    if (inner_ != nullptr) inner_->PostBackward(group);
  }

  std::vector<GroupMeasurement> TakeGroups() { return std::exchange(groups_, {}); }
  int64_t step_peak_bytes() const { return step_peak_bytes_; }

 private:
  MemoryProbe* probe_;
  ParamResidency* inner_;
  std::vector<GroupMeasurement> groups_;
  Clock::time_point start_;
  int64_t step_peak_bytes_ = 0;
};

struct PassResult {
  std::vector<GroupMeasurement> groups;
  int64_t start_bytes = 0;
  int64_t forward_end_bytes = 0;  // relative to start_bytes
  int64_t peak_bytes = 0;         // relative to start_bytes
  int64_t grad_bytes = 0;
  double seconds = 0;
};

void ClearGrads(const std::vector<NamedParam>& params) {
  for (const NamedParam& p : params) {
    if (p.param.grad().defined()) p.param.mutable_grad().reset();
  }
}

// One profiling micro-batch: token ids, their shifted targets and, for a vision-language model,
// its images (already on the device).
struct ProfilingBatch {
  torch::Tensor ids;
  torch::Tensor targets;
  VisionInputs images;
};

// [Profiled images] A vision-language model is profiled with the workload's images: synthetic
// samples of images_per_sample images each, on the grid the planner prices for image_height x
// image_width (VisionGridFor rounds each side up), as --synthetic-images makes them. A profile
// without images would leave the tower out of the trace, so it is refused here as the planner
// refuses such a trace.
absl::StatusOr<ProfilingBatch> MakeProfilingBatch(const ModelSpec& spec,
                                                  const ProfilerOptions& options,
                                                  const torch::Device& device) {
  RETURN_IF_ERROR(ValidateImagesForModel(spec, options.workload, "arch.", "workload."));
  const Workload& w = options.workload;
  ProfilingBatch batch;
  if (!spec.IsVisionLanguage()) {
    auto gen = at::make_generator<at::CPUGeneratorImpl>(options.seed);
    batch.ids = at::randint(spec.vocab_size, {w.micro_batch, w.seq_len}, gen,
                            torch::TensorOptions().dtype(torch::kInt64))
                    .to(device);
    batch.targets = batch.ids;
    return batch;
  }
  const VisionGrid grid = VisionGridFor(spec.vision, w.image_height, w.image_width);
  io::SyntheticVlOptions synthetic;
  synthetic.images = w.images_per_sample;
  synthetic.height = grid.rows * spec.vision.patch_size;
  synthetic.width = grid.cols * spec.vision.patch_size;
  synthetic.seed = options.seed;
  io::VlBatcher::Options batcher_options;
  batcher_options.seed = options.seed;
  batcher_options.batch_size = w.micro_batch;
  batcher_options.seq_len = w.seq_len;
  absl::StatusOr<std::unique_ptr<io::VlBatcher>> batcher =
      io::VlBatcher::Create(spec, nullptr, synthetic, batcher_options);
  if (!batcher.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "profiling images: workload.images_per_sample = ", w.images_per_sample, " of ",
        synthetic.height, "x", synthetic.width, " pixels: ", batcher.status().message()));
  }
  ASSIGN_OR_RETURN(io::VlBatch vl, (*batcher)->Batch(0));
  batch.ids = vl.input_ids.to(device);
  batch.targets = vl.targets.to(device);
  batch.images = vl.images;
  batch.images.pixel_values = batch.images.pixel_values.to(device);
  return batch;
}

absl::StatusOr<PassResult> RunPass(LlamaModel& model, const ProfilingBatch& batch,
                                   const BlockModes& modes, MemoryProbe& probe,
                                   ParamResidency* inner) {
  const std::vector<NamedParam> params = model.Params();
  ClearGrads(params);
  GroupRecorder recorder(&probe, inner, model.num_groups());
  PassResult pass;
  try {
    probe.Synchronize();
    pass.start_bytes = probe.AllocatedBytes();
    const auto start = Clock::now();
    torch::Tensor loss =
        model.Loss(batch.ids, batch.targets, modes, &recorder, nullptr, batch.images);
    probe.Synchronize();
    pass.forward_end_bytes = probe.AllocatedBytes() - pass.start_bytes;
    loss.backward();
    loss.reset();
    probe.Synchronize();
    pass.seconds = SecondsSince(start);
  } catch (const c10::OutOfMemoryError& e) {
    ClearGrads(params);
    return absl::ResourceExhaustedError(
        absl::StrCat("profiling ran out of device memory: ", e.what_without_backtrace(),
                     " (try a smaller micro-batch or the on-demand mode)"));
  } catch (const c10::Error& e) {
    ClearGrads(params);
    return absl::InternalError(absl::StrCat("profiling pass failed: ", e.what_without_backtrace()));
  }
  for (const NamedParam& p : params) {
    if (p.param.grad().defined()) pass.grad_bytes += p.param.grad().nbytes();
  }
  ClearGrads(params);
  pass.peak_bytes = recorder.step_peak_bytes() - pass.start_bytes;
  pass.groups = recorder.TakeGroups();
  return pass;
}

int64_t NonNegative(int64_t v) { return std::max<int64_t>(v, 0); }

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t m = v.size() / 2;
  return v.size() % 2 == 1 ? v[m] : 0.5 * (v[m - 1] + v[m]);
}

// [Median block times] Every block has the same shapes and does the same work, so one time per
// figure describes them all; the median of the blocks' measurements drops the one-off stalls a
// single pass catches (on an H100, 3 of 28 blocks' backward read 4x too long while the caching
// allocator grew a segment: 16.5 ms instead of 4.6 ms), which a warm training step never pays.
void UseMedianBlockTimes(std::vector<BlockTrace>& blocks) {
  if (blocks.size() < 3) return;
  std::vector<double> fwd, bwd, rec;
  for (const BlockTrace& b : blocks) {
    fwd.push_back(b.forward_seconds);
    bwd.push_back(b.backward_seconds);
    rec.push_back(b.recompute_seconds);
  }
  const double f = Median(fwd), b = Median(bwd), r = Median(rec);
  for (BlockTrace& block : blocks) {
    block.forward_seconds = f;
    block.backward_seconds = b;
    block.recompute_seconds = r;
  }
}

int64_t TensorBytes(const torch::Tensor& t) { return t.numel() * t.element_size(); }

}  // namespace

absl::StatusOr<ProfileResult> ProfileModel(LlamaModel& model, const ProfilerOptions& options) {
  RETURN_IF_ERROR(ValidateWorkload(options.workload, "workload."));
  if (options.warmup_steps < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("warmup_steps = ", options.warmup_steps, " must be >= 0"));
  }
  if (options.chunk_bytes < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("chunk_bytes = ", options.chunk_bytes, " must be >= 0"));
  }
  const ModelSpec& spec = model.spec();
  const torch::Device device = model.options().device;
  const int n = model.num_blocks();
  const int64_t batch = options.workload.micro_batch;
  const int64_t seq = options.workload.seq_len;

  // The probe goes first: on CPU it only sees allocations made while it exists.
  std::unique_ptr<MemoryProbe> probe = MemoryProbe::Create(device);
  ProfilingBatch inputs;
  try {
    ASSIGN_OR_RETURN(inputs, MakeProfilingBatch(spec, options, device));
  } catch (const c10::Error& e) {
    return absl::InternalError(
        absl::StrCat("profiling batch failed: ", e.what_without_backtrace()));
  }
  // The pixel values are on the device before the pass, so no group's growth holds them; the
  // trace puts them in the embedding group's saved bytes, where the tower's pricing has them
  // ([Vision tower bytes], common/vision_cost.h).
  const int64_t pixel_bytes =
      inputs.images.pixel_values.defined() ? TensorBytes(inputs.images.pixel_values) : 0;

  // [Interleaved pass] Every block of a model has the same shapes, so one pass can measure both
  // modes: even blocks (0-based) run NONE and odd ones CKPT, and each CKPT block takes its NONE
  // figures from the NONE block before it, while the pair's backward difference is the
  // recompute time of both. Warm-up passes use the same modes, so the timed pass meets no new
  // allocation pattern (a first checkpointed backward after NONE-only passes once read 30x too
  // long). A one-block model cannot pair: it gets a separate all-CKPT pass (warmed up as well).
  const bool interleave = options.measure_recompute && n >= 2;
  BlockModes modes(static_cast<size_t>(n), BlockMode::kNone);
  if (interleave) {
    for (int i = 1; i < n; i += 2) modes[static_cast<size_t>(i)] = BlockMode::kCkpt;
  }
  double warmup_seconds = 0;
  int passes = 0;
  for (int i = 0; i < options.warmup_steps; ++i, ++passes) {
    ASSIGN_OR_RETURN(PassResult warm, RunPass(model, inputs, modes, *probe, options.inner));
    MEMPLAN_LOG(kInfo, "profiler warm-up pass").Field("seconds", warm.seconds);
    warmup_seconds += warm.seconds;
  }
  ASSIGN_OR_RETURN(PassResult plain, RunPass(model, inputs, modes, *probe, options.inner));
  ++passes;
  MEMPLAN_LOG(kInfo, "profiler pass")
      .Field("seconds", plain.seconds)
      .Field("interleaved", interleave)
      .Field("forward_end_bytes", plain.forward_end_bytes);
  PassResult ckpt;
  if (options.measure_recompute && !interleave) {
    const BlockModes all_ckpt(static_cast<size_t>(n), BlockMode::kCkpt);
    for (int i = 0; i < std::min(options.warmup_steps, 1); ++i, ++passes) {
      ASSIGN_OR_RETURN(PassResult warm, RunPass(model, inputs, all_ckpt, *probe, options.inner));
      MEMPLAN_LOG(kInfo, "profiler warm-up pass, every block CKPT").Field("seconds", warm.seconds);
    }
    ASSIGN_OR_RETURN(ckpt, RunPass(model, inputs, all_ckpt, *probe, options.inner));
    ++passes;
    MEMPLAN_LOG(kInfo, "profiler pass, every block CKPT").Field("seconds", ckpt.seconds);
  }

  ProfileResult result;
  result.memory_source = probe->source();
  result.step_seconds = plain.seconds;
  result.warmup_seconds = warmup_seconds;
  result.ckpt_step_seconds = ckpt.seconds;
  result.step_peak_bytes = plain.peak_bytes;
  result.grad_bytes = plain.grad_bytes;
  result.block_modes = modes;
  result.passes = passes;

  // Parameter bytes per group, each tensor counted in the group that uses it first (a tied head
  // weight belongs to the embedding, as in the chunk layout).
  const ParamGroups groups = model.ParamGroups();
  std::vector<int64_t> group_param_bytes(groups.size(), 0);
  std::vector<LayoutParam> layout_params;
  std::vector<torch::Tensor> seen;
  int64_t total_params = 0;
  for (size_t g = 0; g < groups.size(); ++g) {
    for (const NamedParam& p : groups[g]) {
      const bool dup = std::any_of(seen.begin(), seen.end(),
                                   [&](const torch::Tensor& t) { return t.is_same(p.param); });
      if (dup) continue;
      seen.push_back(p.param);
      group_param_bytes[g] += TensorBytes(p.param);
      total_params += p.param.numel();
      layout_params.push_back(
          LayoutParam{p.name, p.param.numel(), p.param.element_size(), static_cast<int>(g)});
    }
  }
  for (int64_t b : group_param_bytes) result.param_bytes += b;

  Trace& t = result.trace;
  t.arch = spec;
  t.workload = options.workload;
  t.param_dtype = model.options().dtype;
  t.training = TrainingMethod{};
  t.hardware_name = options.hardware_name.empty() ? device.str() : options.hardware_name;
  t.analytic = false;
  t.total_param_count = total_params;
  t.trainable_param_count = total_params;

  // [Saved-bytes attribution] A group's saved bytes are the growth of allocated memory across
  // its forward in NONE mode: what its inner graph keeps plus its output. For a block the output
  // has the size of its input, so the growth equals the trace convention "saved, input
  // included". The embedding's output is block 1's input and the last block's output is the
  // head's input: they move from the embedding to the head, as in the analytic trace.
  const int64_t input_bytes = batch * seq * spec.hidden_size * DTypeBytes(model.options().dtype);
  auto growth = [](const GroupMeasurement& m) {
    return m.forward_end_bytes - m.forward_start_bytes;
  };
  auto fwd_transient = [](const GroupMeasurement& m) {
    return NonNegative(m.forward_peak_bytes - m.forward_end_bytes);
  };
  // Backward: everything above what was alive when the group's backward began, the group's new
  // parameter gradients included (over-estimates by at most those, never under).
  auto bwd_transient = [](const GroupMeasurement& m) {
    return NonNegative(m.backward_peak_bytes - m.backward_start_bytes);
  };

  const GroupMeasurement& emb = plain.groups.front();
  t.embedding.param_bytes = group_param_bytes.front();
  t.embedding.saved_bytes = NonNegative(growth(emb) - input_bytes) + pixel_bytes;
  t.embedding.forward_transient_bytes = fwd_transient(emb);
  t.embedding.backward_transient_bytes = bwd_transient(emb);
  t.embedding.forward_seconds = emb.forward_seconds;
  t.embedding.backward_seconds = emb.backward_seconds;

  // The all-NONE forward-end bytes: what the timed pass kept, plus what its CKPT blocks would
  // have kept in NONE mode (their NONE partner's growth) beyond what they did keep.
  int64_t forward_end = plain.forward_end_bytes + pixel_bytes;
  for (int i = 0; i < n; ++i) {
    // The NONE block whose figures block i takes (itself when it ran NONE), and the CKPT block
    // of its pair (the next block; the previous one for a last, unpaired NONE block).
    const int none_of = (i % 2 == 0 || !interleave) ? i : i - 1;
    const int ckpt_of = !interleave ? -1 : (i % 2 == 1 ? i : (i + 1 < n ? i + 1 : i - 1));
    const GroupMeasurement& m = plain.groups[static_cast<size_t>(none_of + 1)];
    BlockTrace b;
    b.param_bytes = group_param_bytes[static_cast<size_t>(i + 1)];
    b.input_bytes = input_bytes;
    b.saved_bytes = NonNegative(growth(m));
    b.forward_transient_bytes = fwd_transient(m);
    b.backward_transient_bytes = bwd_transient(m);
    b.forward_seconds = m.forward_seconds;
    b.backward_seconds = m.backward_seconds;
    if (none_of != i) {
      forward_end += growth(m) - growth(plain.groups[static_cast<size_t>(i + 1)]);
    }
    // A checkpointed block's backward = recompute + backward. When timing noise makes the
    // difference vanish, the forward time is the recompute's best estimate.
    b.recompute_seconds = m.forward_seconds;
    const GroupMeasurement* c = nullptr;
    if (ckpt_of >= 0) {
      c = &plain.groups[static_cast<size_t>(ckpt_of + 1)];
    } else if (!ckpt.groups.empty()) {
      c = &ckpt.groups[static_cast<size_t>(i + 1)];
    }
    if (c != nullptr) {
      // Interleaved: a CKPT block (always odd) pairs with the NONE block before it.
      const int pair_none_of = ckpt_of >= 0 ? ckpt_of - 1 : none_of;
      const GroupMeasurement& pair_none = plain.groups[static_cast<size_t>(pair_none_of + 1)];
      const double extra = c->backward_seconds - pair_none.backward_seconds;
      if (extra > 0) b.recompute_seconds = extra;
    }
    t.blocks.push_back(b);
  }
  t.forward_end_bytes = NonNegative(forward_end);
  UseMedianBlockTimes(t.blocks);

  const GroupMeasurement& head = plain.groups.back();
  t.head.param_bytes = group_param_bytes.back();
  t.head.saved_bytes = NonNegative(growth(head) + input_bytes);
  t.head.forward_transient_bytes = fwd_transient(head);
  t.head.backward_transient_bytes = bwd_transient(head);
  t.head.forward_seconds = head.forward_seconds;
  t.head.backward_seconds = head.backward_seconds;

  if (options.chunk_bytes > 0) {
    ChunkPackingOptions layout_options;
    layout_options.chunk_bytes = options.chunk_bytes;
    ASSIGN_OR_RETURN(const ChunkPacking layout, ChunkPacking::Build(layout_params, layout_options));
    t.chunk_bytes = options.chunk_bytes;
    for (const ChunkInfo& c : layout.chunks()) t.chunk_param_bytes.push_back(c.size_bytes);
  }

  result.groups = std::move(plain.groups);
  result.ckpt_groups = std::move(ckpt.groups);
  return result;
}

}  // namespace memplan
