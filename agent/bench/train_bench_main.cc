// memplan-train-bench: times training steps of a random-init Llama-family preset on synthetic
// tokens, unmanaged (plain LibTorch eager + torch::optim::AdamW) or managed (ChunkManager with the
// given plan knobs), and prints one result line per run: tokens/s, step seconds, steady peak
// allocated/reserved memory, last loss, and the chunk upload bandwidth. `--variants` runs several
// block-mode lists on one unmanaged model (random init of an 8B model costs about a minute of CPU).
// Run with --help for the flags.
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "agent/core/seconds_since.h"
#include "agent/core/torch_pch.h"
#include "agent/train/train_config.h"
#include "agent/train/trainer.h"
#include "common/build_info.h"
#include "common/flags.h"
#include "common/presets.h"
#include "common/request_flags.h"
#include "common/status.h"

#if __has_include(<c10/cuda/CUDAStream.h>)
#include <ATen/cuda/CUDAEvent.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#define MEMPLAN_TRAIN_BENCH_CUDA 1
#endif

namespace memplan {
namespace {

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;

struct BenchConfig {
  std::string arch = "llama-tiny";
  std::optional<bool> tie_embeddings;  // overrides the preset
  int64_t batch = 1;
  int64_t seq = 128;
  int steps = 5;   // timed
  int warmup = 2;  // untimed, first
  std::string dtype = "bf16";
  std::string device = "cuda";
  std::string mode = "unmanaged";  // unmanaged | managed
  int64_t chunk_mib = 64;
  int n_persist = 0;  // -1: all
  int n_buffer = 2;
  std::string block_modes;  // csv, or "all:MODE"
  int n_ckpt = 0, n_swap = 0, n_hs_offload = 0;
  std::string host_memory = "pinned";
  std::vector<std::string> variants;  // "name=modes" (unmanaged only), run on one model
  int cpu_threads = 0;                // 0: hardware threads
  int offload_in_flight = 2;
  double clip = 0;
  std::string optimizer = "adamw";
  bool wait_step_updates = false;
  bool speculative_clip = false;
  double device_update_share = 0;
  double lr = 1e-4;
  uint64_t seed = 0;
  bool measure_h2d = false;
  std::string label;
  std::string out;
};

constexpr char kUsage[] = R"(usage: memplan-train-bench [flags]
  --arch PRESET            model preset (common/presets.h), random init      [llama-tiny]
  --tie-embeddings BOOL    override the preset's tie_word_embeddings
  --batch N --seq N        micro-batch shape                                 [1 128]
  --steps N --warmup N     timed steps after untimed warm-up steps            [5 2]
  --dtype bf16|fp32        parameter and compute dtype                       [bf16]
  --device cuda|cpu                                                          [cuda]
  --mode unmanaged|managed unmanaged: plain LibTorch eager + torch AdamW     [unmanaged]
  --chunk-mib N --n-persist N (-1 = all) --n-buffer N                        [64 0 2]
  --block-modes CSV|all:MODE   per-block modes (none, ckpt, swap, hs_offload)
  --n-ckpt N --n-swap N --n-hs-offload N   counts, ordered as the planner orders them
  --host-memory pinned|pageable                                              [pinned]
  --variants NAME=MODES[;NAME=MODES...]   unmanaged: several block-mode lists on one model
  --cpu-threads N          CPU AdamW threads (0 = hardware threads)          [0]
  --offload-in-flight N    HS_OFFLOAD/SWAP groups in flight                   [2]
  --clip X --lr X --seed N                                                   [0 1e-4 0]
  --optimizer adamw|adamw_bf16|adamw8bit|sgd                                 [adamw]
  --wait-step-updates      managed: Step() waits for the offloaded chunks' CPU updates instead of
                           letting the next forward meet them ([Deferred CPU updates]; A/B only)
  --speculative-clip       managed, clipping: after a step that needed no clipping, the next
                           step's CPU updates start in backward into a second copy of the
                           state, redone if that step clips ([Speculative clipped updates])
  --device-update-share X  managed, adamw_bf16 / adamw8bit: the share (0..1) of the offloaded
                           chunks whose update, when Step() holds it until the norm, runs on the
                           device ([Device updates of offloaded chunks])                   [0]
  --measure-h2d            also time a pinned host-to-device copy of one chunk
  --label TEXT --out FILE  result label; append one JSON line per run to FILE
)";

absl::StatusOr<BenchConfig> ParseArgs(int argc, char** argv) {
  BenchConfig c;
  FlagSet flags;
  flags.String("--arch", &c.arch)
      .Choice("--tie-embeddings", &c.tie_embeddings,
              FlagSet::Choices<bool>{{"true", true}, {"false", false}})
      .Int(kBatchFlag, &c.batch)
      .Int(kSeqFlag.name, &c.seq, 2, kSeqFlag.hi)  // a next-token target needs 2 tokens
      .Int("--steps", &c.steps, 1, 1 << 30)
      .Int("--warmup", &c.warmup, 0, 1 << 30)
      .Choice<std::string, std::string>(
          "--dtype", &c.dtype,
          [](absl::string_view v) -> std::optional<std::string> {
            if (!ParseDType(std::string_view(v.data(), v.size()))) return std::nullopt;
            return std::string(v);
          },
          "fp32, bf16, fp16")
      .String("--device", &c.device)
      .Choice("--mode", &c.mode,
              FlagSet::Choices<std::string>{{"unmanaged", "unmanaged"}, {"managed", "managed"}})
      .Int(kChunkMibFlag, &c.chunk_mib)
      .Int("--n-persist", &c.n_persist, -1, kMaxChunkCount)  // -1: all
      .Int("--n-buffer", &c.n_buffer, 1, kMaxChunkCount)
      .String("--block-modes", &c.block_modes)
      .Int("--n-ckpt", &c.n_ckpt, 0, kMaxLayers)
      .Int("--n-swap", &c.n_swap, 0, kMaxLayers)
      .Int("--n-hs-offload", &c.n_hs_offload, 0, kMaxLayers)
      .Choice("--host-memory", &c.host_memory,
              FlagSet::Choices<std::string>{{"pinned", "pinned"}, {"pageable", "pageable"}})
      .Custom("--variants",
              [&c](absl::string_view v) -> absl::Status {
                std::vector<std::string> variants = absl::StrSplit(v, ';', absl::SkipEmpty());
                for (const std::string& variant : variants) {
                  if (variant.find('=') == std::string::npos) {
                    return absl::InvalidArgumentError(
                        absl::StrCat(Quote(variant), " is not NAME=MODES"));
                  }
                }
                c.variants = std::move(variants);
                return absl::OkStatus();
              })
      .Int("--cpu-threads", &c.cpu_threads, 0, 1024)
      .Int("--offload-in-flight", &c.offload_in_flight, 1, 1024)
      .Double("--clip", &c.clip, 0, 1e12)
      .String("--optimizer", &c.optimizer)
      .Switch("--wait-step-updates", &c.wait_step_updates)
      .Switch("--speculative-clip", &c.speculative_clip)
      .Double("--device-update-share", &c.device_update_share, 0, 1)
      .Double("--lr", &c.lr, 0, 1e3)
      .Int("--seed", &c.seed, 0, std::numeric_limits<int64_t>::max())
      .Switch("--measure-h2d", &c.measure_h2d)
      .String("--label", &c.label)
      .String("--out", &c.out);
  const std::vector<std::string> args(argv + 1, argv + argc);
  // --help wins over every other flag, valid or not.
  if (std::find(args.begin(), args.end(), "--help") != args.end() ||
      std::find(args.begin(), args.end(), "-h") != args.end()) {
    return absl::CancelledError("help");
  }
  RETURN_IF_ERROR(flags.Parse(args));
  if (!c.variants.empty() && c.mode != "unmanaged") {
    return absl::InvalidArgumentError(
        "--variants: unmanaged runs only (a managed run owns the "
        "parameters)");
  }
  if (c.label.empty()) c.label = absl::StrCat(c.arch, "-", c.mode);
  return c;
}

// "all:MODE" or a csv list, else the counts.
absl::StatusOr<BlockModes> ResolveModes(const std::string& text, const BenchConfig& c,
                                        int num_blocks) {
  if (text.rfind("all:", 0) == 0) {
    ASSIGN_OR_RETURN(BlockModes one, ParseBlockModeList(text.substr(4)));
    if (one.size() != 1) return absl::InvalidArgumentError("all:MODE takes one mode: " + text);
    return BlockModes(num_blocks, one[0]);
  }
  if (!text.empty()) {
    ASSIGN_OR_RETURN(BlockModes modes, ParseBlockModeList(text));
    if (static_cast<int>(modes.size()) != num_blocks) {
      return absl::InvalidArgumentError(
          absl::StrCat("block modes: ", modes.size(), " given for ", num_blocks, " blocks"));
    }
    return modes;
  }
  return BlockModesFromCounts(num_blocks, c.n_swap, c.n_ckpt, c.n_hs_offload);
}

std::string ModesSummary(const BlockModes& modes) {
  std::map<std::string, int> counts;
  for (BlockMode m : modes) ++counts[std::string(BlockModeName(m))];
  std::vector<std::string> parts;
  for (const auto& [name, n] : counts) parts.push_back(absl::StrCat(name, "x", n));
  return absl::StrJoin(parts, "+");
}

// Best-of-5 pinned host-to-device copy of `bytes` on a side stream, in bytes/s (0 without CUDA).
double MeasurePinnedH2D(const torch::Device& device, int64_t bytes) {
#ifdef MEMPLAN_TRAIN_BENCH_CUDA
  if (!device.is_cuda()) return 0;
  torch::Tensor host =
      torch::empty({bytes}, torch::TensorOptions().dtype(torch::kUInt8).pinned_memory(true));
  host.fill_(1);
  torch::Tensor dev =
      torch::empty({bytes}, torch::TensorOptions().dtype(torch::kUInt8).device(device));
  c10::cuda::CUDAStream stream = c10::cuda::getStreamFromPool(false, device.index());
  c10::cuda::CUDAStreamGuard guard(stream);
  double best = 0;
  for (int i = 0; i < 6; ++i) {
    at::cuda::CUDAEvent start(cudaEventDefault), end(cudaEventDefault);
    start.record(stream);
    dev.copy_(host, /*non_blocking=*/true);
    end.record(stream);
    end.synchronize();
    const double seconds = start.elapsed_time(end) / 1000.0;
    if (i > 0 && seconds > 0) best = std::max(best, static_cast<double>(bytes) / seconds);
  }
  return best;
#else
  (void)device;
  (void)bytes;
  return 0;
#endif
}

struct RunResult {
  std::string label;
  std::string modes;
  double tokens_per_second = 0;
  double step_seconds = 0;
  // Mean of each timed step's time after its backward (the optimizer stage, CPU updates that
  // wait for Step() included).
  double after_backward_seconds = 0;
  int64_t peak_allocated_bytes = 0;
  int64_t peak_reserved_bytes = 0;
  double last_loss = 0;
  ChunkUploadStats uploads;
  ChunkMemoryStats chunk_stats;
  ChunkManager::SpeculationCounts speculation;  // over warm-up and timed steps
  ActivationOffloadStats offload_stats;
  bool has_chunks = false;
  bool has_offload = false;
};

// Warm-up steps, then timed steps; tokens/s = timed tokens / timed seconds.
absl::StatusOr<RunResult> TimeSteps(Trainer& trainer, const std::vector<MicroBatch>& batches,
                                    const BenchConfig& c) {
  RunResult r;
  int64_t tokens = 0;
  double seconds = 0;
  for (int s = 0; s < c.warmup + c.steps; ++s) {
    const bool timed = s >= c.warmup;
    if (s == c.warmup && trainer.chunk_manager() != nullptr) {
      trainer.chunk_manager()->ResetUploadStats();
    }
    ASSIGN_OR_RETURN(StepStats stats, trainer.Step({batches[s % batches.size()]}));
    std::fprintf(stderr,
                 "  step %d%s loss %.4f  grad norm %.4f  %.3f s (forward+backward %.3f s)  %.0f "
                 "tok/s  peak alloc %.2f GiB  CPU update %.3f s for %.2f G params (%d chunks "
                 "started in backward), %.2f G on the device\n",
                 s + 1, timed ? "" : " (warm-up)", stats.loss, stats.grad_norm, stats.seconds,
                 stats.forward_backward_seconds, stats.tokens_per_second,
                 stats.peak_allocated_bytes / kGiB, stats.cpu_update_seconds,
                 stats.cpu_updated_params / 1e9, stats.offloaded_updates_in_backward,
                 stats.device_updated_params / 1e9);
    if (!timed) continue;
    tokens += stats.tokens;
    seconds += stats.seconds;
    r.after_backward_seconds += (stats.seconds - stats.forward_backward_seconds) / c.steps;
    r.peak_allocated_bytes = std::max(r.peak_allocated_bytes, stats.peak_allocated_bytes);
    r.peak_reserved_bytes = std::max(r.peak_reserved_bytes, stats.peak_reserved_bytes);
    r.last_loss = stats.loss;
  }
  r.tokens_per_second = seconds > 0 ? tokens / seconds : 0;
  r.step_seconds = seconds / c.steps;
  if (ChunkManager* chunks = trainer.chunk_manager()) {
    r.has_chunks = true;
    r.uploads = chunks->UploadStats();
    r.chunk_stats = chunks->MemoryStats();
    r.speculation = chunks->Speculation();
  }
  if (ActivationOffloader* offloader = trainer.offloader()) {
    r.has_offload = true;
    r.offload_stats = offloader->Stats();
  }
  return r;
}

std::string ResultLine(const RunResult& r, double h2d_bytes_per_second) {
  std::string line = absl::StrFormat(
      "RESULT %s modes=%s tokens_per_s=%.0f step_s=%.4f after_backward_s=%.4f peak_alloc_GiB=%.2f "
      "peak_reserved_GiB=%.2f loss=%.4f",
      r.label, r.modes, r.tokens_per_second, r.step_seconds, r.after_backward_seconds,
      r.peak_allocated_bytes / kGiB,
      r.peak_reserved_bytes / kGiB, r.last_loss);
  if (r.has_chunks) {
    const ChunkMemoryStats& s = r.chunk_stats;
    absl::StrAppendFormat(&line, " chunks=%d persist=%d buffers=%d", s.n_chunks, s.n_persist,
                          s.n_buffer);
    if (r.uploads.uploads > 0) {
      const double gbps = r.uploads.seconds > 0 ? r.uploads.bytes / r.uploads.seconds / 1e9 : 0;
      absl::StrAppendFormat(&line, " upload_GB=%.2f upload_GB_per_s=%.1f", r.uploads.bytes / 1e9,
                            gbps);
      if (h2d_bytes_per_second > 0) {
        absl::StrAppendFormat(&line, " upload_vs_pinned_h2d=%.2f",
                              gbps * 1e9 / h2d_bytes_per_second);
      }
    }
    if (s.pinned_fallback) absl::StrAppend(&line, " pinned_fallback=1");
    if (r.speculation.speculated > 0) {
      absl::StrAppendFormat(&line, " speculated_steps=%d restored_steps=%d",
                            r.speculation.speculated, r.speculation.restored);
    }
  }
  if (h2d_bytes_per_second > 0) {
    absl::StrAppendFormat(&line, " pinned_h2d_GB_per_s=%.1f", h2d_bytes_per_second / 1e9);
  }
  if (r.has_offload) {
    absl::StrAppendFormat(&line, " act_offload_GB=%.2f act_sync_fetches=%d",
                          r.offload_stats.offloaded_bytes / 1e9,
                          r.offload_stats.synchronous_fetches);
  }
  return line;
}

std::string JsonEscape(const std::string& s) {
  std::string out;
  for (char ch : s) {
    if (ch == '"' || ch == '\\') out.push_back('\\');
    if (static_cast<unsigned char>(ch) >= 0x20) out.push_back(ch);
  }
  return out;
}

std::string ResultJson(const RunResult& r, const BenchConfig& c, const std::string& device_name,
                       double h2d_bytes_per_second) {
  std::string json = absl::StrFormat(
      R"({"label":"%s","arch":"%s","device":"%s","dtype":"%s","mode":"%s","batch":%d,"seq":%d,)"
      R"("steps":%d,"warmup":%d,"block_modes":"%s","tokens_per_second":%.1f,)"
      R"("step_seconds":%.5f,"peak_allocated_bytes":%d,"peak_reserved_bytes":%d,"loss":%.6f,)"
      R"("pinned_h2d_bytes_per_second":%.0f)",
      JsonEscape(r.label), JsonEscape(c.arch), JsonEscape(device_name), JsonEscape(c.dtype),
      JsonEscape(c.mode), c.batch, c.seq, c.steps, c.warmup, JsonEscape(r.modes),
      r.tokens_per_second, r.step_seconds, r.peak_allocated_bytes, r.peak_reserved_bytes,
      r.last_loss, h2d_bytes_per_second);
  if (r.has_chunks) {
    const ChunkMemoryStats& s = r.chunk_stats;
    absl::StrAppendFormat(
        &json,
        R"(,"chunk_bytes":%d,"n_chunks":%d,"n_persist":%d,"n_buffer":%d,"host_memory":"%s",)"
        R"("persistent_device_bytes":%d,"buffer_device_bytes":%d,"host_pinned_bytes":%d,)"
        R"("host_pageable_bytes":%d,"uploads":%d,"upload_bytes":%d,"upload_seconds":%.6f)",
        c.chunk_mib << 20, s.n_chunks, s.n_persist, s.n_buffer, c.host_memory,
        s.persistent_device_bytes, s.buffer_device_bytes, s.host_pinned_bytes,
        s.host_pageable_bytes, r.uploads.uploads, r.uploads.bytes, r.uploads.seconds);
  }
  if (r.has_offload) {
    absl::StrAppendFormat(&json,
                          R"(,"activation_offloaded_bytes":%d,"activation_host_peak_bytes":%d,)"
                          R"("activation_synchronous_fetches":%d)",
                          r.offload_stats.offloaded_bytes, r.offload_stats.host_bytes_peak,
                          r.offload_stats.synchronous_fetches);
  }
  json += "}\n";
  return json;
}

absl::Status AppendLine(const std::string& path, const std::string& line) {
  std::FILE* f = std::fopen(path.c_str(), "ab");
  if (f == nullptr) return absl::NotFoundError("--out " + path + ": cannot open");
  const bool ok = std::fwrite(line.data(), 1, line.size(), f) == line.size();
  return std::fclose(f) == 0 && ok ? absl::OkStatus()
                                   : absl::DataLossError("--out " + path + ": write failed");
}

absl::Status Run(const BenchConfig& c) {
  std::optional<ModelSpec> preset = FindModelPreset(c.arch);
  if (!preset.has_value()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--arch ", c.arch, " is not a preset", UnknownModelPresetHint(c.arch)));
  }
  ModelSpec spec = *preset;
  if (c.tie_embeddings.has_value()) spec.tie_word_embeddings = *c.tie_embeddings;
  std::optional<DType> dtype = ParseDType(c.dtype);
  if (!dtype.has_value()) return FlagError("--dtype", NotOneOf(c.dtype, "fp32, bf16, fp16"));
  const torch::Device device =
      c.device == "cpu" ? torch::Device(torch::kCPU) : torch::Device(torch::kCUDA, 0);
  if (device.is_cuda() && !torch::cuda::is_available()) {
    return absl::FailedPreconditionError("--device cuda: torch sees no CUDA device");
  }
  std::string device_name = "cpu";
#ifdef MEMPLAN_TRAIN_BENCH_CUDA
  if (device.is_cuda()) device_name = at::cuda::getDeviceProperties(0)->name;
#endif
  const bool managed = c.mode == "managed";
  const double h2d = c.measure_h2d ? MeasurePinnedH2D(device, c.chunk_mib << 20) : 0;

  const auto init_start = std::chrono::steady_clock::now();
  LlamaModelOptions model_options;
  model_options.spec = spec;
  model_options.dtype = *dtype;
  model_options.device = device;
  if (managed) model_options.param_device = torch::Device(torch::kCPU);
  model_options.seed = c.seed;
  ASSIGN_OR_RETURN(std::unique_ptr<LlamaModel> model, LlamaModel::Create(model_options));
  std::fprintf(stderr, "%s: model %s (tied=%d) created in %.1f s\n", c.label.c_str(),
               spec.name.c_str(), spec.tie_word_embeddings ? 1 : 0, SecondsSince(init_start));

  // Synthetic tokens: uniform ids, each position's target the next input (the last one ignored),
  // two batches alternated so that consecutive steps see different data.
  std::vector<MicroBatch> batches;
  torch::manual_seed(c.seed + 1);
  for (int i = 0; i < 2; ++i) {
    MicroBatch b;
    b.input_ids = torch::randint(spec.vocab_size, {c.batch, c.seq},
                                 torch::TensorOptions().dtype(torch::kLong))
                      .to(device);
    b.labels = torch::constant_pad_nd(b.input_ids, {0, 1}, -100).slice(1, 1);
    batches.push_back(std::move(b));
  }

  std::vector<std::pair<std::string, std::string>> runs;  // label, modes text
  if (c.variants.empty()) {
    runs.emplace_back(c.label, c.block_modes);
  } else {
    for (const std::string& v : c.variants) {
      const size_t eq = v.find('=');
      if (eq == std::string::npos) {
        return FlagError("--variants", absl::StrCat(Quote(v), " is not NAME=MODES"));
      }
      runs.emplace_back(absl::StrCat(c.label, "-", v.substr(0, eq)), v.substr(eq + 1));
    }
  }
  for (const auto& [label, modes_text] : runs) {
    ASSIGN_OR_RETURN(BlockModes modes, ResolveModes(modes_text, c, model->num_blocks()));
    const bool all_none =
        std::all_of(modes.begin(), modes.end(), [](BlockMode m) { return m == BlockMode::kNone; });
    TrainerOptions options;
    options.max_grad_norm = c.clip;
    const std::optional<OptimizerKind> optimizer = ParseOptimizer(c.optimizer);
    if (!optimizer.has_value()) {
      return FlagError("--optimizer", absl::StrCat(Quote(c.optimizer), " is not one of ",
                                                   std::string(OptimizerAllowList())));
    }
    options.optimizer = *optimizer;
    options.chunks.defer_step_updates = !c.wait_step_updates;
    options.chunks.speculative_clip = c.speculative_clip;
    options.chunks.device_update_share = c.device_update_share;
    options.adamw.lr = c.lr;
    options.block_modes = modes;
    options.managed = managed;
    options.plain_reference = !managed && all_none;
    options.chunks.chunk_bytes = c.chunk_mib << 20;
    options.chunks.n_persist = c.n_persist < 0 ? (1 << 30) : c.n_persist;
    options.chunks.n_buffer = c.n_buffer;
    options.chunks.host_memory =
        c.host_memory == "pageable" ? HostMemoryKind::kPageable : HostMemoryKind::kPinned;
    options.chunks.cpu_threads =
        c.cpu_threads > 0 ? c.cpu_threads
                          : std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
    options.offload.host_memory = options.chunks.host_memory;
    options.offload.max_in_flight_groups = c.offload_in_flight;
    RunResult result;
    {
      ASSIGN_OR_RETURN(std::unique_ptr<Trainer> trainer, Trainer::Create(model.get(), options));
      ASSIGN_OR_RETURN(result, TimeSteps(*trainer, batches, c));
    }
    result.label = label;
    result.modes = options.plain_reference ? "plain" : ModesSummary(modes);
    std::printf("%s\n", ResultLine(result, h2d).c_str());
    std::fflush(stdout);
    if (!c.out.empty()) RETURN_IF_ERROR(AppendLine(c.out, ResultJson(result, c, device_name, h2d)));
#ifdef MEMPLAN_TRAIN_BENCH_CUDA
    // The next variant's peaks must not include this one's cached blocks.
    if (device.is_cuda()) c10::cuda::CUDACachingAllocator::emptyCache();
#endif
  }
  return absl::OkStatus();
}

}  // namespace
}  // namespace memplan

int main(int argc, char** argv) {
  if (memplan::VersionRequested(std::vector<std::string>(argv + 1, argv + argc))) {
    std::printf("%s\n", memplan::build_info::VersionLine("memplan-train-bench").c_str());
    return 0;
  }
  absl::StatusOr<memplan::BenchConfig> config = memplan::ParseArgs(argc, argv);
  if (!config.ok()) {
    const bool help = absl::IsCancelled(config.status());
    if (!help)
      std::fprintf(stderr, "memplan-train-bench: %s\n", config.status().ToString().c_str());
    std::fprintf(help ? stdout : stderr, "%s", memplan::kUsage);
    return help ? 0 : 2;
  }
  absl::Status status;
  try {
    status = memplan::Run(*config);
  } catch (const c10::Error& e) {
    status = absl::InternalError(e.what_without_backtrace());
  }
  if (!status.ok()) {
    std::fprintf(stderr, "memplan-train-bench: %s\n", status.ToString().c_str());
    return 1;
  }
  return 0;
}
