// Command-line parsing of the `memplan` CLI: argv -> CliInvocation, with no I/O, no gRPC and no
// protobuf, so every flag rule is unit-tested. Errors are INVALID_ARGUMENT and name the flag; the
// binary turns them into exit status 2. Thread-compatible (pure functions over values).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/channel_security.h"
#include "common/types.h"

namespace memplan::cli {

enum class Command {
  kNone,  // no subcommand: print the top-level help
  kPlan,
  kTraceSubmit,
  kTraceGet,
  kHardwareSubmit,
  kHardwareList,
  kHardwareGet,
  kMeasure,
  kCalibration,
  kPlansList,
  kPlansGet,
  kPresets,
  kAdmit,
  kEnv,  // the environment report (env_report.h)
};

// Flags every subcommand accepts, before or after the subcommand words.
struct GlobalOptions {
  // Where the planner daemon listens. Without --planner, plan, admit and presets answer
  // in-process (AnswersInProcess) and the other commands call this default.
  std::string planner_address = "127.0.0.1:50051";
  bool planner_given = false;  // --planner was given
  // --db: the planner database an in-process answer reads; unset: ./memplan-planner.db when it
  // exists (memplan-planner's default --db).
  std::optional<std::string> db_path;
  bool json = false;
  double timeout_seconds = 30;      // per RPC deadline
  ChannelSecurityOptions security;  // --tls-ca, --tls-cert, --tls-key, --auth-token-file, ...
};

struct PlanOptions {
  // The model: exactly one of these three.
  std::string arch_preset;
  std::string arch_file;  // Hugging Face config.json (or a directory holding one)
  std::string trace_id;
  // The hardware: exactly one of these two.
  std::string gpu_preset;
  std::string hardware_id;

  // Unset workload fields and dtype take the defaults of PlanWorkload / kDefaultDType, except
  // with --trace-id, where unset means "the trace's" (a profiled trace fixes its workload).
  std::optional<int64_t> micro_batch;
  std::optional<int64_t> seq_len;
  std::optional<int32_t> world_size;
  // --gpus-per-node (alias --local-world-size): ranks per node sharing its RAM; unset =
  // world_size.
  std::optional<int32_t> local_world_size;
  // --host-memory-gib: the node's RAM in place of the hardware's; unset = the hardware's.
  std::optional<int64_t> host_memory_bytes;
  std::optional<int32_t> grad_accum;
  bool grad_clipping = false;  // --grad-clipping
  // A vision-language model's images: --images-per-sample N with --image-size HEIGHTxWIDTH
  // (pixels); both or neither.
  std::optional<int32_t> images_per_sample;
  int64_t image_height = 0;
  int64_t image_width = 0;
  bool vision_checkpoint = false;  // --vision-checkpoint: needs --images-per-sample
  std::optional<DType> param_dtype;
  std::string optimizer = "adamw";
  TrainingMethod training;              // kFull unless --lora-rank (kQlora with --qlora)
  bool qlora = false;                   // --qlora: LoRA on a 4-bit NF4 base
  std::optional<double> safety_margin;  // unset: the planner's default
  FixedKnobs fixed;
  std::optional<int32_t> max_alternatives;
  bool skip_limits = false;
};

// One --pool NAME=HARDWARE[:GPUS] of `admit`.
struct PoolOption {
  std::string name;
  std::string hardware_preset;  // HARDWARE a preset name
  std::string hardware_id;      // HARDWARE "profile/ID": a stored hardware profile
  int32_t gpus = 1;
};

struct MeasureOptions {
  Measurement measurement;  // plan_id required; sizes in bytes
};

struct CalibrationOptions {
  std::string hardware_name;         // empty: all
  std::optional<DType> param_dtype;  // unset: all
  std::string model_family;          // empty: all
};

struct PlansListOptions {
  int32_t page_size = 0;  // 0: the planner's default
  std::string page_token;
  bool all_pages = false;
};

enum class PresetsFilter { kAll, kModels, kHardware };

// One parsed command line. Only the options of `command` are meaningful.
struct CliInvocation {
  Command command = Command::kNone;
  GlobalOptions global;
  // Set when --help/-h was given (or no subcommand): print it to stdout and exit 0.
  std::optional<std::string> help_text;

  PlanOptions plan;               // plan; admit: the job (no hardware)
  std::vector<PoolOption> pools;  // admit
  std::string id;                 // trace get / hardware get / plans get
  std::string file_path;          // trace submit / hardware submit: a proto-JSON file, "-" = stdin
  MeasureOptions measure;
  CalibrationOptions calibration;
  PlansListOptions plans_list;
  PresetsFilter presets = PresetsFilter::kAll;
};

inline constexpr int64_t kDefaultMicroBatch = 1;
inline constexpr int64_t kDefaultSeqLen = 4096;
inline constexpr DType kDefaultDType = DType::kBFloat16;

// The workload of `plan`, defaults filled in (batch 1, seq 4096, world 1, grad-accum 1).
Workload PlanWorkload(const PlanOptions& options);
// Whether any of --batch, --seq, --world-size, --grad-accum was given.
bool HasWorkloadFlags(const PlanOptions& options);

// Parses argv[1..] (program name excluded).
absl::StatusOr<CliInvocation> ParseCommandLine(const std::vector<std::string>& args);

// Whether `inv` is answered by a planner inside this process: plan, admit, presets and hardware
// list without --planner (nor --tls-ca or --auth-token-file, which ask for a connection to the
// default address). The other commands need a daemon's stored state.
bool AnswersInProcess(const CliInvocation& inv);

// Usage text of a subcommand (kNone: the overview listing every subcommand).
std::string HelpText(Command command);

// "70GiB", "512MiB", "1.5GB", "4096", "81559MiB" -> bytes. Binary (KiB/MiB/GiB/TiB) and decimal
// (KB/MB/GB/TB) suffixes, case-insensitive, optional fractional part; plain digits are bytes.
absl::StatusOr<int64_t> ParseByteSize(absl::string_view text);

}  // namespace memplan::cli
