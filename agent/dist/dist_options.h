// Where a rank finds its process group: torchrun / Slurm / Kubernetes environment (RANK,
// WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT) as plain data. Torch-free.
#pragma once

#include <functional>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace memplan {

// Up to 256 ranks (the collective bench's bf16 check holds every sum exactly up to there).
inline constexpr int kMaxDistWorldSize = 256;

enum class DistBackend { kAuto, kNccl, kGloo };  // kAuto: NCCL when CUDA is usable, else Gloo

absl::string_view DistBackendName(DistBackend backend);  // "auto", "nccl", "gloo"

struct DistOptions {
  int world_size = 1;
  int rank = 0;
  int local_rank = 0;        // this rank's CUDA device (NCCL)
  int local_world_size = 1;  // ranks on this host
  std::string master_addr = "127.0.0.1";
  int master_port = 29500;
  // Rank 0 only: a socket already listening on master_port that the store takes over, so that a
  // caller that picked an ephemeral port keeps it (c10d's masterListenFd); -1: bind master_port.
  int master_listen_fd = -1;
  // The store is served already (torchrun's agent store, TORCHELASTIC_USE_AGENT_STORE=True):
  // rank 0 connects to it as a client like the others.
  bool store_already_served = false;
  DistBackend backend = DistBackend::kAuto;
  // Rendezvous and every collective: a rank that does not take part within this time makes the
  // others' collectives fail.
  int timeout_seconds = 600;
  // Every rank bumps a counter in the store this often; after a failed collective the ranks whose
  // counter stopped are named as gone ([Naming the failed rank] in process_group.cc).
  int heartbeat_milliseconds = 1000;
  // Keys of this group in the store (a shared store, torchrun's, holds others' too).
  std::string store_prefix = "memplan";
  // [Collective stream priority] NCCL: the process group's streams are high-priority CUDA
  // streams, so a chunk's all-gather or reduce-scatter gets SMs ahead of the forward/backward
  // kernels queued beside it (what FSDP2 does with its communication streams).
  // MEMPLAN_NCCL_HIGH_PRIORITY=0 turns it off (for comparisons).
  bool high_priority_streams = true;
  // [Coalesced gathers] (agent/chunks): the chunk all-gathers of one hook start as one collective.
  // Env MEMPLAN_COALESCE_GATHERS=0|1 (default 1); 0 starts one per chunk, for comparison.
  bool coalesce_gathers = true;
};

// INVALID_ARGUMENT naming the field and its allowed range.
absl::Status ValidateDistOptions(const DistOptions& options);

// The value of an environment variable, or nullopt when it is not set.
using EnvLookup = std::function<std::optional<std::string>(const std::string& name)>;

// torchrun's variables: WORLD_SIZE (absent: 1, every other variable optional), RANK (required
// when WORLD_SIZE > 1), LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT,
// TORCHELASTIC_USE_AGENT_STORE; and MEMPLAN_NCCL_HIGH_PRIORITY (0 or 1). INVALID_ARGUMENT names the
// variable, its range and the value, as flags do ([Flag errors], common/flags.h):
// "RANK (environment): 2 is outside [0, 1] (world size 2)".
absl::StatusOr<DistOptions> DistOptionsFromEnvironment(const EnvLookup& env);

// How an error names the setting behind a torchrun variable (given its name, e.g. "RANK"): the
// environment's "RANK (environment)", or a command-line flag that stands in for it.
using DistSettingLabel = std::function<std::string(const std::string& variable)>;

// The one parser behind DistOptionsFromEnvironment, for callers whose values come from flags
// and the environment together (`lookup` answers each variable by name; `label` names it in
// errors, also when it is missing).
absl::StatusOr<DistOptions> DistOptionsFromSettings(const EnvLookup& lookup,
                                                    const DistSettingLabel& label);

}  // namespace memplan
