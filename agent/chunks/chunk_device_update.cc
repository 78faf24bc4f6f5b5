// ChunkOptimizer, part three: [Device updates of offloaded chunks]
// (ChunkManagerOptions::device_update_share). A held update (after the norm) of some offloaded
// chunks runs on the device: the chunk's arrays are copied into a device slot on one side
// stream, updated there as a persistent chunk is ([Persistent update]) and copied back on a
// second, two slots taking turns so that one chunk's copies in run beside the previous one's
// copies back. Nothing waits on the host until the pager uploads the chunk for the next forward
// (WaitTasks). The copy engines move the bytes the CPU cores would otherwise move: on an H200
// host the copies ran at 47 / 35 GiB/s beside a CPU update that kept 63 % (adamw_bf16) and 78 %
// (adamw8bit) of its rate; the clipped 8B step gained 22 % with adamw8bit and nothing with
// adamw_bf16 (docs/benchmarks.md, "Thirty-first session").
#include <algorithm>
#include <cmath>
#include <limits>
#include <utility>
#include <vector>

#include "agent/chunks/adamw8bit_torch.h"
#include "agent/chunks/chunk_optimizer.h"
#include "agent/chunks/chunk_persistent_update.h"
#include "common/optimizer_bytes.h"

namespace memplan::chunks {

bool ChunkOptimizer::DeviceUpdatesApply() const {
  const ChunkManagerOptions& o = set_.options();
  return o.device_update_share > 0 && !o.frozen && !o.profile_only && !set_.stateless() &&
         !set_.sharded() && (pure() || quantized());
}

bool ChunkOptimizer::DeviceUpdateChunk(int c) const {
  const Chunk& chunk = set_.chunk(c);
  if (!DeviceUpdatesApply() || chunk.persistent) return false;
  // A chunk larger than a regular one (an oversized parameter) would need slots of its size.
  if (chunk.span_elems * set_.elem_size() > set_.options().chunk_bytes) return false;
  // The j-th offloaded chunk is the device's when the device's count among the first j + 1
  // grows: evenly spread, so both sides work through the chunks in the next forward's order.
  const double share = std::min(1.0, set_.options().device_update_share);
  const int j = c - set_.n_persist();
  return std::floor((j + 1) * share) > std::floor(j * share);
}

void ChunkOptimizer::StartDeviceUpdates(const std::vector<int>& chunks, float grad_scale,
                                        const torch::Tensor& clip_coef) {
  FinishDeviceUpdates();  // slots still held by an earlier step (none normally)
  const ChunkManagerOptions& options = set_.options();
  const torch::ScalarType dtype = set_.dtype();
  const auto model = torch::TensorOptions().dtype(dtype).device(options.device);
  int64_t span = 0;
  int64_t absmax_slots = 0;
  for (int c : chunks) {
    span = std::max(span, set_.chunk(c).span_elems);
    absmax_slots = std::max(absmax_slots, chunks_[c].exp_avg_absmax.size_bytes() / 4);
  }
  // From the caching allocator on the compute stream; released only after the host saw every
  // copy out of them finish, so no side stream can still be using a block it hands out again.
  device_slots_.resize(2);
  for (DeviceSlot& slot : device_slots_) {
    slot.param = torch::empty({span}, model);
    slot.grad = torch::empty({span}, model.dtype(host_grad_dtype()));
    if (has_moments()) {
      slot.exp_avg = torch::empty({span}, model.dtype(moment_dtype()));
      slot.exp_avg_sq = torch::empty({span}, model.dtype(moment_dtype()));
    }
    if (quantized()) {
      slot.exp_avg_absmax = torch::empty({absmax_slots}, model.dtype(torch::kFloat32));
      slot.exp_avg_sq_absmax = torch::empty({absmax_slots}, model.dtype(torch::kFloat32));
    }
    slot.free = nullptr;
  }
  const int64_t slice_elems =
      StepGradCopyElems(std::numeric_limits<int64_t>::max(), options.chunk_bytes, set_.elem_size());
  device_clip_coef_ = clip_coef;
#ifdef MEMPLAN_CHUNKS_CUDA
  // Whatever the compute stream still has to produce (the clip coefficient) comes first.
  if (set_.cuda()) streams_.RecordOnCompute()->block(streams_.update_in());
#endif
  for (size_t k = 0; k < chunks.size(); ++k) {
    const int c = chunks[k];
    const Chunk& layout = set_.chunk(c);
    ChunkState& chunk = chunks_[c];
    DeviceSlot& slot = device_slots_[k % device_slots_.size()];
    const int64_t n = layout.span_elems;
    // (device, host) pairs of what the update reads; all but the grad are written back.
    std::vector<std::pair<torch::Tensor, torch::Tensor>> arrays = {
        {slot.grad.narrow(0, 0, n), ChunkSet::HostFlat(HostGrad(c), 0, n, host_grad_dtype())},
        {slot.param.narrow(0, 0, n), ChunkSet::HostFlat(layout.param_host.data(), 0, n, dtype)}};
    if (has_moments()) {
      arrays.emplace_back(slot.exp_avg.narrow(0, 0, n),
                          ChunkSet::HostFlat(chunk.exp_avg.data(), 0, n, moment_dtype()));
      arrays.emplace_back(slot.exp_avg_sq.narrow(0, 0, n),
                          ChunkSet::HostFlat(chunk.exp_avg_sq.data(), 0, n, moment_dtype()));
    }
    if (quantized()) {
      const int64_t slots = chunk.exp_avg_absmax.size_bytes() / 4;
      arrays.emplace_back(
          slot.exp_avg_absmax.narrow(0, 0, slots),
          ChunkSet::HostFlat(chunk.exp_avg_absmax.data(), 0, slots, torch::kFloat32));
      arrays.emplace_back(
          slot.exp_avg_sq_absmax.narrow(0, 0, slots),
          ChunkSet::HostFlat(chunk.exp_avg_sq_absmax.data(), 0, slots, torch::kFloat32));
    }
    // The update of the chunk's parameters with a grad this step, on views into the slot laid
    // out as the persistent chunks' state is (InitChunk).
    auto update = [&] {
      PersistentUpdate fused(*this, clip_coef, grad_scale, slice_elems);
      std::vector<int> params;
      std::vector<torch::Tensor> grads;
      for (int i : layout.params) {
        if (!params_[i].grad_in_step) continue;  // torch's AdamW skips it: no step count
        params.push_back(i);
        grads.push_back(ParamView(slot.grad, set_.param(i)));
      }
      fused.ClipGrads(grads);
      for (size_t q = 0; q < params.size(); ++q) {
        const int i = params[q];
        const Param& p = set_.param(i);
        ParamState& s = params_[i];
        ++s.step;
        if (quantized()) {
          AdamW8bitTorchUpdate(
              options.adamw, s.step, clip_coef, quant_maps_, ParamView(slot.param, p), grads[q],
              ParamView(slot.exp_avg, p), ParamView(slot.exp_avg_sq, p),
              QuantSlotsView(slot.exp_avg_absmax, p), QuantSlotsView(slot.exp_avg_sq_absmax, p),
              MakeParamRounding(options.stochastic_rounding, options.rounding_seed,
                                static_cast<int64_t>(i), s.step, 0));
          continue;
        }
        fused.Add(s, ParamView(slot.param, p), grads[q], ParamView(slot.exp_avg, p),
                  ParamView(slot.exp_avg_sq, p));
      }
      fused.Flush();
      device_updated_.fetch_add(n, std::memory_order_relaxed);
    };
    chunk.update_started = true;
#ifdef MEMPLAN_CHUNKS_CUDA
    if (set_.cuda()) {
      c10::cuda::CUDAStream in = streams_.update_in();
      c10::cuda::CUDAStream out = streams_.update_out();
      if (slot.free) slot.free->block(in);  // the slot's previous chunk has been copied out
      if (chunk.grads_copied) chunk.grads_copied->block(in);
      {
        c10::cuda::CUDAStreamGuard guard(in);
        for (auto& [device, host] : arrays) device.copy_(host, /*non_blocking=*/true);
        update();
      }
      Event updated;
      updated.record(in);
      updated.block(out);
      // An upload of the chunk may still be reading param_host.
      if (const EventPtr uploaded = pager_.uploaded(c)) uploaded->block(out);
      {
        c10::cuda::CUDAStreamGuard guard(out);
        for (size_t a = 1; a < arrays.size(); ++a) {
          arrays[a].second.copy_(arrays[a].first, /*non_blocking=*/true);
        }
      }
      chunk.device_done = std::make_shared<Event>();
      chunk.device_done->record(out);
      slot.free = chunk.device_done;
      last_device_chunk_ = c;
      continue;
    }
#endif
    for (auto& [device, host] : arrays) device.copy_(host);
    update();
    for (size_t a = 1; a < arrays.size(); ++a) arrays[a].second.copy_(arrays[a].first);
  }
  if (last_device_chunk_ < 0) FinishDeviceUpdates();  // a CPU device: all done already
}

void ChunkOptimizer::FinishDeviceUpdates() {
  for (ChunkState& chunk : chunks_) {
    if (chunk.device_done == nullptr) continue;
    chunk.device_done->synchronize();
    chunk.device_done = nullptr;
  }
  device_slots_.clear();
  device_clip_coef_ = torch::Tensor();
  last_device_chunk_ = -1;
}

}  // namespace memplan::chunks
