#include "agent/blocks/rng_fork.h"

#include <mutex>

namespace memplan {

RngState CaptureRng(torch::Device device) {
  RngState state;
  state.device = device;
  {
    auto gen = at::detail::getDefaultCPUGenerator();
    std::lock_guard<std::mutex> lock(gen.mutex());
    state.cpu = gen.get_state();
  }
  if (device.is_cuda()) {
    auto gen = at::globalContext().defaultGenerator(device);
    std::lock_guard<std::mutex> lock(gen.mutex());
    state.cuda = gen.get_state();
  }
  return state;
}

void RestoreRng(const RngState& state) {
  {
    auto gen = at::detail::getDefaultCPUGenerator();
    std::lock_guard<std::mutex> lock(gen.mutex());
    gen.set_state(state.cpu);
  }
  if (state.cuda.defined()) {
    auto gen = at::globalContext().defaultGenerator(state.device);
    std::lock_guard<std::mutex> lock(gen.mutex());
    gen.set_state(state.cuda);
  }
}

RngFork::RngFork(const RngState& forward_state) : outside_(CaptureRng(forward_state.device)) {
  RestoreRng(forward_state);
}

RngFork::~RngFork() { RestoreRng(outside_); }

}  // namespace memplan
