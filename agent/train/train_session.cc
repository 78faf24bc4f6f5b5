#include "agent/train/train_session.h"

#include <ATen/Parallel.h>
#include <signal.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <functional>
#include <ostream>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "agent/chunks/chunk_manager.h"
#include "agent/client/plan_share.h"
#include "agent/client/planner_client.h"
#include "agent/client/planner_loop.h"
#include "agent/core/host_ram.h"
#include "agent/dist/process_group.h"
#include "agent/io/checkpoint.h"
#include "agent/io/file_system.h"
#include "agent/io/model_files.h"
#include "agent/io/osft_checkpoint.h"
#include "agent/io/peft_adapter.h"
#include "agent/io/random_access_file.h"
#include "agent/io/safetensors_torch.h"
#include "agent/io/synthetic_tokens.h"
#include "agent/io/token_batcher.h"
#include "agent/io/token_file.h"
#include "agent/io/trainer_state.h"
#include "agent/io/writable_file.h"
#include "agent/metrics/agent_metrics.h"
#include "agent/profiler/kernel_trace.h"
#include "agent/profiler/memory_probe.h"
#include "agent/profiler/memory_timeline.h"
#include "agent/train/device_setup.h"
#include "agent/train/vl_data.h"
#include "common/hf_config.h"
#include "common/log.h"
#include "common/optimizer_bytes.h"
#include "common/presets.h"
#include "common/status.h"
#include "common/validate.h"

namespace memplan {
namespace {

// The synthetic stream is built in memory; beyond this many tokens the batcher wraps around.
constexpr int64_t kMaxSyntheticTokens = int64_t{1} << 24;

absl::StatusOr<std::shared_ptr<const io::TokenFile>> OpenData(const TrainConfig& c,
                                                              const ModelSpec& spec,
                                                              int world_size) {
  io::TokenFileOptions options;
  options.raw_token_bytes = c.raw_token_bytes;
  options.vocab_size = spec.vocab_size;
  if (!c.data_file.empty()) {
    ASSIGN_OR_RETURN(std::unique_ptr<io::TokenFile> file,
                     io::TokenFile::Open(c.data_file, options));
    // An id beyond the vocabulary would otherwise surface only at the batch that reads it, after
    // steps and checkpoints: the whole file is scanned once, before the first step.
    RETURN_IF_ERROR(file->CheckAllIds());
    return std::shared_ptr<const io::TokenFile>(std::move(file));
  }
  io::SyntheticTokenOptions synthetic;
  const int64_t wanted = c.steps * c.grad_accum * world_size * c.batch * c.seq + c.seq + 1;
  synthetic.num_tokens = std::clamp<int64_t>(wanted, c.seq + 1, kMaxSyntheticTokens);
  synthetic.vocab_size = spec.vocab_size;
  synthetic.seed = c.seed;
  synthetic.noise = c.synthetic_noise;
  ASSIGN_OR_RETURN(std::vector<uint32_t> tokens, io::MakeSyntheticTokens(synthetic));
  ASSIGN_OR_RETURN(std::string bytes, io::EncodeTokenFile(tokens, 4, spec.vocab_size));
  options.raw_token_bytes = 0;
  ASSIGN_OR_RETURN(
      std::unique_ptr<io::TokenFile> file,
      io::TokenFile::Open(io::NewMemoryFile(std::move(bytes), "<synthetic>"), options));
  return std::shared_ptr<const io::TokenFile>(std::move(file));
}

absl::StatusOr<MicroBatch> NextBatch(const io::TokenBatcher& batcher, int64_t position) {
  ASSIGN_OR_RETURN(io::TokenBatch batch, batcher.Batch(position));
  MicroBatch out;
  const std::vector<int64_t> sizes = {batch.batch_size, batch.seq_len};
  out.input_ids = torch::from_blob(batch.input_ids.data(), sizes, torch::kLong).clone();
  out.labels = torch::from_blob(batch.labels.data(), sizes, torch::kLong).clone();
  return out;
}

// "45s", "12m03s", "3h07m": how long the remaining steps should take, for people reading the log.
std::string DurationText(double seconds) {
  const int64_t s = static_cast<int64_t>(std::llround(std::max(0.0, seconds)));
  if (s < 60) return absl::StrCat(s, "s");
  if (s < 3600) return absl::StrFormat("%dm%02ds", s / 60, s % 60);
  return absl::StrFormat("%dh%02dm", s / 3600, (s % 3600) / 60);
}

// Logged as `step=i/N` (unquoted: the log quotes strings only).
struct StepOfSteps {
  int64_t step;
  int64_t steps;
};
std::ostream& operator<<(std::ostream& out, const StepOfSteps& s) {
  return out << s.step << '/' << s.steps;
}

// The bytes of the files directly in `dir` (a checkpoint or export is one flat directory); 0 when
// it cannot be listed.
int64_t DirectoryBytes(const std::string& dir) {
  absl::StatusOr<std::vector<std::string>> names = io::ListDirectory(dir);
  if (!names.ok()) return 0;
  int64_t total = 0;
  for (const std::string& name : *names) {
    absl::StatusOr<int64_t> size = io::FileSizeBytes(io::JoinPath(dir, name));
    if (size.ok()) total += *size;
  }
  return total;
}

// Logs `msg="saving <what>"` before `write` and `msg="saved <what>"` with the directory's bytes
// and the seconds it took after it: a multi-gigabyte write is not silent.
absl::Status LoggedWrite(const std::string& what, const std::string& dir, int64_t step,
                         const std::function<absl::Status()>& write) {
  MEMPLAN_LOG(kInfo, "saving " + what).Field("dir", dir).Field("step", step);
  const auto start = std::chrono::steady_clock::now();
  RETURN_IF_ERROR(write());
  MEMPLAN_LOG(kInfo, "saved " + what)
      .Field("dir", dir)
      .Field("step", step)
      .Field("bytes", DirectoryBytes(dir))
      .Field("seconds",
             std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  return absl::OkStatus();
}

// [Stopping on a signal] The handler only records the signal; the step loop polls it between
// steps. SA_RESETHAND puts the default action back at delivery, so a second signal ends the
// process at once (an operator who cannot wait for the step in flight).
std::atomic<int> stop_signal{0};
static_assert(std::atomic<int>::is_always_lock_free, "the signal handler needs a lock-free flag");

extern "C" void RecordStopSignal(int signo) { stop_signal.store(signo, std::memory_order_relaxed); }

// Installs the handler for SIGTERM and SIGINT for its lifetime, then restores what was there.
class StopSignalHandlers {
 public:
  StopSignalHandlers() {
    stop_signal.store(0, std::memory_order_relaxed);
    struct sigaction action {};
    action.sa_handler = RecordStopSignal;
    sigemptyset(&action.sa_mask);
    action.sa_flags = SA_RESTART | SA_RESETHAND;
    sigaction(SIGTERM, &action, &previous_term_);
    sigaction(SIGINT, &action, &previous_int_);
  }
  ~StopSignalHandlers() {
    sigaction(SIGTERM, &previous_term_, nullptr);
    sigaction(SIGINT, &previous_int_, nullptr);
  }
  StopSignalHandlers(const StopSignalHandlers&) = delete;
  StopSignalHandlers& operator=(const StopSignalHandlers&) = delete;

 private:
  struct sigaction previous_term_ {};
  struct sigaction previous_int_ {};
};

const char* SignalName(int signo) {
  switch (signo) {
    case SIGTERM:
      return "SIGTERM";
    case SIGINT:
      return "SIGINT";
    default:
      return "a signal";
  }
}

bool IsOutOfMemory(const absl::Status& status) {
  // The trainer turns every c10::Error (OutOfMemoryError included) into a status; the CUDA
  // caching allocator's message is the reliable marker.
  return absl::StrContains(status.message(), "out of memory");
}

// What world size > 1 does not run yet, refused before anything is built.
absl::Status CheckDistributedFlags(const TrainConfig& c, const PlannerLoopOptions& loop,
                                   int world_size) {
  if (world_size == 1) return absl::OkStatus();
  const std::string why =
      absl::StrCat(" is not supported with world size ", world_size, " (WORLD_SIZE) yet");
  if (loop.profile) return absl::UnimplementedError("--profile" + why);
  return absl::OkStatus();
}

}  // namespace

absl::Status AdoptResumedLora(TrainConfig* config) {
  std::optional<LoraOptions> saved;
  if (!config->resume_dir.empty() && io::IsLoraCheckpoint(config->resume_dir)) {
    absl::StatusOr<io::PeftAdapter> adapter = io::ReadPeftConfig(config->resume_dir);
    if (!adapter.ok()) {
      return absl::Status(adapter.status().code(), absl::StrCat("--resume ", config->resume_dir,
                                                                ": ", adapter.status().message()));
    }
    saved = adapter->lora;
  }
  const bool adopted = saved.has_value() && config->lora.rank == 0;
  RETURN_IF_ERROR(AdoptCheckpointLora(
      config, saved, io::JoinPath(config->resume_dir, io::kPeftConfigFile)));
  if (adopted) {
    MEMPLAN_LOG(kInfo, "LoRA settings from the checkpoint")
        .Field("dir", config->resume_dir)
        .Field("rank", config->lora.rank)
        .Field("alpha", config->lora.alpha)
        .Field("dropout", config->lora.dropout)
        .Field("targets", absl::StrJoin(LoraTrainingMethod(config->lora).lora_target_modules, ","));
  }
  return absl::OkStatus();
}

TrainSession::TrainSession(TrainConfig config, PlannerLoopOptions loop, DistOptions dist)
    : config_(std::move(config)),
      loop_(std::move(loop)),
      dist_(std::move(dist)),
      world_size_(dist_.world_size),
      lead_(dist_.rank == 0),
      cpu_threads_(config_.cpu_threads > 0
                       ? config_.cpu_threads
                       : std::max(1, static_cast<int>(std::thread::hardware_concurrency()) /
                                         std::max(1, dist_.local_world_size))) {}

TrainSession::~TrainSession() = default;

absl::Status TrainSession::Run() {
  // [Nothing to resume] A checkpoint already at --steps is reported before anything is built.
  ASSIGN_OR_RETURN(const bool nothing_to_train, ResumeIsComplete());
  if (nothing_to_train) return absl::OkStatus();
  if (!config_.resume_dir.empty() &&
      io::PathExists(io::JoinPath(config_.resume_dir, io::kCheckpointTrainerFile))) {
    // [OSFT checkpoints] Another split than the checkpoint's is refused before the model is built
    // and split (minutes for a large one); the Trainer checks it again with the factors. A
    // missing or unreadable checkpoint is reported by Resume().
    ASSIGN_OR_RETURN(const io::OsftSettings saved, io::ReadOsftSettings(config_.resume_dir));
    if (absl::Status s = io::CheckOsftResume(
            saved, config_.osft.enabled() ? config_.osft.rank_ratio : 0, config_.osft.targets);
        !s.ok()) {
      return absl::Status(s.code(),
                          absl::StrCat("--resume ", config_.resume_dir, ": ", s.message()));
    }
  }
  RETURN_IF_ERROR(PrepareDevice());
  RETURN_IF_ERROR(ResolvePlan());
  RETURN_IF_ERROR(BuildModel());
  RETURN_IF_ERROR(LoadWeights());
  RETURN_IF_ERROR(BuildTrainer());
  RETURN_IF_ERROR(FillShards());
  ReportApplied();
  // From here on the memory timeline is written however the run ends (WriteTimelineOnExit), so a
  // failed step still shows its curve.
  absl::Status status = Resume();
  if (status.ok()) {
    // [Stopping on a signal] From the first step to the last write.
    StopSignalHandlers handlers;
    status = Loop();
    if (status.ok()) status = stop_signal_ != 0 ? StopAfterSignal() : Finish();
  }
  WriteTimelineOnExit();
  return status;
}

std::string TrainSession::TimelinePath() const {
  return RankPath(config_.memory_timeline);
}

std::string TrainSession::RankPath(const std::string& path) const {
  if (dist_.rank == 0) return path;
  return absl::StrCat(path, ".rank-", dist_.rank);
}

// [Nothing to resume] --steps counts optimizer steps in all (a resumed run continues up to it), so
// a checkpoint at or past it leaves nothing to do: said plainly, with exit 0 (a job rerun after it
// finished is not a failure), and no model is built, nothing saved or exported.
absl::Status TrainSession::PrepareDevice() {
  RETURN_IF_ERROR(CheckDistributedFlags(config_, loop_, world_size_));
  ASSIGN_OR_RETURN(device_, ResolveDevice(config_.device));
  // One rank per GPU: LOCAL_RANK picks it unless --device names one.
  if (world_size_ > 1 && device_.is_cuda() && !device_.has_index()) {
    device_ = torch::Device(torch::kCUDA, static_cast<c10::DeviceIndex>(dist_.local_rank));
  }
  ConfigureAllocator(config_, device_);
  if (world_size_ > 1) {
    DistOptions dist = dist_;
    dist.backend = device_.is_cuda() ? DistBackend::kNccl : DistBackend::kGloo;
    if (device_.is_cuda()) dist.local_rank = device_.index();
    ASSIGN_OR_RETURN(group_, ProcessGroup::Join(dist));
    MEMPLAN_LOG(kInfo, "joined the process group")
        .Field("rank", group_->rank())
        .Field("world_size", group_->world_size())
        .Field("backend", std::string(DistBackendName(group_->backend())))
        .Field("device", device_.str());
  }
  if (at::get_num_threads() < cpu_threads_) {
    // torchrun sets OMP_NUM_THREADS=1 for every rank (one rank too); a rank's CPU share is
    // --cpu-threads (its torch CPU ops ran single-threaded: 3x slower steps measured on 2 H200s,
    // docs/benchmarks.md).
    at::set_num_threads(cpu_threads_);
  }
  return absl::OkStatus();
}

absl::Status TrainSession::BuildModel() {
  // [Sharded loading] A managed full fine-tune creates its parameters without values
  // (deferred_values: shapes only): the ChunkManager allocates what this rank stores and
  // FillShards() fills it from the checkpoint's byte ranges (or the initial values), so no rank
  // ever holds the whole model, on one rank or many. LoRA's frozen base loads the same way (its
  // adapters are drawn or loaded whole), a QLoRA base too, each rank quantizing the NF4 bytes it
  // stores ([Sharded NF4 loading], agent/train/nf4_shard_reader.h); an unmanaged run creates the
  // model on the device.
  sharded_load_ = plan_.managed;
  before_model_ = ReadHostMemory();
  if (plan_.managed) model_options_.param_device = torch::Device(torch::kCPU);
  model_options_.deferred_values = sharded_load_;
  const auto model_start = std::chrono::steady_clock::now();
  ASSIGN_OR_RETURN(model_, LlamaModel::Create(model_options_));
  // Drawing a large model's initial values (and, QLoRA, quantizing them) takes a while: said.
  MEMPLAN_LOG(kInfo, "model created")
      .Field("seconds",
             std::chrono::duration<double>(std::chrono::steady_clock::now() - model_start).count())
      .Field("deferred_values", model_options_.deferred_values)
      .Field("nf4_base", model_options_.lora.nf4_base);
  PrintDeviceMemory(device_, "after creating the model");
  return absl::OkStatus();
}

// [Speculative clipped updates] (agent/chunks/chunk_manager.h) for a managed run, from the
// layout it builds: its offloaded chunks (beyond the plan's n_persist) and their copies.
void TrainSession::ChooseSpeculation(const ChunkPacking& layout, TrainerOptions& options) const {
  SpeculativeClipRoom room;
  int32_t offloaded = 0;
  if (!config_.lora.enabled()) {
    for (int c = plan_.n_persist; c < layout.num_chunks(); ++c) {
      ++offloaded;
      room.backup_bytes +=
          SpeculationBackupBytes(optimizer_, DTypeBytes(dtype_), layout.chunks()[c].size_bytes);
    }
  }
  room.applies = offloaded > 0 && SpeculationApplies(config_.clip > 0, world_size_,
                                                     config_.grad_accum, config_.skip_nonfinite);
  room.pays = SpeculationPays(optimizer_);
  room.prediction_known = !loop_.address.empty();
  room.planned_host_bytes =
      answer_.prediction.host_pinned_bytes + answer_.prediction.host_pageable_bytes;
  room.local_ranks = std::max(1, dist_.local_world_size);
  room.host_memory_bytes = HostRamBytes();
  const SpeculativeClipChoice choice = ChooseSpeculativeClip(config_.speculative_clip, room);
  options.chunks.speculative_clip = choice.on;
  if (room.applies || config_.speculative_clip == SpeculativeClip::kOn) {
    MEMPLAN_LOG(kInfo, "speculative clipping")
        .Field("on", choice.on)
        .Field("reason", choice.reason);
  }
}

absl::Status TrainSession::BuildTrainer() {
  TrainerOptions& options = trainer_options_;
  options.grad_accum = config_.grad_accum;
  options.max_grad_norm = config_.clip;
  options.skip_nonfinite = config_.skip_nonfinite;
  options.optimizer = optimizer_;
  options.adamw.lr = config_.lr;
  options.adamw.weight_decay = config_.weight_decay;
  options.block_modes = plan_.block_modes;
  options.managed = plan_.managed;
  options.plain_reference = config_.plain;
  options.chunks.chunk_bytes = plan_.chunk_bytes;
  options.chunks.n_persist = plan_.n_persist;
  // --n-buffer 0 (every chunk persistent: CheckRunPlanKnobs below) streams nothing; the manager
  // still takes at least one buffer, which it does not allocate without offloaded chunks.
  options.chunks.n_buffer = std::max(1, plan_.n_buffer);
  options.chunks.host_memory = plan_.host_memory;
  options.chunks.shard_persistent_state = plan_.shard_persistent_state;
  options.chunks.shard_persistent_params = plan_.shard_persistent_params;
  options.chunks.accumulate_sharded_grads_on_device = config_.accumulate_offloaded_grads_on_device;
  options.chunks.cpu_threads = cpu_threads_;
  options.chunks.stochastic_rounding =
      optimizer_ == OptimizerKind::kAdamW8bit && config_.stochastic_rounding;
  options.chunks.rounding_seed = config_.seed;
  options.chunks.max_grad_copy_groups = config_.offload_in_flight;
  options.chunks.device_update_share = config_.device_update_share;
  options.offload.host_memory = plan_.host_memory;
  options.offload.max_in_flight_groups = config_.offload_in_flight;
  {
    // [Pinned copies by the plan's room] (agent/train/train_config.cc)
    PinnedActivationsRoom room;
    room.prediction_known = !loop_.address.empty();
    room.pinned_plan = plan_.host_memory == HostMemoryKind::kPinned;
    const Prediction& p = answer_.prediction;
    room.planned_host_bytes = p.host_pinned_bytes + p.host_pageable_bytes;
    room.pinned_activation_bytes = p.host_pinned_bytes - p.rank_memory.chunk_host_pinned_bytes;
    room.local_ranks = std::max(1, dist_.local_world_size);
    room.host_memory_bytes = HostRamBytes();
    const PinnedActivationsChoice pinned =
        ChoosePinnedActivations(config_.pinned_activations, room);
    options.offload.exact_pinned_host = pinned.exact;
    const bool copies = std::any_of(
        plan_.block_modes.begin(), plan_.block_modes.end(),
        [](BlockMode m) { return m == BlockMode::kSwap || m == BlockMode::kHsOffload; });
    if (device_.is_cuda() && copies && room.pinned_plan) {
      MEMPLAN_LOG(kInfo, "pinned activations")
          .Field("copies", pinned.exact ? "exact" : "caching")
          .Field("reason", pinned.reason);
    }
  }
  options.communicator = group_.get();
  // [OSFT resume without the SVD] (agent/model/osft.h): Run() has checked the checkpoint's split
  // against this run's; its factors fill the shaped ones in Resume().
  options.osft_factors_from_checkpoint =
      config_.osft.enabled() && !config_.resume_dir.empty() &&
      io::IsRegularFile(io::JoinPath(config_.resume_dir, io::kOsftFactorsFile));
  if (group_ != nullptr) options.chunks.coalesce_gathers = group_->options().coalesce_gathers;
  const std::string plan_source = loop_.address.empty()
                                      ? "--plan-file " + config_.plan_file
                                      : absl::StrCat("the planner's plan ", answer_.plan_id);
  if (plan_.managed) {
    // [Plan knobs are refused, never clamped] (train_config.h): the chunk manager would clamp an
    // n_persist beyond the layout and ignore n_buffer when every chunk is persistent.
    ASSIGN_OR_RETURN(const ChunkPacking layout,
                     ChunkManager::LayoutOf(model_->ParamGroups(), options.chunks));
    RETURN_IF_ERROR(CheckRunPlanKnobs(plan_, layout.num_chunks(), plan_source));
    ChooseSpeculation(layout, options);
  }
  // The plan's n_persist counts chunks of the layout it was made for: a plan made for another
  // layout ([Layout fingerprint], common/chunk_packing.h) is refused before anything is allocated.
  if (file_plan_.has_value() && plan_.managed) {
    const std::string& source = plan_source;
    if (config_.chunk_bytes.has_value() && *config_.chunk_bytes != file_plan_->chunk_bytes) {
      MEMPLAN_LOG(kWarning, "plan layout not checked")
          .Field("reason", absl::StrCat("--chunk-mib replaces the chunk size of ", source,
                                        ", whose n_chunks and n_persist refer to ",
                                        file_plan_->chunk_bytes, "-byte chunks"));
    } else {
      ASSIGN_OR_RETURN(const ChunkPacking layout,
                       ChunkManager::LayoutOf(model_->ParamGroups(), options.chunks));
      std::string warning;
      RETURN_IF_ERROR(CheckPlanLayout(*file_plan_, source, layout.num_chunks(),
                                      layout.fingerprint(), &warning));
      if (!warning.empty()) {
        MEMPLAN_LOG(kWarning, "plan layout not checked").Field("reason", warning);
      } else {
        MEMPLAN_LOG(kInfo, "plan layout matches")
            .Field("n_chunks", layout.num_chunks())
            .Field("layout_fingerprint", layout.fingerprint());
      }
    }
  }
  if (!config_.memory_timeline.empty()) {
    probe_ = MemoryProbe::Create(device_);
    timeline_ = std::make_unique<MemoryTimeline>(probe_.get());
    options.observer = timeline_.get();
  }
  ASSIGN_OR_RETURN(trainer_, Trainer::Create(model_.get(), options));
  if (model_->has_osft()) {
    const LlamaModel::OsftFactorOrigin& made = model_->osft_factor_origin();
    MEMPLAN_LOG(kInfo, "osft factors")
        .Field("source", made.svd_splits > 0 ? "svd" : "checkpoint")
        .Field("svd_splits", made.svd_splits)
        .Field("shaped_for_checkpoint", made.shaped)
        .Field("seconds", made.seconds);
  }
  if (timeline_ != nullptr && trainer_->chunk_manager() != nullptr) {
    // The timeline's cpu_updates_started column: the CPU optimizer's overlap with backward.
    ChunkManager* chunks = trainer_->chunk_manager();
    timeline_->SetCpuUpdateCounter([chunks] { return chunks->UpdatesStartedBeforeStep(); });
  }
  return absl::OkStatus();
}

absl::Status TrainSession::Resume() {
  ASSIGN_OR_RETURN(tokens_, OpenData(config_, spec_, world_size_));
  io::TokenBatcherOptions batcher_options;
  batcher_options.seed = config_.seed;
  batcher_options.batch_size = config_.batch;
  batcher_options.seq_len = config_.seq;
  // Each rank reads its own rows of every global batch (world_size x --batch rows).
  batcher_options.rank = dist_.rank;
  batcher_options.world_size = world_size_;
  ASSIGN_OR_RETURN(batcher_, io::TokenBatcher::Create(tokens_, batcher_options));
  ASSIGN_OR_RETURN(vl_batcher_, OpenVlData(config_, spec_, dist_.rank, world_size_));
  if (config_.resume_dir.empty()) return absl::OkStatus();
  if (config_.lora.enabled() != io::IsLoraCheckpoint(config_.resume_dir)) {
    return absl::FailedPreconditionError(
        absl::StrCat("--resume ", config_.resume_dir,
                     config_.lora.enabled() ? " is not a LoRA checkpoint (no adapter_config.json)"
                                            : " is a LoRA checkpoint: resume it with --lora-rank "
                                              "and --lora-targets"));
  }
  if (!config_.lora.enabled() && trainer_->chunk_manager() != nullptr &&
      io::IsPerRankCheckpoint(config_.resume_dir)) {
    // [Per-rank checkpoints]: each rank reads only the ranges it stores.
    ASSIGN_OR_RETURN(std::unique_ptr<io::CheckpointPieces> pieces,
                     io::CheckpointPieces::Open(config_.resume_dir));
    RETURN_IF_ERROR(trainer_->RestoreFromPieces(*pieces));
    data_position_ = pieces->trainer().data_position;
  } else {
    ASSIGN_OR_RETURN(io::Checkpoint saved, config_.lora.enabled()
                                               ? io::LoadLoraCheckpoint(config_.resume_dir)
                                               : io::LoadCheckpoint(config_.resume_dir));
    RETURN_IF_ERROR(trainer_->RestoreCheckpoint(saved));
    data_position_ = saved.trainer.data_position;
  }
  MEMPLAN_LOG(kInfo, "resumed")
      .Field("dir", config_.resume_dir)
      .Field("step", trainer_->step())
      .Field("data_position", data_position_);
  return absl::OkStatus();
}

absl::Status TrainSession::Save() {
  io::TrainerState state;
  state.data_position = data_position_;
  state.data_seed = config_.seed;
  state.rng_seed = config_.seed;
  state.workload.micro_batch = config_.batch;
  state.workload.seq_len = config_.seq;
  state.workload.grad_accum = config_.grad_accum;
  state.workload.world_size = world_size_;
  return LoggedWrite("checkpoint", config_.save_dir, trainer_->step(), [&]() -> absl::Status {
    RETURN_IF_ERROR(trainer_->SaveCheckpoint(config_.save_dir, state));
    // The checkpoint replaced the directory: the tokenizer goes in again ([Model side files]).
    return lead_ ? CopyModelSideFiles(config_.save_dir) : absl::OkStatus();
  });
}

// [Model side files] A --model run's checkpoints and exports carry the source's tokenizer files
// and generation_config.json (agent/io/model_files.h), so they load and generate like it.
absl::Status TrainSession::CopyModelSideFiles(const std::string& dir) {
  if (config_.model_dir.empty()) return absl::OkStatus();
  ASSIGN_OR_RETURN(const std::vector<std::string> copied,
                   io::CopyModelSideFiles(config_.model_dir, dir));
  if (!copied.empty()) {
    MEMPLAN_LOG(kInfo, "copied model files")
        .Field("from", config_.model_dir)
        .Field("dir", dir)
        .Field("files", absl::StrJoin(copied, ","));
  }
  return absl::OkStatus();
}

absl::Status TrainSession::StartLiveMetrics() {
  if (config_.metrics_address.empty()) return absl::OkStatus();
  absl::StatusOr<std::unique_ptr<AgentMetrics>> started =
      AgentMetrics::Start(config_.metrics_address);
  if (!started.ok()) {
    return absl::Status(started.status().code(),
                        absl::StrCat("--metrics: ", started.status().message()));
  }
  live_ = *std::move(started);
  const size_t colon = config_.metrics_address.rfind(':');
  std::printf("metrics on %s:%d\n", config_.metrics_address.substr(0, colon).c_str(),
              live_->port());
  live_->SetPlan({answer_.plan_id, answer_.prediction.peak_bytes,
                  answer_.prediction.iteration_seconds, answer_.prediction.tokens_per_second});
  return absl::OkStatus();
}

absl::Status TrainSession::Loop() {
  // Everything before the first step (model creation, checkpoint loading, chunk packing).
  load_reserved_ = ReadAllocatorPeaks(device_).reserved_bytes;
  RETURN_IF_ERROR(StartLiveMetrics());
  RETURN_IF_ERROR(OpenEvalData());
  // --steps is the total number of optimizer steps, a resumed run continues up to it.
  while (trainer_->step() < config_.steps) {
    ASSIGN_OR_RETURN(stop_signal_, AgreedStopSignal());
    if (stop_signal_ != 0) return absl::OkStatus();
    // [Learning-rate schedule] from the step number, so a resumed run continues the curve.
    lr_ = config_.lr * LearningRateFactor(config_.lr_schedule, trainer_->step(), config_.steps);
    RETURN_IF_ERROR(trainer_->SetLearningRate(lr_));
    // Every step is recorded (a TSV row per group hook).
    if (timeline_ != nullptr) timeline_->BeginStep(trainer_->step() + 1);
    std::vector<MicroBatch> micro_batches;
    for (int i = 0; i < config_.grad_accum; ++i) {
      ASSIGN_OR_RETURN(MicroBatch batch, vl_batcher_ != nullptr
                                             ? NextVlBatch(*vl_batcher_, data_position_++)
                                             : NextBatch(*batcher_, data_position_++));
      micro_batches.push_back(std::move(batch));
    }
    if (config_.lora.dropout > 0) {
      // LoRA dropout draws from the default generators: seeding them from (--seed, step) makes
      // the masks a function of the step, so a resumed run draws what the straight run drew.
      torch::manual_seed(config_.seed * 0x9E3779B97F4A7C15ull +
                         static_cast<uint64_t>(trainer_->step()));
    }
    std::unique_ptr<KernelTrace> kernel_trace;
    if (!config_.kernel_trace.empty() && trainer_->step() + 1 == config_.kernel_trace_step) {
      ASSIGN_OR_RETURN(kernel_trace, KernelTrace::Start(device_.is_cuda()));
    }
    absl::StatusOr<StepStats> step;
    try {
      step = trainer_->Step(micro_batches);
    } catch (const c10::OutOfMemoryError& e) {  // the trainer converts, but be sure
      step = absl::ResourceExhaustedError(e.what_without_backtrace());
    }
    if (kernel_trace != nullptr) {
      // The step's deferred CPU updates may still run: the trace ends where the step returns.
      if (device_.is_cuda()) torch::cuda::synchronize();
      RETURN_IF_ERROR(kernel_trace->StopAndSave(RankPath(config_.kernel_trace)));
      MEMPLAN_LOG(kInfo, "kernel trace written")
          .Field("file", RankPath(config_.kernel_trace))
          .Field("step", config_.kernel_trace_step);
    }
    if (timeline_ != nullptr) timeline_->EndStep();
    if (!step.ok() && IsOutOfMemory(step.status())) return StopOnOutOfMemory(step.status());
    if (!step.ok()) return step.status();
    StepStats& stats = *step;
    ObserveStep(stats);
    if (eval_batcher_ != nullptr &&
        (stats.step == config_.steps ||
         (config_.eval_every > 0 && stats.step % config_.eval_every == 0))) {
      RETURN_IF_ERROR(Evaluate());
    }
    if (!config_.save_dir.empty() && config_.save_every > 0 &&
        stats.step % config_.save_every == 0) {
      RETURN_IF_ERROR(Save());
    }
  }
  return absl::OkStatus();
}

// Several ranks stop together: each step starts with one all-reduce of the flag, so no rank
// enters the save while another enters the next step's collectives.
absl::StatusOr<int> TrainSession::AgreedStopSignal() {
  const int mine = stop_signal.load(std::memory_order_relaxed);
  if (group_ == nullptr) return mine;
  torch::Tensor flag = torch::full({1}, mine, torch::TensorOptions().dtype(torch::kFloat32))
                           .to(group_->device());
  RETURN_IF_ERROR(group_->AllReduceSum(flag)->Wait());
  if (flag.item<float>() == 0) return 0;
  return mine != 0 ? mine : SIGTERM;  // a rank that got none stops for the others
}

// [Stopping on a signal] The run ends between steps: the last step's checkpoint (unless
// --save-every just wrote it), no end-of-training exports, and the line that says how to go on.
absl::Status TrainSession::StopAfterSignal() {
  const int64_t step = trainer_->step();
  std::string saved = "nothing saved (no --save)";
  if (!config_.save_dir.empty()) {
    if (config_.save_every == 0 || step % config_.save_every != 0) RETURN_IF_ERROR(Save());
    saved = absl::StrCat("checkpoint of step ", step, " in ", config_.save_dir,
                         " (continue with --resume ", config_.save_dir, ")");
  }
  if (lead_) {
    MEMPLAN_LOG(kWarning, "stopped by signal")
        .Field("signal", SignalName(stop_signal_))
        .Field("step", step)
        .Field("steps", config_.steps)
        .Field("saved", config_.save_dir.empty() ? std::string() : config_.save_dir);
    std::printf("stopped by %s after step %lld of %lld: %s\n", SignalName(stop_signal_),
                static_cast<long long>(step), static_cast<long long>(config_.steps),
                saved.c_str());
    std::fflush(stdout);
  }
  return absl::OkStatus();
}

absl::Status TrainSession::OpenEvalData() {
  if (config_.eval_tokens_file.empty()) return absl::OkStatus();
  if (world_size_ > 1) {
    return absl::UnimplementedError(absl::StrCat(
        "--eval-tokens is not supported with world size ", world_size_, " (WORLD_SIZE) yet"));
  }
  TrainConfig eval = config_;
  eval.data_file = config_.eval_tokens_file;
  absl::StatusOr<std::shared_ptr<const io::TokenFile>> file = OpenData(eval, spec_, 1);
  if (!file.ok()) {
    return absl::Status(file.status().code(), absl::StrCat("--eval-tokens ",
                                                           config_.eval_tokens_file, ": ",
                                                           file.status().message()));
  }
  eval_tokens_ = *std::move(file);
  // The training batcher's options: with the training file as --eval-tokens, evaluation batch k
  // is training micro-batch k (what the tests compare).
  io::TokenBatcherOptions options = batcher_->options();
  options.rank = 0;
  options.world_size = 1;
  ASSIGN_OR_RETURN(eval_batcher_, io::TokenBatcher::Create(eval_tokens_, options));
  return absl::OkStatus();
}

// The held-out loss: the first --eval-batches micro-batches of --eval-tokens, forward only, the
// mean of their losses.
absl::Status TrainSession::Evaluate() {
  const auto start = std::chrono::steady_clock::now();
  double sum = 0;
  for (int64_t k = 0; k < config_.eval_batches; ++k) {
    ASSIGN_OR_RETURN(MicroBatch batch, NextBatch(*eval_batcher_, k));
    ASSIGN_OR_RETURN(const double loss, trainer_->EvalLoss(batch));
    sum += loss;
  }
  const double mean = sum / static_cast<double>(config_.eval_batches);
  MEMPLAN_LOG(kInfo, "eval loss")
      .Field("step", trainer_->step())
      .Field("loss", mean)
      .Field("batches", config_.eval_batches)
      .Field("tokens", config_.eval_batches * config_.batch * config_.seq)
      .Field("seconds",
             std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  return absl::OkStatus();
}

// The step's OOM is reported to the planner (a plan that does not fit is what calibration needs
// most) with the largest peaks seen: the allocator's, the steps' before it and the timeline's.
absl::Status TrainSession::StopOnOutOfMemory(const absl::Status& step_status) {
  Measurement m;
  m.plan_id = answer_.plan_id;
  m.oom = true;
  const AllocatorPeaks peaks = ReadAllocatorPeaks(device_);
  m.peak_allocated_bytes = std::max(peaks.allocated_bytes, peak_allocated_);
  m.peak_reserved_bytes = std::max(peaks.reserved_bytes, peak_reserved_);
  if (timeline_ != nullptr) {
    m.peak_allocated_bytes = std::max(m.peak_allocated_bytes, timeline_->StepPeakAllocated());
    m.peak_reserved_bytes = std::max(m.peak_reserved_bytes, timeline_->StepPeakReserved());
  }
  m.peak_device_bytes = DeviceUsedBytes(device_);
  m.load_peak_bytes = load_reserved_;
  m.note = absl::StrCat("out of memory in step ", trainer_->step() + 1);
  MEMPLAN_LOG(kError, "out of memory")
      .Field("step", trainer_->step() + 1)
      .Field("peak_reserved_bytes", m.peak_reserved_bytes);
  if (client_ != nullptr && lead_) {
    const absl::Status reported = ReportToPlanner(*client_, answer_, m);
    if (!reported.ok()) std::printf("report failed: %s\n", reported.ToString().c_str());
  }
  return absl::ResourceExhaustedError(
      absl::StrCat("out of memory in step ", trainer_->step() + 1,
                   " (oom=true); the plan does not fit this device: ", step_status.message()));
}

void TrainSession::ObserveStep(StepStats& stats) {
  if (stats.skipped && lead_) {
    MEMPLAN_LOG(kWarning, "step skipped: non-finite")
        .Field("step", stats.step)
        .Field("what", stats.nonfinite);
  }
  if (timeline_ != nullptr && device_.is_cuda()) {
    // The timeline resets the allocator's peak at every hook; its own maxima are the step's.
    stats.peak_allocated_bytes = timeline_->StepPeakAllocated();
    stats.peak_reserved_bytes = timeline_->StepPeakReserved();
  }
  const int64_t device_used = DeviceUsedBytes(device_);
  peak_allocated_ = std::max(peak_allocated_, stats.peak_allocated_bytes);
  peak_reserved_ = std::max(peak_reserved_, stats.peak_reserved_bytes);
  // The step under --kernel-trace runs slower (the profiler's own work): it is left out of the
  // steady figures (and of what is reported to the planner) when the run has other steps after
  // the first.
  const bool traced = !config_.kernel_trace.empty() &&
                      stats.step == config_.kernel_trace_step && config_.steps > 2;
  // The first step warms up allocators and kernels.
  if ((stats.step > 1 || config_.steps == 1) && !traced) {
    tokens_per_second_sum_ += stats.tokens_per_second;
    seconds_sum_ += stats.seconds;
    steady_allocated_ = std::max(steady_allocated_, stats.peak_allocated_bytes);
    steady_reserved_ = std::max(steady_reserved_, stats.peak_reserved_bytes);
    steady_device_ = std::max(steady_device_, device_used);
    ++timed_steps_;
  }
  if (live_ != nullptr) {
    AgentStepSample sample;
    sample.seconds = stats.seconds;
    sample.tokens_per_second = stats.tokens_per_second;
    sample.loss = stats.loss;
    sample.step = stats.step;
    if (device_.is_cuda()) {
      const AllocatorStats now = ReadAllocatorStats(device_);
      sample.allocated_bytes = now.allocated.current;
      sample.reserved_bytes = now.reserved.current;
    }
    sample.peak_allocated_bytes = stats.peak_allocated_bytes;
    sample.peak_reserved_bytes = stats.peak_reserved_bytes;
    if (ChunkManager* chunks = trainer_->chunk_manager(); chunks != nullptr) {
      // LoRA: the frozen base's uploads (or gathers) are most of the traffic.
      ChunkManager* base = trainer_->base_chunk_manager();
      const int64_t total =
          chunks->UploadStats().bytes + (base != nullptr ? base->UploadStats().bytes : 0);
      sample.chunk_upload_bytes = total - uploaded_bytes_;
      uploaded_bytes_ = total;
    }
    live_->ObserveStep(sample);
  }
  if (stats.step == 1 && world_size_ > 1 && trainer_->chunk_manager() != nullptr) {
    // [Collective timing] the gathers' figures PrintRankFigures() prints leave out the first step
    // (the communicator's connections are set up by its first collectives).
    trainer_->chunk_manager()->ResetUploadStats();
    if (ChunkManager* base = trainer_->base_chunk_manager(); base != nullptr) {
      base->ResetUploadStats();
    }
    uploaded_bytes_ = 0;
  }
  if (lead_ && (stats.step % config_.log_every == 0 || stats.step == config_.steps)) {
    // The loss is the global batch's (all-reduced); tokens/s counts every rank's tokens (the
    // ranks step together), peaks are rank 0's.
    // The estimate uses the steady steps' mean time once there is one (the first step warms up).
    const double mean_seconds =
        timed_steps_ > 0 ? seconds_sum_ / static_cast<double>(timed_steps_) : stats.seconds;
    const double eta_seconds =
        mean_seconds * static_cast<double>(std::max<int64_t>(0, config_.steps - stats.step));
    MEMPLAN_LOG(kInfo, "step")
        .Field("step", StepOfSteps{stats.step, config_.steps})
        .Field("eta", DurationText(eta_seconds))
        .Field("eta_seconds", eta_seconds)
        .Field("loss", stats.loss)
        .Field("lr", lr_)
        .Field("grad_norm", stats.grad_norm)
        .Field("seconds", stats.seconds)
        .Field("fb_seconds", stats.forward_backward_seconds)
        .Field("opt_seconds", stats.optimizer_seconds)
        .Field("tokens_per_second", stats.tokens_per_second * world_size_)
        .Field("peak_allocated_bytes", stats.peak_allocated_bytes)
        .Field("peak_reserved_bytes", stats.peak_reserved_bytes)
        .Field("cpu_updates_in_backward", stats.offloaded_updates_in_backward)
        .Field("cpu_accumulate_seconds", stats.cpu_accumulate_seconds)
        .Field("cpu_update_seconds", stats.cpu_update_seconds)
        .Field("cpu_update_params_per_second",
               stats.cpu_update_seconds > 0
                   ? static_cast<double>(stats.cpu_updated_params) / stats.cpu_update_seconds
                   : 0.0);
  }
}

absl::Status TrainSession::Finish() {
  if (timeline_ != nullptr) {
    timeline_written_ = true;
    RETURN_IF_ERROR(timeline_->WriteTsv(TimelinePath()));
    std::printf("memory timeline of steps 1-%lld: %s (%zu events)\n",
                static_cast<long long>(trainer_->step()), TimelinePath().c_str(),
                timeline_->events().size());
    if (device_.is_cuda()) {
      for (absl::string_view line :
           absl::StrSplit(SegmentsByStream(device_), '\n', absl::SkipEmpty())) {
        std::printf("allocator pool %.*s\n", static_cast<int>(line.size()), line.data());
      }
    }
  }
  if (device_.is_cuda()) {
    const AllocatorCounters counters = ReadAllocatorCounters(device_);
    std::printf(
        "allocator retries %lld (cached blocks freed to satisfy an allocation), "
        "device allocations %lld\n",
        static_cast<long long>(counters.alloc_retries),
        static_cast<long long>(counters.device_allocations));
  }
  if (!config_.save_dir.empty() &&
      (config_.save_every == 0 || trainer_->step() % config_.save_every != 0)) {
    RETURN_IF_ERROR(Save());
  }
  // Params() and BaseParams() gather the ranks' shards (collectives): every rank reads them,
  // rank 0 alone writes.
  if (!config_.save_adapter_dir.empty()) {
    const std::vector<NamedParam> adapters = trainer_->Params();
    if (lead_) {
      RETURN_IF_ERROR(LoggedWrite(
          "adapter", config_.save_adapter_dir, trainer_->step(), [&]() -> absl::Status {
            RETURN_IF_ERROR(io::SavePeftAdapter(config_.save_adapter_dir, config_.lora,
                                                !config_.model_dir.empty()   ? config_.model_dir
                                                : !config_.arch_file.empty() ? config_.arch_file
                                                                             : config_.arch,
                                                adapters, spec_.IsVisionLanguage()));
            return CopyModelSideFiles(config_.save_adapter_dir);
          }));
    }
  }
  if (!config_.merge_export_dir.empty()) {
    std::vector<NamedParam> base_values = trainer_->BaseParams();
    const std::vector<NamedParam> adapters = trainer_->Params();
    if (lead_) {
      // [QLoRA] merged into the dequantized weights (what the adapters were trained against).
      ASSIGN_OR_RETURN(const std::vector<NamedParam> base,
                       model_->DequantizedBase(base_values));
      ASSIGN_OR_RETURN(std::vector<NamedParam> merged,
                       io::MergeLora(base, adapters, config_.lora));
      io::TrainerState state;
      state.step = trainer_->step();
      state.model = spec_;
      state.param_dtype = dtype_;
      RETURN_IF_ERROR(
          LoggedWrite("merged export", config_.merge_export_dir, trainer_->step(), [&] {
            RETURN_IF_ERROR(io::SaveCheckpoint(config_.merge_export_dir, state, merged, {}));
            return CopyModelSideFiles(config_.merge_export_dir);
          }));
    }
  }
  if (world_size_ > 1) RETURN_IF_ERROR(PrintRankFigures());
  if (!lead_) return absl::OkStatus();
  return Summarize();
}

}  // namespace memplan
