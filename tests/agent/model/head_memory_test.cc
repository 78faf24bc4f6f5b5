// What the chunked LM head and the final norm allocate on the CPU (MemoryProbe over c10's CPU
// allocator) against the analytic trace's head ([Chunked head], [Head backward in two stages],
// planner/cost/analytic_trace.cc): the set forward leaves for backward, and backward's peak above
// it. The head's own backward adds only the weight gradient's cast (the input gradient is scaled
// in place); the final norm's backward runs after it, once the fp32 sum is gone. That second stage
// is priced at 12 bytes a value, a bound for the norm's CUDA kernels (an fp32 product and the bf16
// input gradient); the CPU's eager fallback, which is not planned, holds about 26, so only a head
// whose first stage is the larger is checked here.
#include <gtest/gtest.h>

#include <cstdio>
#include <memory>

#include "agent/model/chunked_head.h"
#include "agent/model/layers.h"
#include "agent/profiler/memory_probe.h"
#include "common/head_chunking.h"
#include "common/presets.h"
#include "planner/cost/analytic_trace.h"
#include "tests/agent/model/memory_ratio.h"
#include "tests/agent/tiny_spec.h"

namespace memplan {
namespace {

const bool kSingleThread = [] {
  torch::set_num_threads(1);
  return true;
}();

struct Measured {
  int64_t saved = 0;           // left by forward, the loss excluded
  int64_t backward_extra = 0;  // backward's peak above its start
};

// The final norm and the chunked head of a full fine-tune (head weight and norm weight train),
// bf16, `tokens` tokens of hidden size h, vocabulary v, chunks of `logit_bytes` fp32 logits. The
// input stands for the last block's output and exists before the probe, as the targets do.
Measured Measure(int64_t h, int64_t v, int64_t tokens, int64_t logit_bytes) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(3);
  const auto bf16 = torch::TensorOptions().dtype(torch::kBFloat16);
  const torch::Tensor x = torch::randn({1, tokens, h}, gen).to(torch::kBFloat16).requires_grad_();
  const torch::Tensor norm_w = torch::ones({h}, bf16).requires_grad_();
  const torch::Tensor w = (torch::randn({v, h}, gen) * 0.05).to(torch::kBFloat16).requires_grad_();
  const torch::Tensor targets = torch::randint(0, v, {1, tokens}, gen);
  Measured m;
  std::unique_ptr<MemoryProbe> probe = MemoryProbe::Create(torch::kCPU);
  const torch::Tensor loss = ChunkedHeadLoss(RmsNorm(x, norm_w, 1e-6), w, targets,
                                             HeadChunkRows(v, logit_bytes), /*softcap=*/0);
  m.saved = probe->AllocatedBytes() - static_cast<int64_t>(loss.nbytes());
  probe->ResetPeak();
  const int64_t start = probe->AllocatedBytes();
  loss.backward();
  m.backward_extra = probe->PeakAllocatedBytes() - start;
  return m;
}

Trace Priced(int64_t h, int64_t v, int64_t tokens, int64_t logit_bytes) {
  ModelSpec s = testing::TinySpec();
  s.hidden_size = h;
  s.vocab_size = v;
  Workload w;
  w.micro_batch = 1;
  w.seq_len = tokens;
  const HardwareSpec hw = *FindHardwarePreset("h200");
  auto t = SynthesizeTrace(s, w, DType::kBFloat16, TrainingMethod{}, hw);
  EXPECT_TRUE(t.ok()) << t.status();
  return RepriceHeadChunks(*t, hw, 0, logit_bytes);
}

// A vocabulary-heavy head (V·H large against T·H): its backward peaks at the weight gradient's
// cast beside the fp32 sum. The planner's transient is that cast within 2 % of what the CPU
// allocates (the loss's scalars and the norm weight's gradient on top), not under; before, it also
// charged the input gradient and the final norm's temporaries at the same time (+44 % here).
TEST(HeadMemoryTest, HeadBackwardPeaksAtTheWeightGradientCast) {
  const int64_t h = 128, v = 4096, tokens = 256, logit_bytes = kMinHeadChunkLogitBytes;
  ASSERT_EQ(HeadChunkRows(v, logit_bytes), 64);
  ASSERT_TRUE(HeadIsChunked(tokens, v, h, logit_bytes));
  const Trace t = Priced(h, v, tokens, logit_bytes);
  const Measured m = Measure(h, v, tokens, logit_bytes);
  // The planner's head saved set also holds the norm's input (the last block's output) and the
  // targets' 8 bytes a token, which exist before the probe here.
  const int64_t predicted_saved = t.head.saved_bytes - tokens * (2 * h + 8);
  std::printf("saved %lld predicted %lld; backward %lld predicted %lld\n",
              static_cast<long long>(m.saved), static_cast<long long>(predicted_saved),
              static_cast<long long>(m.backward_extra),
              static_cast<long long>(t.head.backward_transient_bytes));
  EXPECT_NEAR(MemoryRatio(predicted_saved, m.saved), 1.0, 0.01);
  EXPECT_EQ(t.head.backward_transient_bytes, v * h * 2);
  EXPECT_GE(MemoryRatio(t.head.backward_transient_bytes, m.backward_extra), 0.98);
  EXPECT_LE(MemoryRatio(t.head.backward_transient_bytes, m.backward_extra), 1.02);
}

}  // namespace
}  // namespace memplan
