// ChunkedHeadLoss: the LM head and cross-entropy over a row chunk of tokens at a time, the loss's
// gradients computed in forward so the whole sequence's logits never exist ([Chunked head],
// common/head_chunking.h, which says when the model chunks and how many rows).
#pragma once

#include <cstdint>

#include "agent/core/torch_pch.h"

namespace memplan {

// The mean cross-entropy (targets of -100 ignored) of the logits x·wᵀ against `targets`, `rows`
// tokens at a time; x is [..., H] (leading dimensions are tokens), w is [V, H]. softcap > 0 caps
// the logits as tanh(z / softcap) * softcap in the model dtype (Gemma 2's
// final_logit_softcapping). With autograd recording, the result is one node whose backward only
// scales the gradients forward computed: it does not read `w` (a chunk manager may have moved it).
torch::Tensor ChunkedHeadLoss(const torch::Tensor& x, const torch::Tensor& w,
                              const torch::Tensor& targets, int64_t rows, double softcap);

}  // namespace memplan
