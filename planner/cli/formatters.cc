#include "planner/cli/formatters.h"

#include <cmath>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/time/time.h"
#include "common/optimizer_bytes.h"
#include "common/relative_error.h"
#include "common/vision_cost.h"
#include "planner/cli/text_table.h"

namespace memplan::cli {
namespace {

using Align = TextTable::Align;
constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;

std::string ModeName(int mode) {
  switch (mode) {
    case v1::BLOCK_MODE_NONE:
      return "none";
    case v1::BLOCK_MODE_CKPT:
      return "ckpt";
    case v1::BLOCK_MODE_SWAP:
      return "swap";
    case v1::BLOCK_MODE_HS_OFFLOAD:
      return "hs_offload";
    default:
      return "?";
  }
}

std::string DTypeLabel(int dtype) {
  switch (dtype) {
    case v1::DTYPE_FP32:
      return "fp32";
    case v1::DTYPE_BF16:
      return "bf16";
    case v1::DTYPE_FP16:
      return "fp16";
    default:
      return "-";
  }
}

std::string HostMemoryLabel(int kind) {
  switch (kind) {
    case v1::HOST_MEMORY_PINNED:
      return "pinned";
    case v1::HOST_MEMORY_PAGEABLE:
      return "pageable";
    default:
      return "-";
  }
}

std::string Rate(double bytes_per_second) {
  return absl::StrFormat("%.1f GB/s", bytes_per_second / 1e9);
}

std::string TimeLabel(int64_t unix_ms) {
  if (unix_ms <= 0) return "-";
  return absl::FormatTime("%Y-%m-%d %H:%M:%S", absl::FromUnixMillis(unix_ms), absl::UTCTimeZone());
}

std::string Percent(double fraction) { return absl::StrFormat("%+.1f%%", fraction * 100.0); }

// "key   value" lines with the keys padded to one width (at least `min_key_width`, so that
// several blocks of one view line up).
class KeyValues {
 public:
  explicit KeyValues(int min_key_width = 0) : min_key_width_(min_key_width) {}
  void Add(std::string key, std::string value) {
    rows_.emplace_back(std::move(key), std::move(value));
  }
  std::string Render() const {
    int width = min_key_width_;
    for (const auto& [key, value] : rows_) width = std::max(width, DisplayWidth(key));
    std::string out;
    for (const auto& [key, value] : rows_) {
      absl::StrAppend(&out, key, std::string(static_cast<size_t>(width - DisplayWidth(key)), ' '),
                      "  ", value, "\n");
    }
    return out;
  }

 private:
  int min_key_width_;
  std::vector<std::pair<std::string, std::string>> rows_;
};

// Key width of the plan view: its longest key, "Time / iteration".
constexpr int kPlanKeyWidth = 16;

std::string ModelLabel(const v1::PlanRequest& request) {
  switch (request.model_case()) {
    case v1::PlanRequest::kArchPreset:
      return request.arch_preset();
    case v1::PlanRequest::kArch:
      return request.arch().name().empty() ? "custom arch" : request.arch().name();
    case v1::PlanRequest::kTraceId:
      return absl::StrCat("trace ", request.trace_id());
    default:
      return "-";
  }
}

std::string HardwareLabel(const v1::PlanRequest& request) {
  switch (request.hardware_case()) {
    case v1::PlanRequest::kHardwarePreset:
      return request.hardware_preset();
    case v1::PlanRequest::kHardwareSpec:
      return request.hardware_spec().name().empty() ? "custom hardware"
                                                    : request.hardware_spec().name();
    case v1::PlanRequest::kHardwareProfileId:
      return absl::StrCat("profile ", request.hardware_profile_id());
    default:
      return "-";
  }
}

}  // namespace

std::string CompressBlockModes(const google::protobuf::RepeatedField<int>& modes) {
  std::vector<std::string> runs;
  for (int i = 0; i < modes.size();) {
    int j = i;
    while (j < modes.size() && modes.Get(j) == modes.Get(i)) ++j;
    runs.push_back(absl::StrCat(ModeName(modes.Get(i)), "×", j - i));
    i = j;
  }
  return runs.empty() ? "-" : absl::StrJoin(runs, " ");
}

std::string FormatGiB(int64_t bytes) {
  return absl::StrFormat("%.2f GiB", static_cast<double>(bytes) / kGiB);
}

std::string FormatVisionTower(const ModelSpec& model, const Workload& w, DType dtype, bool trains,
                              const v1::PlanResponse& response) {
  if (!model.IsVisionLanguage() || w.images_per_sample < 1) return "";
  // The planner may have checkpointed the tower's blocks itself ([Vision block checkpointing]).
  const bool checkpointed = trains && (w.vision_checkpoint || response.plan().vision_checkpoint());
  const VisionTowerCost c =
      VisionTowerCostFor(model, w.micro_batch * w.images_per_sample, w.image_height, w.image_width,
                         dtype, trains, checkpointed);
  const VisionGrid grid = VisionGridFor(model.vision, w.image_height, w.image_width);
  const int64_t kept = c.pixel_bytes + c.saved_bytes;
  // The tower's figures span bytes to gigabytes: MiB below one GiB.
  auto size = [](int64_t bytes) {
    return bytes < (int64_t{1} << 30)
               ? absl::StrFormat("%.1f MiB", static_cast<double>(bytes) / (1 << 20))
               : FormatGiB(bytes);
  };
  std::string text = absl::StrFormat(
      "Vision tower (with the embedding, group 0): %d x %dx%d px image per sample = %dx%d "
      "patches; %d patches, %d image tokens per micro-batch\n"
      "  weights             %s (%s parameters, in the embedding's chunks)\n"
      "  kept to backward    %s (fp32 pixels %s%s)\n"
      "  forward transient   %s (beside the token embeddings)\n"
      "  compute             %.2f TFLOP forward%s per micro-batch\n",
      w.images_per_sample, w.image_height, w.image_width, grid.rows, grid.cols, c.patches,
      c.image_tokens, size(c.param_bytes), FormatCount(static_cast<double>(c.param_count)),
      size(kept), size(c.pixel_bytes),
      trains ? absl::StrCat(", trained: saved activations ", size(c.saved_bytes),
                            checkpointed ? ", blocks checkpointed: their inputs only" : "")
             : std::string(", frozen: no saved activations"),
      size(c.forward_transient_bytes), c.forward_flops / 1e12,
      trains ? absl::StrFormat(", %.2f backward", c.backward_flops / 1e12) : std::string());
  const int64_t peak = response.prediction().peak_bytes();
  if (peak > 0) {
    const double share = static_cast<double>(c.param_bytes + kept + c.forward_transient_bytes) /
                         static_cast<double>(peak);
    absl::StrAppendFormat(&text,
                          "  share of the peak   at most %.1f %% of %s (weights if resident, "
                          "what it keeps, its transient)\n",
                          100.0 * share, FormatGiB(peak));
  }
  return text;
}

std::string FormatSeconds(double seconds) {
  if (seconds < 1.0) return absl::StrFormat("%.1f ms", seconds * 1e3);
  return absl::StrFormat("%.3f s", seconds);
}

std::string FormatCount(double value) {
  const int64_t n = std::llround(value);
  std::string digits = absl::StrCat(n < 0 ? -n : n);
  std::string out;
  for (size_t i = 0; i < digits.size(); ++i) {
    if (i > 0 && (digits.size() - i) % 3 == 0) out += ',';
    out += digits[i];
  }
  return n < 0 ? "-" + out : out;
}

std::string FormatKnobs(const v1::ResidencyPlan& plan) {
  if (plan.chunk_bytes() == 0) {
    // An OSFT plan: unmanaged, no chunks ([OSFT plans], planner/core/osft_plan.h).
    return absl::StrCat("unmanaged (no chunks), swap ", plan.n_swap(), ", ckpt ",
                        plan.n_checkpoint(), ", hs_offload ", plan.n_hs_offload(),
                        plan.world_size() > 1
                            ? absl::StrCat(", world ", plan.world_size(), ", model replicated")
                            : std::string());
  }
  return absl::StrCat("chunk ", plan.chunk_bytes() >> 20, " MiB × ", plan.n_chunks(), ", persist ",
                      plan.n_persist(), ", buffer ", plan.n_buffer(), ", swap ", plan.n_swap(),
                      ", ckpt ", plan.n_checkpoint(), ", hs_offload ", plan.n_hs_offload(),
                      ", host ", HostMemoryLabel(plan.host_memory()),
                      plan.world_size() > 1
                          ? absl::StrCat(", world ", plan.world_size(),
                                         plan.shard_persistent_params()
                                             ? (plan.shard_persistent_state()
                                                    ? ", params and state sharded"
                                                    : ", params sharded")
                                         : plan.shard_persistent_state() ? ", state sharded"
                                                                         : ", state replicated")
                          : "");
}

std::string FormatPlanResponse(const v1::PlanResponse& r) {
  const v1::Prediction& p = r.prediction();
  const v1::MemoryBreakdown& b = p.breakdown();
  // A verdict without a plan (nothing fits at all) has no knobs or breakdown worth printing.
  const bool has_plan = r.plan().block_modes_size() > 0 || r.plan().n_chunks() > 0;
  const bool has_prediction = p.peak_bytes() > 0;
  std::string out;
  KeyValues head(kPlanKeyWidth);
  head.Add("Verdict", r.fits() ? "FITS" : "DOES NOT FIT");
  if (!r.reason().empty()) head.Add("Why", r.reason());
  if (!r.plan_id().empty()) head.Add("Plan id", r.plan_id());
  head.Add("Trace",
           absl::StrCat(r.analytic_trace() ? "analytic" : "profiled",
                        r.trace_id().empty() ? "" : absl::StrCat(" (", r.trace_id(), ")")));
  if (has_plan) {
    head.Add("Knobs", FormatKnobs(r.plan()));
    head.Add("Blocks", CompressBlockModes(r.plan().block_modes()));
  }
  absl::StrAppend(&out, head.Render(), "\n");

  auto gib = [](int64_t bytes) { return absl::StrFormat("%.2f", bytes / kGiB); };
  if (has_prediction) {
    TextTable memory({"Memory", "GiB"}, {Align::kLeft, Align::kRight});
    memory.AddRow({"persistent chunks", gib(b.persistent_chunks_bytes())});
    memory.AddRow({"chunk buffers", gib(b.buffers_bytes())});
    memory.AddRow({"gradients", gib(b.grads_bytes())});
    memory.AddRow({"optimizer state", gib(b.optimizer_state_bytes())});
    memory.AddRow({"activations", gib(b.activations_bytes())});
    memory.AddRow({"checkpoint chain", gib(b.checkpoint_chain_bytes())});
    memory.AddRow({"transients", gib(b.transient_bytes())});
    if (b.head_bytes() > 0) {
      memory.AddRow({"  (LM head + loss, of activations + transients)", gib(b.head_bytes())});
    }
    if (b.allocator_slack_bytes() > 0) {
      memory.AddRow({"allocator reserve (vocabulary-sized grads)", gib(b.allocator_slack_bytes())});
    }
    memory.AddRow({"CUDA context", gib(b.cuda_context_bytes())});
    memory.AddRow({"calibration residual", gib(b.calibration_residual_bytes())});
    const double factor = b.fragmentation_factor() == 0 ? 1.0 : b.fragmentation_factor();
    absl::StrAppend(
        &out, memory.Render(2),
        absl::StrFormat("  (fragmentation factor ×%.3f applied to the model terms", factor),
        b.exact_bytes() > 0
            ? absl::StrFormat(" but the %.2f GiB allocated at exact size", b.exact_bytes() / kGiB)
            : "",
        ")\n\n");
  }

  KeyValues predictions(kPlanKeyWidth);
  if (has_prediction) {
    predictions.Add(
        "Predicted peak",
        absl::StrCat(FormatGiB(p.peak_bytes()),
                     r.capacity_bytes() > 0
                         ? absl::StrCat(" of ", FormatGiB(r.capacity_bytes()), " usable")
                         : ""));
    predictions.Add("Load-time peak", FormatGiB(p.load_peak_bytes()));
    predictions.Add("Host memory", absl::StrCat(FormatGiB(p.host_pinned_bytes()), " pinned, ",
                                                FormatGiB(p.host_pageable_bytes()), " pageable"));
    const v1::RankMemory& rm = p.rank_memory();
    if (rm.world_size() > 1) {
      // What each rank's chunk manager allocates (its ChunkMemoryStats) and the node's share.
      predictions.Add(
          "Per rank (chunks)",
          absl::StrCat("device ", FormatGiB(rm.persistent_device_bytes()), " persistent + ",
                       FormatGiB(rm.persistent_state_device_bytes()), " their state + ",
                       rm.persistent_gather_device_bytes() > 0
                           ? absl::StrCat(FormatGiB(rm.persistent_gather_device_bytes()),
                                          " gathered + ")
                           : "",
                       FormatGiB(rm.buffer_device_bytes()), " buffers; host ",
                       FormatGiB(rm.chunk_host_pinned_bytes()), " pinned + ",
                       FormatGiB(rm.chunk_host_pageable_bytes()), " pageable"));
      predictions.Add("Node host memory",
                      absl::StrCat(FormatGiB(rm.node_host_bytes()), " for ", rm.local_world_size(),
                                   " local ranks of ", rm.world_size()));
    }
    predictions.Add("Time / iteration",
                    absl::StrCat(FormatSeconds(p.iteration_seconds()), "  (forward ",
                                 FormatSeconds(p.forward_seconds()), ", backward ",
                                 FormatSeconds(p.backward_seconds()), ", optimizer ",
                                 FormatSeconds(p.optimizer_seconds()), ")"));
    predictions.Add("Tokens / s", absl::StrCat(FormatCount(p.tokens_per_second()), " per GPU"));
  } else if (r.capacity_bytes() > 0) {
    predictions.Add("Usable memory", FormatGiB(r.capacity_bytes()));
  }
  // A fitting plan implies a max micro-batch of at least 1, so all-zero limits on a fit mean the
  // request skipped them (skip_limits), not that nothing fits.
  const bool limits_skipped =
      r.fits() && r.max_micro_batch() == 0 && r.max_seq_len() == 0 && r.min_gpu_memory_bytes() == 0;
  if (limits_skipped) {
    predictions.Add("Limits", "not computed (skip_limits)");
  } else {
    predictions.Add("Max micro-batch",
                    r.max_micro_batch() > 0 ? absl::StrCat(r.max_micro_batch()) : "none fits");
    predictions.Add("Max sequence",
                    r.max_seq_len() > 0 ? absl::StrCat(r.max_seq_len()) : "none fits");
    predictions.Add("Min GPU memory",
                    r.min_gpu_memory_bytes() > 0 ? FormatGiB(r.min_gpu_memory_bytes()) : "-");
  }
  predictions.Add("Search", absl::StrCat(FormatSeconds(r.search_seconds()), ", ",
                                         FormatCount(static_cast<double>(r.plans_evaluated())),
                                         " plans evaluated"));
  absl::StrAppend(&out, predictions.Render());

  if (r.alternatives_size() > 0) {
    // The planner's notes are sentences; they go under the table so its rows stay narrow.
    TextTable alternatives({"#", "peak GiB", "time/iter", "tokens/s", "knobs", "blocks"},
                           {Align::kRight, Align::kRight, Align::kRight, Align::kRight});
    std::string notes;
    for (int i = 0; i < r.alternatives_size(); ++i) {
      const v1::Alternative& a = r.alternatives(i);
      alternatives.AddRow(
          {absl::StrCat(i + 1), gib(a.prediction().peak_bytes()),
           FormatSeconds(a.prediction().iteration_seconds()),
           FormatCount(a.prediction().tokens_per_second()),
           absl::StrCat("persist ", a.plan().n_persist(), ", buffer ", a.plan().n_buffer(), ", ",
                        HostMemoryLabel(a.plan().host_memory())),
           CompressBlockModes(a.plan().block_modes())});
      if (!a.note().empty()) absl::StrAppend(&notes, "  ", i + 1, ": ", a.note(), "\n");
    }
    absl::StrAppend(&out, "\nAlternatives (memory/speed frontier)\n", alternatives.Render(2),
                    notes);
  }
  return out;
}

std::string FormatPresets(const v1::ListPresetsResponse& presets, bool models, bool hardware) {
  std::string out;
  if (models) {
    TextTable table({"model", "family", "layers", "hidden", "heads", "kv heads", "ffn", "vocab"},
                    {Align::kLeft, Align::kLeft, Align::kRight, Align::kRight, Align::kRight,
                     Align::kRight, Align::kRight, Align::kRight});
    for (const v1::ModelArch& m : presets.models()) {
      table.AddRow({m.name(), m.family(), absl::StrCat(m.num_layers()),
                    absl::StrCat(m.hidden_size()), absl::StrCat(m.num_heads()),
                    absl::StrCat(m.num_kv_heads()), absl::StrCat(m.intermediate_size()),
                    absl::StrCat(m.vocab_size())});
    }
    absl::StrAppend(&out, "Models\n", table.Render(2));
  }
  if (hardware) {
    TextTable table(
        {"hardware", "GPU GiB", "HBM", "bf16 TFLOP/s", "H2D pinned", "host GiB", "source"},
        {Align::kLeft, Align::kRight, Align::kRight, Align::kRight, Align::kRight, Align::kRight});
    for (const v1::HardwareProfile& h : presets.hardware()) {
      table.AddRow({h.name(), absl::StrFormat("%.1f", h.gpu_memory_bytes() / kGiB),
                    absl::StrFormat("%.2f TB/s", h.hbm_bytes_per_second() / 1e12),
                    absl::StrFormat("%.0f", h.matmul_bf16_flops() / 1e12),
                    Rate(h.h2d_pinned_bytes_per_second()),
                    absl::StrFormat("%.0f", h.host_memory_bytes() / kGiB),
                    h.measured() ? "measured" : "published"});
    }
    absl::StrAppend(&out, out.empty() ? "" : "\n", "Hardware\n", table.Render(2));
  }
  return out;
}

std::string FormatHardwareProfile(const v1::HardwareProfile& h) {
  KeyValues kv;
  kv.Add("Name", h.name());
  kv.Add("Source", h.measured() ? "measured by an agent" : "published figures");
  kv.Add("GPU memory", FormatGiB(h.gpu_memory_bytes()));
  kv.Add("CUDA context", FormatGiB(h.cuda_context_bytes()));
  kv.Add("HBM", absl::StrFormat("%.2f TB/s", h.hbm_bytes_per_second() / 1e12));
  kv.Add("Matmul",
         absl::StrFormat("bf16 %.0f, fp16 %.0f, fp32 %.1f TFLOP/s", h.matmul_bf16_flops() / 1e12,
                         h.matmul_fp16_flops() / 1e12, h.matmul_fp32_flops() / 1e12));
  kv.Add("H2D / D2H pinned", absl::StrCat(Rate(h.h2d_pinned_bytes_per_second()), " / ",
                                          Rate(h.d2h_pinned_bytes_per_second())));
  kv.Add("H2D / D2H pageable", absl::StrCat(Rate(h.h2d_pageable_bytes_per_second()), " / ",
                                            Rate(h.d2h_pageable_bytes_per_second())));
  kv.Add("Bidirectional pinned", Rate(h.bidirectional_pinned_bytes_per_second()));
  kv.Add("NCCL all-gather", Rate(h.nccl_allgather_bytes_per_second()));
  kv.Add("NCCL reduce-scatter", Rate(h.nccl_reduce_scatter_bytes_per_second()));
  if (h.nccl_allgather_under_compute_bytes_per_second() > 0) {
    kv.Add("NCCL all-gather beside GEMMs", Rate(h.nccl_allgather_under_compute_bytes_per_second()));
    kv.Add("NCCL reduce-scatter beside GEMMs",
           Rate(h.nccl_reduce_scatter_under_compute_bytes_per_second()));
  }
  kv.Add("CPU Adam", absl::StrCat(FormatCount(h.cpu_adam_params_per_second()), " params/s"));
  // [Two CPU passes] (common/optimizer_bytes.h); an older profile has neither figure.
  kv.Add("CPU accumulate / update",
         h.cpu_grad_accumulate_params_per_second() > 0 && h.cpu_adam_update_params_per_second() > 0
             ? absl::StrCat(FormatCount(h.cpu_grad_accumulate_params_per_second()), " / ",
                            FormatCount(h.cpu_adam_update_params_per_second()), " params/s")
             : "not measured (one CPU Adam pass priced)");
  // The other optimizers' updates, each where the bench timed it ([CPU pass bytes]).
  auto per_optimizer = [](double rate, absl::string_view otherwise) {
    return rate > 0 ? absl::StrCat(FormatCount(rate), " params/s")
                    : absl::StrCat("not measured (", otherwise, ")");
  };
  kv.Add("CPU update adamw8bit",
         per_optimizer(h.cpu_adamw8bit_params_per_second(),
                       absl::StrFormat("adamw's time x%.1f", kAdamW8bitCpuTimeFactor)));
  kv.Add("CPU update adamw_bf16",
         per_optimizer(h.cpu_adamw_bf16_params_per_second(), "adamw's update scaled by bytes"));
  kv.Add("CPU update sgd",
         per_optimizer(h.cpu_sgd_params_per_second(), "adamw's update scaled by bytes"));
  kv.Add("Host memory", FormatGiB(h.host_memory_bytes()));
  kv.Add("Pinned limit",
         h.pinned_limit_bytes() == 0 ? "unlimited" : FormatGiB(h.pinned_limit_bytes()));
  return kv.Render();
}

std::string FormatTrace(const v1::Trace& t) {
  KeyValues kv;
  kv.Add("Trace id", t.trace_id().empty() ? "-" : t.trace_id());
  kv.Add("Model", absl::StrCat(t.arch().name(), " (", t.arch().family(), ", ",
                               t.arch().num_layers(), " layers)"));
  kv.Add("Workload",
         absl::StrCat(t.workload().micro_batch(), " × ", t.workload().seq_len(), " tokens"));
  kv.Add("Dtype", DTypeLabel(t.param_dtype()));
  kv.Add("Hardware", t.hardware_name().empty() ? "-" : t.hardware_name());
  kv.Add("Source", t.analytic() ? "analytic (synthesised)" : "profiled");
  kv.Add("Parameters",
         absl::StrCat(FormatCount(static_cast<double>(t.total_param_count())), " total, ",
                      FormatCount(static_cast<double>(t.trainable_param_count())), " trainable"));
  if (t.chunk_bytes() > 0) {
    kv.Add("Chunks",
           absl::StrCat(t.chunk_param_bytes_size(), " × ", t.chunk_bytes() >> 20, " MiB"));
  }
  std::string out = kv.Render();
  TextTable table({"part", "param GiB", "saved GiB", "input GiB", "fwd", "bwd", "recompute"},
                  {Align::kLeft, Align::kRight, Align::kRight, Align::kRight, Align::kRight,
                   Align::kRight, Align::kRight});
  auto gib = [](int64_t bytes) { return absl::StrFormat("%.3f", bytes / kGiB); };
  table.AddRow({"embedding", gib(t.embedding().param_bytes()), gib(t.embedding().saved_bytes()), "",
                FormatSeconds(t.embedding().forward_seconds()),
                FormatSeconds(t.embedding().backward_seconds()), ""});
  for (int i = 0; i < t.blocks_size(); ++i) {
    const v1::BlockTrace& b = t.blocks(i);
    table.AddRow({absl::StrCat("block ", i), gib(b.param_bytes()), gib(b.saved_bytes()),
                  gib(b.input_bytes()), FormatSeconds(b.forward_seconds()),
                  FormatSeconds(b.backward_seconds()), FormatSeconds(b.recompute_seconds())});
  }
  table.AddRow({"head", gib(t.head().param_bytes()), gib(t.head().saved_bytes()), "",
                FormatSeconds(t.head().forward_seconds()),
                FormatSeconds(t.head().backward_seconds()), ""});
  absl::StrAppend(&out, "\n", table.Render(2));
  return out;
}

std::string FormatCalibrations(const v1::GetCalibrationResponse& response) {
  if (response.calibrations_size() == 0) {
    return "No calibration yet: report measurements with 'memplan measure'.\n";
  }
  TextTable table({"hardware", "dtype", "family", "method", "optimizer", "fragmentation",
                   "residual", "samples", "raw |error|", "step time", "updated (UTC)"},
                  {Align::kLeft, Align::kLeft, Align::kLeft, Align::kLeft, Align::kLeft,
                   Align::kRight, Align::kRight, Align::kRight, Align::kRight, Align::kRight});
  // [Calibration keys]: "*" pools the method's optimizers; "-" marks rows from before keys
  // named the method and optimizer.
  auto key_part = [](const std::string& v) { return v.empty() ? std::string("-") : v; };
  for (const v1::Calibration& c : response.calibrations()) {
    table.AddRow({c.hardware_name(), DTypeLabel(c.param_dtype()), c.model_family(),
                  key_part(c.method()), key_part(c.optimizer()),
                  absl::StrFormat("×%.3f", c.fragmentation_factor()), FormatGiB(c.residual_bytes()),
                  absl::StrCat(c.samples()),
                  absl::StrFormat("%.1f%%", c.mean_abs_relative_error() * 100),
                  c.time_samples() > 0 ? absl::StrFormat("×%.3f", c.time_factor()) : "-",
                  TimeLabel(c.updated_at_unix_ms())});
  }
  return table.Render();
}

std::string FormatAdmit(const v1::AdmitResponse& reply) {
  TextTable table({"pool", "hardware", "GPUs", "verdict", "peak GiB", "tokens/s/GPU",
                   "job tokens/s", "plan id"},
                  {Align::kLeft, Align::kLeft, Align::kRight, Align::kLeft, Align::kRight,
                   Align::kRight, Align::kRight, Align::kLeft});
  std::string reasons;
  for (const v1::PoolVerdict& v : reply.pools()) {
    table.AddRow({v.pool(), v.hardware_name(), absl::StrCat(v.gpus()), v.fits() ? "fits" : "no fit",
                  absl::StrFormat("%.2f", v.prediction().peak_bytes() / kGiB),
                  FormatCount(v.prediction().tokens_per_second()),
                  v.fits() ? FormatCount(v.job_tokens_per_second()) : "-", v.plan_id()});
    absl::StrAppend(&reasons, "  ", v.pool(), ": ", v.reason(), "\n");
  }
  return absl::StrCat(table.Render(), "\nBest pool         ",
                      reply.best_pool().empty() ? "none fits" : reply.best_pool(), "\n\nWhy\n",
                      reasons);
}

std::string FormatMeasurementReply(const v1::ReportMeasurementResponse& reply) {
  KeyValues kv;
  kv.Add("Measurement id", reply.measurement_id());
  kv.Add("Prediction error",
         reply.has_relative_error()
             ? absl::StrCat(Percent(reply.relative_error()), " ", kRelativeErrorDefinition,
                            ", reserved peak (negative: the run used more than predicted)")
             : "none: an out-of-memory run has no measured peak (counted apart as an OOM)");
  const bool quarantined = !reply.quarantine_reason().empty();
  if (quarantined) {
    kv.Add("Quarantined",
           absl::StrCat(reply.quarantine_reason(), "; stored, not applied to calibration"));
  }
  std::string out = kv.Render();
  if (reply.has_calibration()) {
    v1::GetCalibrationResponse one;
    *one.add_calibrations() = reply.calibration();
    absl::StrAppend(
        &out,
        quarantined ? "\nCalibration (unchanged)\n" : "\nCalibration after this measurement\n",
        FormatCalibrations(one));
  }
  return out;
}

std::string FormatPlansList(const v1::ListPlansResponse& page) {
  if (page.plans_size() == 0) return "No stored plans.\n";
  TextTable table({"plan id", "created (UTC)", "model", "hardware", "batch×seq", "verdict",
                   "peak GiB", "tokens/s"},
                  {Align::kLeft, Align::kLeft, Align::kLeft, Align::kLeft, Align::kRight,
                   Align::kLeft, Align::kRight, Align::kRight});
  for (const v1::StoredPlan& s : page.plans()) {
    table.AddRow(
        {s.plan_id(), TimeLabel(s.created_at_unix_ms()), ModelLabel(s.request()),
         HardwareLabel(s.request()),
         absl::StrCat(s.request().workload().micro_batch(), "×", s.request().workload().seq_len()),
         s.response().fits() ? "fits" : "no fit",
         absl::StrFormat("%.2f", s.response().prediction().peak_bytes() / kGiB),
         FormatCount(s.response().prediction().tokens_per_second())});
  }
  return table.Render();
}

std::string FormatStoredPlan(const v1::StoredPlan& s) {
  KeyValues kv;
  kv.Add("Plan id", s.plan_id());
  kv.Add("Created", absl::StrCat(TimeLabel(s.created_at_unix_ms()), " UTC"));
  kv.Add("Model", ModelLabel(s.request()));
  kv.Add("Hardware", HardwareLabel(s.request()));
  kv.Add("Workload",
         absl::StrCat(s.request().workload().micro_batch(), " × ", s.request().workload().seq_len(),
                      " tokens, dtype ", DTypeLabel(s.request().param_dtype()), ", optimizer ",
                      s.request().optimizer().empty() ? "adamw" : s.request().optimizer()));
  std::string out = absl::StrCat(kv.Render(), "\n", FormatPlanResponse(s.response()));
  if (s.measurements_size() > 0) {
    TextTable table({"#", "measured (UTC)", "reserved GiB", "allocated GiB", "device GiB",
                     "load GiB", "step", "oom", "calibration", "reported by", "note"},
                    {Align::kRight, Align::kLeft, Align::kRight, Align::kRight, Align::kRight,
                     Align::kRight, Align::kRight});
    auto gib = [](int64_t bytes) { return absl::StrFormat("%.2f", bytes / kGiB); };
    std::string quarantined;
    for (int i = 0; i < s.measurements_size(); ++i) {
      const v1::Measurement& m = s.measurements(i);
      table.AddRow(
          {absl::StrCat(i + 1), TimeLabel(m.measured_at_unix_ms()), gib(m.peak_reserved_bytes()),
           gib(m.peak_allocated_bytes()), gib(m.peak_device_bytes()), gib(m.load_peak_bytes()),
           FormatSeconds(m.step_seconds()), m.oom() ? "yes" : "no",
           m.quarantine_reason().empty() ? "used" : "quarantined", m.reported_by(), m.note()});
      if (!m.quarantine_reason().empty()) {
        absl::StrAppend(&quarantined, "  #", i + 1, " quarantined: ", m.quarantine_reason(), "\n");
      }
    }
    absl::StrAppend(&out, "\nMeasurements\n", table.Render(2), quarantined);
  }
  return out;
}

}  // namespace memplan::cli
