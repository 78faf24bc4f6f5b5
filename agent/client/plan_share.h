// One planner answer for every rank of a sharded run: rank 0 asks the planner, the others take
// its answer through the process group (so the planner stores one plan per job, and every rank
// trains under the same one). Torch is only in the .cc.
#pragma once

#include "absl/status/statusor.h"
#include "agent/client/plan_answer.h"

namespace memplan {

class Communicator;

// Collective: every rank calls it. On rank 0 `rank0_answer` is what the planner answered (or
// why it could not); on the others it is ignored. Returns rank 0's answer on every rank; when
// rank 0 has none, rank 0 gets its own error back and the others FAILED_PRECONDITION naming
// rank 0. A failed collective (a rank gone) is returned as its status.
absl::StatusOr<PlanAnswer> ShareRankZeroAnswer(Communicator& comm,
                                               const absl::StatusOr<PlanAnswer>& rank0_answer);

}  // namespace memplan
