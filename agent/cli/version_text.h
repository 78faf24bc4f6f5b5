// memplan-agent --version: the build (common/build_info.h) and the LibTorch, CUDA runtime, cuDNN
// and NCCL versions this binary runs with, one "name value" pair per line after the first.
#pragma once

#include <string>

namespace memplan {

std::string AgentVersionText();

}  // namespace memplan
