// The LM head + cross-entropy in row chunks: the one definition the agent's model
// (agent/model/chunked_head.cc, [Chunked head]) and the planner's memory terms
// (planner/cost/analytic_trace.cc) share. Torch-free, header-only.
//
// [Chunked head] The full-vocabulary logits of a long sequence are the largest tensors of a step
// (fp32 logits of 32 K tokens and a 128 K vocabulary are 16 GiB). When a micro-batch has more
// tokens than one chunk holds, the head computes logits, the loss and the gradient of the loss
// for HeadChunkRows() tokens at a time, during forward: only one chunk's logits exist at once,
// and what waits for backward is the gradient of the head's input ([T, H], model dtype) and of
// its weight ([V, H], fp32 sum over chunks). Shorter micro-batches take the plain path (logits
// kept for autograd), which is bit-identical to Hugging Face's, and so do micro-batches where the
// chunked head would hold more than the plain one (HeadIsChunked).
#pragma once

#include <algorithm>
#include <cstdint>

namespace memplan {

// fp32 logits of one chunk, at most (a chunk of rows never drops below 1): the default of planned
// runs (ResidencyPlan::head_chunk_logit_bytes 0), which the planner prices.
inline constexpr int64_t kHeadChunkLogitBytes = int64_t{256} << 20;
// The same for `memplan-agent train --plain`, which no plan holds to a budget. Each chunk adds
// its [V, H] product into the fp32 weight-gradient sum (a read and a write of 8·V·H bytes), so
// fewer chunks cost less: on an H200, llama-3.2-1b 4×2048 spent 7.5 ms of a 186 ms step on those
// sums with 16 chunks of 256 MiB; chunks of 1 GiB take four.
inline constexpr int64_t kPlainHeadChunkLogitBytes = int64_t{1} << 30;
// ResidencyPlan::head_chunk_logit_bytes: 0 (kHeadChunkLogitBytes) or in this range.
inline constexpr int64_t kMinHeadChunkLogitBytes = int64_t{1} << 20;
inline constexpr int64_t kMaxHeadChunkLogitBytes = int64_t{4} << 30;

// The chunk size a plan's head_chunk_logit_bytes means: 0 (old plans) is kHeadChunkLogitBytes.
inline int64_t HeadChunkLogitBytes(int64_t plan_value) {
  return plan_value > 0 ? plan_value : kHeadChunkLogitBytes;
}

// Tokens per head chunk for a vocabulary of `vocab`.
inline int64_t HeadChunkRows(int64_t vocab, int64_t logit_bytes = kHeadChunkLogitBytes) {
  return std::max<int64_t>(1, logit_bytes / (std::max<int64_t>(vocab, 1) * 4));
}

// Whether a micro-batch of `tokens` tokens runs the chunked head, for a model of hidden size
// `hidden`: when it needs more than one chunk and holds less at the head's peak than the plain
// head. The plain head holds about 14 bytes per logit there (logits in the model dtype and fp32
// log-softmax output saved, fp32 gradients of both in backward: 6 + 8); the chunked one holds the
// fp32 weight-gradient sum (4·V·H) and one chunk's logits in two dtypes plus their gradient (at
// most 8 bytes per logit of the chunk, in bf16). Both hold the weight gradient in the model dtype.
inline bool HeadIsChunked(int64_t tokens, int64_t vocab, int64_t hidden,
                          int64_t logit_bytes = kHeadChunkLogitBytes) {
  const int64_t rows = HeadChunkRows(vocab, logit_bytes);
  return tokens > rows && 14 * tokens > 4 * hidden + 8 * rows;
}

// [Head chunk sums] Bytes the chunked head moves adding each chunk's [V, H] weight-gradient
// product into the fp32 sum (a read and a write, 8·V·H per chunk), when the head weight trains;
// what makes fewer, larger chunks faster. The planner prices it at the head's HBM rate.
inline int64_t HeadChunkSumBytes(int64_t tokens, int64_t vocab, int64_t hidden,
                                 int64_t logit_bytes = kHeadChunkLogitBytes) {
  const int64_t rows = HeadChunkRows(vocab, logit_bytes);
  return (tokens + rows - 1) / rows * 8 * vocab * hidden;
}

// Bytes of the chunked head, for a model of hidden size h, vocabulary v, dtype_bytes d and a
// micro-batch of `tokens` tokens (see [Chunked head]):
struct ChunkedHeadBytes {
  // Held from forward to backward: d(loss)/d(input) [T, H] in the model dtype, and, when the head
  // weight trains, d(loss)/d(weight) [V, H] summed in fp32.
  int64_t saved = 0;
  // Forward, on top: one chunk's logits in the model dtype and in fp32, the fp32 softmax
  // gradient (computed in place of the fp32 logits), its cast to the model dtype, and, for fp32
  // models, the chunk's weight-gradient product before it is added to the sum (bf16/fp16 models on
  // a GPU add the product into the fp32 sum inside the GEMM; on the CPU, which is not planned,
  // they hold a model-dtype product too).
  int64_t forward_transient = 0;
  // The head's own backward, on top: the weight gradient cast to the model dtype beside the
  // fp32 sum it comes from (16-bit models; an fp32 model returns the sum itself). The input
  // gradient is scaled in place (agent/model/chunked_head.cc), so it adds nothing.
  int64_t backward_transient = 0;
  // Net bytes the head's backward hands back once it returns: the fp32 sum goes and its
  // model-dtype cast stays until the weight's chunk takes it (16-bit models; 0 for fp32, whose
  // sum is the returned gradient). The final norm's backward, which runs next, has this much
  // less of the saved set beside it.
  int64_t freed_by_backward = 0;
};

inline ChunkedHeadBytes ChunkedHeadMemory(int64_t h, int64_t v, int64_t d, int64_t tokens,
                                          bool weight_trains,
                                          int64_t logit_bytes = kHeadChunkLogitBytes) {
  const int64_t rows = std::min(tokens, HeadChunkRows(v, logit_bytes));
  ChunkedHeadBytes b;
  b.saved = tokens * h * d + (weight_trains ? v * h * 4 : 0);
  b.forward_transient = rows * v * (d + 4 + d) + (weight_trains && d == 4 ? v * h * d : 0);
  b.backward_transient = weight_trains && d < 4 ? v * h * d : 0;
  b.freed_by_backward = weight_trains && d < 4 ? v * h * (4 - d) : 0;
  return b;
}

}  // namespace memplan
