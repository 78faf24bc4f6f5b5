// Usage texts of the `memplan` CLI (declared in cli_args.h next to the parser they describe).
#include <string>

#include "absl/strings/str_cat.h"
#include "common/channel_security.h"
#include "planner/cli/cli_args.h"

namespace memplan::cli {
namespace {

constexpr char kGlobalHelp[] = R"(Global flags (anywhere on the line):
  --planner HOST:PORT   planner daemon address. Without it (and without --tls-ca or
                        --auth-token-file) plan, admit, presets and hardware list answer
                        in-process with the daemon's engine; the other commands call
                        127.0.0.1:50051
  --db FILE             in-process answers: the planner database to read calibration, measured
                        hardware and profiled traces from, read only (default
                        ./memplan-planner.db when it exists, else none)
  --json                print the reply as proto JSON instead of a table
  --timeout SECONDS     deadline of each RPC (default 30)
  --version             the version, git commit and build type
  -h, --help            this help
Secure planner connection (global flags too):
)";

constexpr char kOverview[] =
    R"(memplan - ask the memplan planner which GPU memory residency plan fits a training job.

Usage: memplan [global flags] COMMAND [flags] [args]

Commands:
  plan                 plan a model on a GPU: verdict, knobs, memory breakdown, speed, limits
  admit                one job against a scheduler's GPU pools: which fit, plan and tokens/s
  trace submit FILE    store a profiled trace (proto JSON, '-' = stdin); prints its id
  trace get ID         show a stored trace
  hardware submit FILE store a measured hardware profile (proto JSON, '-' = stdin)
  hardware list        list the hardware presets known to the planner
  hardware get ID      show a stored hardware profile
  measure              report what a training run measured for a plan (feeds calibration)
  calibration          show the learned calibration per (hardware, dtype, model family)
  plans list           list stored plans, newest first
  plans get ID         show a stored plan with its measurements
  presets              list model and hardware presets
  env                  versions, host, GPUs, agent and planner: paste it into a bug report

Run 'memplan COMMAND --help' for the flags of a command.
Exit status: 0 ok, 1 the planner answered with an error or could not be reached, 2 bad usage.
)";

constexpr char kPlan[] = R"(Usage: memplan plan MODEL HARDWARE [workload] [knobs]

Asks the planner for the fastest residency plan that fits, with the reasons.

Model (exactly one):
  --arch PRESET          a model preset (see 'memplan presets --models'), e.g. llama-3.1-8b
  --arch-file PATH       a Hugging Face config.json, or a directory holding one
  --trace-id ID          a trace stored with 'memplan trace submit'; its workload, dtype and
                         training method apply unless given (then give both --batch and --seq)
Hardware (exactly one):
  --gpu PRESET           a hardware preset, e.g. h100-80gb, rtx-4090 (a measured profile of the
                         same name, submitted by an agent, takes precedence)
  --hardware-id ID       a stored hardware profile
Workload:
  --batch N              micro-batch size per GPU (default 1)
  --seq N                sequence length in tokens (default 4096)
  --world-size N         data-parallel ranks sharding the model (default 1)
  --gpus-per-node N      the job's GPUs (ranks) on each node, at most --world-size; they share
                         the node's RAM and CPU (default: --world-size, one node);
                         --local-world-size is the same flag
  --host-memory-gib X    the node's RAM in GiB, 1 to 65536, in place of the hardware preset's
                         (e.g. 2048 for a 2 TiB node; see 'memplan presets --hardware')
  --grad-accum N         gradient accumulation steps (default 1)
  --grad-clipping        gradients are clipped by global norm (offloaded chunks then update
                         after backward instead of overlapping it)
  --images-per-sample N  a vision-language model's (qwen2_5_vl, qwen2_vl) images per sample,
                         1 to 1024, with --image-size HEIGHTxWIDTH in pixels (e.g. 448x448);
                         required for such a model, which is never planned as text only
  --vision-checkpoint    the vision tower's blocks recompute in backward, keeping only their
                         inputs (full fine-tuning; the planner also turns it on by itself when
                         nothing fits without it)
  --dtype fp32|bf16|fp16 parameter dtype (default bf16)
  --optimizer NAME       adamw (fp32 states, default), adamw_bf16, adamw8bit (bitsandbytes-style
                         8-bit block-wise states), sgd
  --lora-rank N          train LoRA adapters of this rank instead of a full fine-tune
  --lora-targets LIST    comma-separated modules: q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,
                         down_proj, or 'all' (required with --lora-rank)
  --qlora                QLoRA: the LoRA above on a base whose q/k/v/o/gate/up/down projection
                         weights are 4-bit NF4 (bitsandbytes' nf4, double quantization)
  --osft-rank-ratio R    OSFT (orthogonal subspace fine-tuning), as memplan-agent train runs it:
                         each targeted weight split by SVD, the fraction R in (0, 1) of its
                         spectrum trains; unmanaged (no chunks: only --n-ckpt, --n-swap and
                         --n-hs-offload can be fixed; docs/cost-model.md, "OSFT")
  --osft-targets LIST    the projections split, as --lora-targets (default all)
  --safety-margin F      fraction of GPU memory held back, 0 to 0.5 (0 or unset: the planner's
                         default, 0.05); --margin is the old spelling, still accepted
Fixed knobs (each one is a constraint; the rest is searched):
  --chunk-mib N          chunk size in MiB, 1 to 16384
  --n-persist N          chunks kept resident on the GPU
  --n-buffer N           GPU buffers for non-persistent chunks
  --n-swap N             blocks whose activations are swapped to the host
  --n-ckpt N             blocks that recompute activations in backward
  --n-hs-offload N       blocks that checkpoint and offload their input to the host
  --host-memory pinned|pageable
  --persistent-state sharded|replicated
                         several ranks: the persistent chunks' optimizer state sharded 1/W per
                         rank (grads reduce-scattered, parameters all-gathered after the update)
                         or replicated (grads all-reduced); searched when not given
  --persistent-params sharded|replicated
                         several ranks, with the state sharded: the persistent chunks'
                         parameters sharded too, all-gathered before each group that uses them
                         (ZeRO-3) or replicated; LoRA / QLoRA: the frozen base's persistent
                         chunks, the adapters replicated; searched when not given
  --head-chunk-mib N     fp32 logits per LM head chunk, 1 to 4096 MiB; not given: 1024 where
                         the fastest plan still fits with them, else 256
Output:
  --max-alternatives N   alternatives on the memory/speed frontier, 1 to 20 (planner default 5)
  --skip-limits          skip max batch / max sequence / min GPU memory (faster)

Example:
  memplan plan --arch llama-3.1-8b --gpu h100-80gb --batch 1 --seq 4096
  memplan plan --arch qwen2.5-vl-7b --gpu rtx-4090 --seq 2048 --images-per-sample 1 \
      --image-size 448x448 --lora-rank 16 --lora-targets q_proj,k_proj,v_proj,o_proj
)";

constexpr char kTrace[] = R"(Usage: memplan trace submit FILE
       memplan trace get TRACE_ID

submit: stores a trace written by the agent's profiler (memplan.v1.Trace as proto JSON; '-'
        reads stdin) and prints its id; 'memplan plan --trace-id ID' then uses it.
get:    shows a stored trace (per-block bytes and times).
)";

constexpr char kHardware[] = R"(Usage: memplan hardware submit FILE
       memplan hardware list
       memplan hardware get PROFILE_ID

submit: stores a hardware profile (memplan.v1.HardwareProfile as proto JSON; '-' reads stdin)
        and prints its id. A profile marked measured supersedes the preset of the same name.
list:   the hardware presets the planner serves (memory, bandwidths, FLOP/s).
get:    shows a stored hardware profile.
)";

constexpr char kAdmit[] =
    R"(Usage: memplan admit MODEL [workload] [knobs] --pool NAME=HARDWARE[:GPUS]...

Plans one job on each of a scheduler's GPU pools in one call and says which pools can run it,
with the plan, predicted tokens/s and the stored plan id of each; the best pool is the fitting
one with the most tokens/s for the whole job (per-GPU tokens/s x --world-size). A pool with
fewer GPUs than --world-size does not fit. Exit status 0 whether or not a pool fits (read the
verdicts, or "best_pool" with --json).

Pools (one or more):
  --pool NAME=HARDWARE[:GPUS]  HARDWARE a hardware preset (e.g. h100-80gb) or profile/ID (a
                               stored profile); GPUS free in the pool (default 1)
Model, workload, method and knobs: the flags of 'memplan plan' except --gpu and --hardware-id.

Example:
  memplan admit --arch llama-3.1-8b --batch 1 --seq 4096 --skip-limits \
      --pool consumer=rtx-4090:16 --pool datacenter=h100-80gb:8
)";

constexpr char kMeasure[] = R"(Usage: memplan measure --plan-id ID --peak-reserved SIZE [more]

Reports what a training run measured while running a plan. The planner stores it durably,
refits the calibration of that (hardware, dtype, model family) and prints the prediction error.

  --plan-id ID           the plan that ran (required)
  --peak-reserved SIZE   steady-state peak reserved by the caching allocator (required unless --oom)
  --peak-allocated SIZE  steady-state peak allocated
  --peak-device SIZE     device-level peak used (NVML / cudaMemGetInfo)
  --load-peak SIZE       transient peak while loading the weights
  --step-seconds F       measured optimizer step time
  --oom                  the run ran out of memory
  --note TEXT            free text stored with the measurement
SIZE: bytes, or with a unit: 512MiB, 71.5GiB, 80GB.
)";

constexpr char kCalibration[] =
    R"(Usage: memplan calibration [--hardware NAME] [--dtype D] [--family F]

Shows the calibration learned from measurements: fragmentation factor, residual bytes, sample
count and the raw model's mean absolute error. Flags filter; without them all are listed.
)";

constexpr char kPlans[] = R"(Usage: memplan plans list [--page-size N] [--page-token T] [--all]
       memplan plans get PLAN_ID

list: stored plans, newest first (--page-size 1..1000, --all follows every page).
get:  one stored plan: request, answer, and the measurements reported for it.
)";

constexpr char kPresets[] = R"(Usage: memplan presets [--models | --hardware]

Lists the model architectures and hardware the planner knows by name.
)";

constexpr char kEnv[] = R"(Usage: memplan env [--json] [--db FILE] [--planner HOST:PORT]

Prints what a bug report needs, in the manner of ds_report / accelerate env:
  memplan        version, git commit, build type, compiler (the first line is --version's)
  libraries      gRPC, protobuf, Abseil and SQLite as linked into this binary
  host           CPU model and count, RAM (/proc/meminfo), OS (/etc/os-release), kernel
  GPUs           nvidia-smi's name, memory and driver of each GPU, and the hardware preset it
                 maps to (by name, by model and memory, or guessed from memory only); "no
                 NVIDIA GPU found" when nvidia-smi is not on PATH
  agent          memplan-agent --version (torch, CUDA runtime, cuDNN, NCCL) of the agent beside
                 memplan, else the one on PATH
  planner        whether the database in-process answers read exists (--db, default
                 ./memplan-planner.db), and with --planner the daemon's answer to ListPresets
--json prints the same as one JSON object. Exit status 0 whatever it finds.
)";

}  // namespace

std::string HelpText(Command command) {
  const char* body = kOverview;
  switch (command) {
    case Command::kNone:
      body = kOverview;
      break;
    case Command::kPlan:
      body = kPlan;
      break;
    case Command::kTraceSubmit:
    case Command::kTraceGet:
      body = kTrace;
      break;
    case Command::kHardwareSubmit:
    case Command::kHardwareList:
    case Command::kHardwareGet:
      body = kHardware;
      break;
    case Command::kAdmit:
      body = kAdmit;
      break;
    case Command::kMeasure:
      body = kMeasure;
      break;
    case Command::kCalibration:
      body = kCalibration;
      break;
    case Command::kPlansList:
    case Command::kPlansGet:
      body = kPlans;
      break;
    case Command::kPresets:
      body = kPresets;
      break;
    case Command::kEnv:
      body = kEnv;
      break;
  }
  return absl::StrCat(body, "\n", kGlobalHelp, ChannelSecurityUsage());
}

}  // namespace memplan::cli
