// The dense reference both attention suites judge agent/model/attention.h against: every score of
// [seq, seq] computed with repeated kv heads, then transformers' eager order (scale, optional tanh
// cap, the causal or sliding-window mask, fp32 softmax cast back, product with v), by plain
// autograd.
#pragma once

#include <cmath>
#include <cstdint>

#include "agent/core/torch_pch.h"

namespace memplan {

// q: [batch, heads, seq, dim]; k, v: [batch, kv_heads, seq, dim]. The query at i sees the keys j
// with j <= i and, when window > 0, i - j < window. cap 0: no cap.
inline torch::Tensor DenseAttention(const torch::Tensor& q, const torch::Tensor& k,
                                    const torch::Tensor& v, int64_t window, double scale,
                                    double cap = 0.0) {
  const int64_t groups = q.size(1) / k.size(1);
  const torch::Tensor kr = k.repeat_interleave(groups, 1);
  const torch::Tensor vr = v.repeat_interleave(groups, 1);
  const int64_t seq = q.size(2);
  const torch::Tensor i = torch::arange(seq).unsqueeze(1);
  const torch::Tensor j = torch::arange(seq).unsqueeze(0);
  torch::Tensor seen = j <= i;
  if (window > 0) seen = seen.logical_and(i - j < window);
  torch::Tensor s = torch::matmul(q, kr.transpose(-2, -1)) * scale;
  if (cap > 0) s = torch::tanh(s / cap) * cap;
  s = s.masked_fill(seen.logical_not(), -INFINITY);
  return torch::matmul(torch::softmax(s, -1, torch::kFloat32).to(q.scalar_type()), vr);
}

// Max |got - want| over max |want|, both in fp32; absolute where want is all zero (a one-token
// window's query and key gradients: a softmax over one key has none).
inline double RelErr(const torch::Tensor& got, const torch::Tensor& want) {
  const double scale = want.abs().max().item<double>();
  return (got.to(torch::kFloat32) - want.to(torch::kFloat32)).abs().max().item<double>() /
         (scale > 0 ? scale : 1.0);
}

}  // namespace memplan
