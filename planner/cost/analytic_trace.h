// Analytic trace: per-block memory and time figures for a Llama-family decoder (GQA, SwiGLU,
// RMSNorm, RoPE, flash/SDPA attention), derived op by op from eager PyTorch autograd behaviour
// (docs/cost-model.md, "Analytic trace"). Pure computation. Thread-safe (free functions).
#pragma once

#include "absl/status/statusor.h"
#include "common/types.h"

namespace memplan {

struct AnalyticTraceOptions {
  // Fraction of the card's dense matmul peak reached by the model's GEMMs.
  double matmul_efficiency = 0.55;
  // Fraction of HBM bandwidth reached by memory-bound (elementwise, norm, loss) kernels.
  double hbm_efficiency = 0.7;
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

}  // namespace memplan
