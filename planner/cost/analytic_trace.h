// Analytic trace: per-block memory and time figures for a Llama-family decoder (GQA, SwiGLU,
// RMSNorm, RoPE, flash/SDPA attention), derived op by op from eager PyTorch autograd behaviour
// (docs/cost-model.md, "Analytic trace"). Pure computation. Thread-safe (free functions).
#pragma once

#include "absl/status/statusor.h"
#include "common/types.h"

namespace memplan {

// A preset card (HardwareSpec::measured false) carries datasheet peaks; the benches of an H200
// reached these fractions of them (792 of 989 dense bf16 TFLOP/s, a 4.18 of 4.8 TB/s HBM copy:
// docs/benchmarks.md, "Eighteenth session"). [Block time] prices from the achievable rates.
inline constexpr double kPresetMatmulAchieved = 0.80;
inline constexpr double kPresetHbmAchieved = 0.87;

struct AnalyticTraceOptions {
  // Fraction of the card's dense matmul peak reached by the GEMMs of the embedding, the head, a
  // vision tower and the experts of a mixture (the dense blocks: [Block time] below).
  double matmul_efficiency = 0.55;
  // Fraction of HBM bandwidth reached by their memory-bound (elementwise, norm, loss) kernels.
  double hbm_efficiency = 0.7;
  // [Block time] (docs/cost-model.md) A decoder block's time, fitted on one H200 host's profiled
  // blocks (0.5-14 B presets, 512-16 384 tokens; docs/benchmarks.md, "Eighteenth session"):
  // the projections' GEMMs at block_gemm_efficiency of the achievable matmul rate (the bench's,
  // or kPresetMatmulAchieved of a preset's datasheet peak), attention at attention_efficiency of
  // it, the saved-activation traffic at block_hbm_efficiency of the achievable HBM rate; and the
  // host's floor: the CPU issues a block's few hundred kernels in about block_forward_floor_seconds
  // (backward: block_backward_floor_seconds). [Host runs ahead] A training step does not wait
  // for the device between blocks, so the host queues the next kernels while the device runs
  // the last ones and a block takes the larger of its device time and its floor
  // (host_overlap_exponent 0). The fit itself timed blocks with a synchronisation on either side,
  // where the two add up in part: (device^p + floor^p)^(1/p) with p = 1.5 there.
  double block_gemm_efficiency = 1.0;
  double attention_efficiency = 0.65;
  double block_hbm_efficiency = 0.47;
  // [Adapter traffic] An adapter's elementwise passes and skinny products stream their tensors:
  // measured on an H200 (docs/benchmarks.md, "Twenty-fifth session") at 0.87-0.98 of the
  // bench's device copy rate; priced at adapter_hbm_efficiency of the achievable HBM rate.
  double adapter_hbm_efficiency = 0.85;
  double block_forward_floor_seconds = 0.83e-3;
  double block_backward_floor_seconds = 1.455e-3;
  double host_overlap_exponent = 0;
  // The agent's LM head + loss: chunked beyond one chunk of tokens (common/head_chunking.h).
  // false: eager PyTorch's plain head at every length (what peer baselines run).
  bool chunked_head = true;
};

// Builds the trace for (arch, workload, dtype, training) on `hardware` (rates only). The chunk
// layout fields (chunk_bytes, chunk_param_bytes) are left empty: planner/cost/chunk_layout.h
// fills them for a chosen chunk size. INVALID_ARGUMENT names the offending field (a mixture of
// experts with QLoRA or adapters on its MLP included, as the agent refuses them). A mixture of
// experts' sparse layers (ModelSpec::IsMoeLayer) get their own BlockTrace, priced with every
// expert's weights and the top-k routed activations. A vision-language model needs its images
// in the workload (INVALID_ARGUMENT naming workload.images_per_sample otherwise); its vision
// tower is priced in the embedding's stage, where the agent runs it (common/vision_cost.h).
absl::StatusOr<Trace> SynthesizeTrace(const ModelSpec& arch, const Workload& workload,
                                      DType param_dtype, const TrainingMethod& training,
                                      const HardwareSpec& hardware,
                                      const AnalyticTraceOptions& options = {});

// Rescales a (profiled) trace to another micro-batch / sequence length: every activation byte
// figure and every time scales linearly in tokens (micro_batch * seq_len); parameter bytes stay,
// and so does QLoRA's dequantization transient (one weight copy, common/nf4_bytes.h). A vision
// tower's bytes follow the images instead (the embedding group rebased on its formula); its
// time still scales with the tokens.
// Used for limit probes when no architecture-driven re-synthesis is possible.
Trace ScaleTraceToWorkload(const Trace& trace, const Workload& workload);

// The trace with its LM head priced for head chunks of `to_logit_bytes` fp32 logits instead of
// `from_logit_bytes` (0 = kHeadChunkLogitBytes, SynthesizeTrace's; common/head_chunking.h): the
// head's bytes rebased on HeadMemory (the chunk's logits, or the plain head where the new size no
// longer chunks), its seconds on the head's time formula ([Head chunk sums]: n_chunks x 8·V·H
// bytes at the head's HBM rate in forward). A trace without a valid architecture is returned as is.
Trace RepriceHeadChunks(const Trace& trace, const HardwareSpec& hardware, int64_t from_logit_bytes,
                        int64_t to_logit_bytes, const AnalyticTraceOptions& options = {});

}  // namespace memplan
