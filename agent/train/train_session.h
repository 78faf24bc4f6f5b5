// TrainSession: one run of `memplan-agent train`, from flags to the last checkpoint. The stages
// build on each other in a fixed order — the device and the process group, the plan (flags, plan
// file or planner), the model, its weights, the Trainer, the resume point, the steps, and what is
// written and reported at the end — and each stage is one method. The CLI parses the flags and
// calls Run(); the lines the run prints and logs are its interface to scripts and tests.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "agent/client/plan_answer.h"
#include "agent/client/planner_flags.h"
#include "agent/client/record_json.h"
#include "agent/core/torch_pch.h"
#include "agent/dist/dist_options.h"
#include "agent/io/hf_checkpoint.h"
#include "agent/model/llama_model.h"
#include "agent/profiler/device_memory.h"
#include "agent/train/train_config.h"
#include "agent/train/trainer.h"
#include "common/chunk_packing.h"

namespace memplan {

class AgentMetrics;
class MemoryProbe;
class MemoryTimeline;
class PlannerClient;
class ProcessGroup;
namespace io {
class TokenBatcher;
class TokenFile;
class VlBatcher;
}  // namespace io

// [LoRA resume settings] With --resume of a LoRA checkpoint, the rank, alpha, targets and dropout
// the flags leave out are taken from its adapter_config.json (a contradicting flag is an error);
// then the LoRA flag combination is checked (AdoptCheckpointLora, train_config.h). Call after
// ParseTrainArgs, before the session is made.
absl::Status AdoptResumedLora(TrainConfig* config);

// Owns everything one run builds: the process group (world size > 1), the planner client (with
// --planner), the model, the Hugging Face checkpoint it loads from, the memory timeline, the
// Trainer, the data stream and the live metrics server; all are released when the session is.
// Promises: with loop.address set the plan comes from the planner (a plan file or plan flags are
// refused) and the steady-state measurement, or an OOM, is reported back; with dist.world_size > 1
// this process is one rank (its own rows of every global batch, chunks sharded over the ranks),
// and only rank 0 logs steps and talks to the planner. Not thread-safe: one session per process,
// driven from the main thread.
class TrainSession {
 public:
  TrainSession(TrainConfig config, PlannerLoopOptions loop, DistOptions dist);
  ~TrainSession();
  TrainSession(const TrainSession&) = delete;
  TrainSession& operator=(const TrainSession&) = delete;

  // Runs every stage once, in order; the first failure ends the run with its status
  // (RESOURCE_EXHAUSTED "out of memory in step N (oom=true) ..." after a CUDA OOM). Call once.
  // [Stopping on a signal] SIGTERM or SIGINT during the steps ends the run after the step in
  // flight: the checkpoint is written (with --save), Run() returns OK and stopped_by_signal()
  // names the signal. Run() installs the handlers itself and restores the previous ones.
  absl::Status Run();
  // The signal that ended Run() early; 0 when it ran to --steps (or failed).
  int stopped_by_signal() const { return stop_signal_; }

 private:
  // Whether --resume's checkpoint is already at --steps ([Nothing to resume]); said when it is.
  absl::StatusOr<bool> ResumeIsComplete();
  // The stages, in Run()'s order. Each uses only what the ones before it built.
  absl::Status PrepareDevice();  // the device, its allocator, the process group, CPU threads
  absl::Status ResolvePlan();    // optimizer, dtype, model spec, plan, memory limit
  absl::Status BuildModel();     // the model, shapes only for a sharded load
  absl::Status LoadWeights();    // the checkpoint (whole, or matched for the sharded load), adapter
  absl::Status BuildTrainer();   // layout checks against the plan, the timeline, the Trainer
  // [Speculative clipped updates]: --speculative-clip against the managed run's layout.
  void ChooseSpeculation(const ChunkPacking& layout, TrainerOptions& options) const;
  absl::Status FillShards();     // [Sharded loading]: this rank's ranges of every parameter
  void ReportApplied();          // the load peak, `plan applied`, chunk bytes against the plan
  absl::Status Resume();         // the data stream and, with --resume, the checkpoint's state
  absl::Status Loop();           // the steps up to --steps, periodic saves
  absl::Status Finish();         // the timeline, the last save, adapter and merged exports

  // Pieces of the stages.
  absl::Status ReadPlanFile();
  absl::Status ResolveModelSpec();
  absl::Status PlanFromPlanner();
  absl::StatusOr<PlanQuery> PlannerQuery() const;
  absl::Status StartLiveMetrics();
  absl::Status StopOnOutOfMemory(const absl::Status& step_status);
  void ObserveStep(StepStats& stats);
  absl::Status Save();
  absl::Status CopyModelSideFiles(const std::string& dir);  // [Model side files]
  absl::StatusOr<int> AgreedStopSignal();  // the signal that stops the run (0: none), every rank's
  absl::Status StopAfterSignal();
  absl::Status OpenEvalData();
  absl::Status Evaluate();
  absl::Status PrintRankFigures();
  absl::Status Summarize();
  void WriteTimelineOnExit();

  // --memory-timeline FILE: rank 0 writes FILE, rank R > 0 of several writes FILE.rank-R.
  std::string TimelinePath() const;
  // `path` for rank 0, `path`.rank-R for rank R > 0.
  std::string RankPath(const std::string& path) const;

  const TrainConfig config_;
  const PlannerLoopOptions loop_;
  const DistOptions dist_;
  const int world_size_;
  const bool lead_;  // rank 0: logs steps and talks to the planner
  // --cpu-threads, or this rank's share of the host's hardware threads ([Shared host CPU] in
  // planner/cost/cost_model.cc: what the planner's CPU pass rates assume).
  const int cpu_threads_;

  torch::Device device_ = torch::kCPU;  // PrepareDevice()
  // ResolvePlan().
  PlanFile plan_file_;  // --plan-file's contents (none read: empty)
  OptimizerKind optimizer_ = OptimizerKind::kAdamW;
  DType dtype_ = DType::kFloat32;
  ModelSpec spec_;
  LlamaModelOptions model_options_;
  std::optional<ResidencyPlan> file_plan_;  // the plan file's or the planner's plan
  PlanAnswer answer_;                       // the planner's answer (--planner)
  RunPlan plan_;
  TrainerOptions trainer_options_;

  // Declared in the order they are built, so they are destroyed in reverse: the Trainer before
  // the timeline it reports to, the model it trains and the process group it talks through.
  std::unique_ptr<ProcessGroup> group_;
  std::unique_ptr<PlannerClient> client_;
  std::unique_ptr<LlamaModel> model_;
  bool sharded_load_ = false;
  HostMemory before_model_;
  std::unique_ptr<io::HfCheckpoint> checkpoint_;
  io::HfCheckpoint::Matched matched_;
  std::unique_ptr<MemoryProbe> probe_;
  std::unique_ptr<MemoryTimeline> timeline_;
  bool timeline_written_ = false;
  std::unique_ptr<Trainer> trainer_;
  std::shared_ptr<const io::TokenFile> tokens_;
  std::unique_ptr<io::TokenBatcher> batcher_;
  std::unique_ptr<io::VlBatcher> vl_batcher_;  // a vision-language model's images and text
  int64_t data_position_ = 0;
  std::shared_ptr<const io::TokenFile> eval_tokens_;  // --eval-tokens
  std::unique_ptr<io::TokenBatcher> eval_batcher_;
  double lr_ = 0;        // the learning rate of the step in flight ([Learning-rate schedule])
  int stop_signal_ = 0;  // [Stopping on a signal]: the signal that ended the loop early
  std::unique_ptr<AgentMetrics> live_;  // --metrics: the plan's prediction next to every step

  // What the steps measured. Steady state is every step after the warm-up one (what the planner
  // predicts); load is everything before the first step.
  double tokens_per_second_sum_ = 0;
  double seconds_sum_ = 0;
  int64_t timed_steps_ = 0;
  int64_t peak_allocated_ = 0, peak_reserved_ = 0;
  int64_t steady_allocated_ = 0, steady_reserved_ = 0, steady_device_ = 0;
  int64_t load_reserved_ = 0;
  int64_t uploaded_bytes_ = 0;  // chunk upload bytes already published to live_
};

}  // namespace memplan
