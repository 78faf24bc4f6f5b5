// The c10d backend under a ProcessGroup, for code that drives c10d directly (agent/bench's timed
// collectives). Private to agent/dist, agent/bench and their tests: it names c10d types.
#pragma once

#include <torch/csrc/distributed/c10d/Backend.hpp>

#include "agent/dist/process_group.h"

namespace memplan {

c10::intrusive_ptr<c10d::Backend> C10dBackendOf(ProcessGroup& group);

}  // namespace memplan
