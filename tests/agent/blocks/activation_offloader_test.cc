#include "agent/blocks/activation_offloader.h"

#include <c10/cuda/CUDACachingAllocator.h>
#include <gtest/gtest.h>

#include <vector>

namespace memplan {
namespace {

std::unique_ptr<ActivationOffloader> MakeOffloader(ActivationOffloadOptions options = {}) {
  auto offloader = ActivationOffloader::Create(options);
  EXPECT_TRUE(offloader.ok()) << offloader.status();
  return std::move(offloader).value();
}

// The GPU tests' setup: an offloader on CUDA device 0 with default options, fp32 options on that
// device and 64 MiB of them.
struct GpuCase {
  std::unique_ptr<ActivationOffloader> offloader;
  torch::TensorOptions f32;
};
constexpr int64_t kGpuElems = int64_t{16} << 20;  // 64 MiB of fp32
GpuCase MakeGpuCase(bool exact_pinned_host = false) {
  ActivationOffloadOptions options;
  options.device = torch::Device(torch::kCUDA, 0);
  options.exact_pinned_host = exact_pinned_host;
  return {MakeOffloader(options),
          torch::TensorOptions().dtype(torch::kFloat32).device(options.device)};
}

TEST(ActivationOffloaderTest, RejectsBadOptions) {
  ActivationOffloadOptions options;
  options.max_in_flight_groups = 0;
  EXPECT_EQ(ActivationOffloader::Create(options).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(ActivationOffloaderTest, PinnedOnCpuFallsBackToPageable) {
  auto offloader = MakeOffloader();
  EXPECT_FALSE(offloader->Stats().pinned);
}

TEST(ActivationOffloaderTest, InputRoundTripKeepsValuesAndLayout) {
  auto offloader = MakeOffloader();
  torch::Tensor x = torch::randn({3, 5}).t();  // non-contiguous but dense
  offloader->OffloadInput(4, x);
  offloader->EndForwardGroup(4);
  EXPECT_EQ(offloader->Stats().host_bytes, 15 * 4);
  offloader->Prefetch(4);
  torch::Tensor back = offloader->TakeInput(4);
  EXPECT_TRUE(torch::equal(back, x));
  EXPECT_EQ(back.strides(), x.strides());
  EXPECT_NE(back.data_ptr(), x.data_ptr());  // a copy, as on a GPU
  EXPECT_EQ(offloader->Stats().synchronous_fetches, 0);
  offloader->Clear(4);
  EXPECT_EQ(offloader->Stats().host_bytes, 0);
  EXPECT_EQ(offloader->Stats().host_bytes_peak, 15 * 4);
}

// [Pageable host pool] Pageable host copies of a step go back to the pool when their group is
// cleared, and the next step's copies of the same sizes are written into them: same values and
// layout, no new host memory, and the pool never holds more than the largest live amount.
TEST(ActivationOffloaderTest, PageableCopiesReuseTheLastStepsHostMemory) {
  auto offloader = MakeOffloader();  // on the CPU: pageable
  ASSERT_FALSE(offloader->Stats().pinned);
  std::vector<void*> first_step;
  for (int step = 0; step < 2; ++step) {
    SCOPED_TRACE(step);
    std::vector<torch::Tensor> inputs;
    for (int g = 0; g < 3; ++g) {
      inputs.push_back(torch::randn({4 + g, 6}).t());  // three sizes, dense, non-contiguous
      offloader->OffloadInput(g, inputs.back());
      offloader->EndForwardGroup(g);
    }
    EXPECT_EQ(offloader->Stats().pageable_reuses, step == 0 ? 0 : 3);
    for (int g = 2; g >= 0; --g) {
      offloader->Prefetch(g);
      torch::Tensor back = offloader->TakeInput(g);
      EXPECT_TRUE(torch::equal(back, inputs[g]));
      EXPECT_EQ(back.strides(), inputs[g].strides());
      offloader->Clear(g);
    }
  }
  EXPECT_EQ(offloader->Stats().host_bytes, 0);
  EXPECT_EQ(offloader->Stats().host_bytes_peak, (4 + 5 + 6) * 6 * 4);
  // A size never seen before gets fresh memory.
  offloader->OffloadInput(7, torch::randn({9, 6}));
  EXPECT_EQ(offloader->Stats().pageable_reuses, 3);
}

TEST(ActivationOffloaderTest, TakeWithoutPrefetchFetchesSynchronously) {
  auto offloader = MakeOffloader();
  torch::Tensor x = torch::arange(6.0);
  offloader->OffloadInput(1, x);
  EXPECT_TRUE(torch::equal(offloader->TakeInput(1), x));
  EXPECT_EQ(offloader->Stats().synchronous_fetches, 1);
  EXPECT_THROW(offloader->TakeInput(1), c10::Error);  // taken already
}

TEST(ActivationOffloaderTest, SwapScopeOffloadsSavedActivationsButNotParameters) {
  auto offloader = MakeOffloader();
  torch::Tensor w = torch::randn({4, 4}).requires_grad_(true);
  torch::Tensor x = torch::randn({2, 4}).requires_grad_(true);
  torch::Tensor y;
  {
    auto scope = offloader->BeginSwap(1, x);
    // mm saves x and w; sin saves mm's output.
    y = torch::sin(torch::mm(x, w)).sum();
  }
  const auto stats = offloader->Stats();
  EXPECT_EQ(stats.passthrough_tensors, 1);                // w
  EXPECT_EQ(stats.offloaded_bytes, (2 * 4 + 2 * 4) * 4);  // x and mm(x, w)
  // Outside the scope nothing is hooked.
  torch::sin(torch::mm(x, w)).sum();
  EXPECT_EQ(offloader->Stats().offloaded_bytes, stats.offloaded_bytes);

  offloader->Prefetch(1);
  y.backward();
  torch::Tensor gx = x.grad().clone();
  torch::Tensor gw = w.grad().clone();
  x.mutable_grad().reset();
  w.mutable_grad().reset();
  torch::sin(torch::mm(x, w)).sum().backward();
  EXPECT_TRUE(torch::equal(gx, x.grad()));
  EXPECT_TRUE(torch::equal(gw, w.grad()));
  EXPECT_EQ(offloader->Stats().synchronous_fetches, 0);
}

// [One copy per saved tensor] x * x saves x twice and mm saves it a third time: it is copied to
// the host once (so a SWAP block moves and holds its saved storage once, as the profiler counts
// it), every unpack gets its values, and the gradients equal the unhooked run's.
TEST(ActivationOffloaderTest, ATensorSavedSeveralTimesIsCopiedOnce) {
  auto offloader = MakeOffloader();
  torch::Tensor w = torch::randn({4, 3}).requires_grad_(true);
  torch::Tensor x = torch::randn({2, 4}).requires_grad_(true);
  auto run = [&] { return (torch::mul(x, x).sum() + torch::mm(x, w).sin().sum()); };
  torch::Tensor y;
  {
    auto scope = offloader->BeginSwap(1, x);
    y = run();
  }
  const auto stats = offloader->Stats();
  EXPECT_EQ(stats.passthrough_tensors, 1);                // w
  EXPECT_EQ(stats.shared_saves, 2);                       // x's second and third saves
  EXPECT_EQ(stats.offloaded_bytes, (2 * 4 + 2 * 3) * 4);  // x once, and mm(x, w)
  offloader->Prefetch(1);
  y.backward();
  const torch::Tensor gx = x.grad().clone(), gw = w.grad().clone();
  x.mutable_grad().reset();
  w.mutable_grad().reset();
  run().backward();
  EXPECT_TRUE(torch::equal(gx, x.grad()));
  EXPECT_TRUE(torch::equal(gw, w.grad()));
  EXPECT_EQ(offloader->Stats().synchronous_fetches, 0);
  // The same tensor modified in place between two saves is a new version: copied again.
  torch::Tensor z = torch::randn({3}).requires_grad_(true);
  {
    auto scope = offloader->BeginSwap(2, z);
    torch::Tensor a = z * 1.0;  // saves no tensor
    torch::Tensor b = a * a;    // saves a twice: one copy
    a.mul_(2.0);
    torch::Tensor c = a * a;  // a's next version: one more copy
  }
  EXPECT_EQ(offloader->Stats().shared_saves, 4);
  EXPECT_EQ(offloader->Stats().offloaded_bytes, stats.offloaded_bytes + 2 * 3 * 4);
}

// [One copy per storage] Two views of one storage saved by different ops (as attention's output
// [b, heads, s, d] and o_proj's input [b, s, heads*d] share one buffer on a GPU) are copied once
// when the first copy spans the second; a view reaching past the copied span gets its own copy.
// Every unpack gets its own view's values: the gradients equal the unhooked run's.
TEST(ActivationOffloaderTest, ViewsOfOneStorageAreCopiedOnce) {
  auto offloader = MakeOffloader();
  torch::Tensor x = torch::randn({2, 3, 4}).requires_grad_(true);
  torch::Tensor w = torch::randn({4, 5}).requires_grad_(true);
  auto run = [&](torch::Tensor* big_out) {
    torch::Tensor big = x.exp();                       // [2, 3, 4], saved by exp itself
    torch::Tensor a = big.transpose(0, 1).sin();       // saves the transposed view
    torch::Tensor b = torch::mm(big.view({6, 4}), w);  // saves the flattened view
    torch::Tensor part = big.narrow(1, 0, 2);          // a view inside the copied span
    torch::Tensor c = part * part;
    torch::Tensor d = b.sin();  // saves mm's output
    if (big_out != nullptr) *big_out = big;
    return a.sum() + d.sum() + c.sum();
  };
  torch::Tensor y, big;
  {
    auto scope = offloader->BeginSwap(1, x);
    y = run(&big);
  }
  const auto stats = offloader->Stats();
  // exp saves its output (the whole storage): copied once; the transposed, flattened and narrowed
  // views share it. mm's output is a copy of its own.
  EXPECT_EQ(stats.offloaded_bytes, (2 * 3 * 4 + 6 * 5) * 4);
  EXPECT_EQ(stats.shared_saves, 4);  // transposed, flattened, narrowed twice
  offloader->Prefetch(1);
  y.backward();
  const torch::Tensor gx = x.grad().clone(), gw = w.grad().clone();
  x.mutable_grad().reset();
  w.mutable_grad().reset();
  run(nullptr).backward();
  EXPECT_TRUE(torch::equal(gx, x.grad()));
  EXPECT_TRUE(torch::equal(gw, w.grad()));

  // A narrowed view saved first is copied alone; a wider view of the same storage saved later
  // does not fit inside that copy and gets its own.
  torch::Tensor z = torch::randn({4, 3}).requires_grad_(true);
  torch::Tensor out;
  {
    auto scope = offloader->BeginSwap(2, z);
    torch::Tensor e = z * 2.0;  // saves nothing
    torch::Tensor head = e.narrow(0, 0, 2);
    torch::Tensor first = (head * head).sum();  // head: 6 values
    out = first + e.sin().sum();                // then e itself: 12
  }
  EXPECT_EQ(offloader->Stats().offloaded_bytes, stats.offloaded_bytes + (6 + 12) * 4);
}

// [Upload memory] on a GPU: uploads come from the compute stream's pool without record_stream on
// the prefetch stream. Block inputs of 64 MiB, prefetched one group ahead and taken in reverse
// order while the compute stream allocates and fills tensors of the same size: every value comes
// back, and a freed upload is reusable by the compute stream at once (no pending frees: the
// allocator's active bytes equal its allocated bytes). An upload dropped before its use (Clear
// right after Prefetch) does not write into memory the compute stream has been handed since.
TEST(ActivationOffloaderGpuTest, UploadsReturnValuesAndFreeWithoutPendingBytes) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  auto [offloader, f32] = MakeGpuCase();
  constexpr int64_t kElems = kGpuElems;
  constexpr int kGroups = 6;
  std::vector<torch::Tensor> expected;
  for (int g = 0; g < kGroups; ++g) {
    torch::Tensor x = torch::full({kElems}, static_cast<float>(g + 1), f32);
    expected.push_back(x.cpu());
    offloader->OffloadInput(g, x);
    offloader->EndForwardGroup(g);
  }
  torch::cuda::synchronize();
  const auto index = static_cast<size_t>(c10::CachingDeviceAllocator::StatType::AGGREGATE);
  offloader->Prefetch(kGroups - 1);
  for (int g = kGroups - 1; g >= 0; --g) {
    if (g > 0) offloader->Prefetch(g - 1);  // the next upload is queued before this one's use
    torch::Tensor back = offloader->TakeInput(g);
    torch::Tensor filler = torch::empty({kElems}, f32).fill_(-1.0f);  // compute-stream work
    ASSERT_TRUE(torch::equal(back.cpu(), expected[g])) << "group " << g;
    back = torch::Tensor();
    const auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(0);
    EXPECT_EQ(stats.active_bytes[index].current, stats.allocated_bytes[index].current)
        << "freed uploads waiting on a side stream after group " << g;
    offloader->Clear(g);
  }
  // Dropped before use: the copy into the dropped block must finish before the compute stream
  // reuses it.
  for (int round = 0; round < 3; ++round) {
    torch::Tensor x = torch::full({kElems}, 7.0f, f32);
    offloader->OffloadInput(100, x);
    offloader->EndForwardGroup(100);
    x = torch::Tensor();
    offloader->Prefetch(100);
    offloader->Clear(100);
    torch::Tensor reused = torch::empty({kElems}, f32).fill_(-2.0f);
    torch::cuda::synchronize();
    EXPECT_TRUE((reused == -2.0f).all().item<bool>()) << "round " << round;
  }
}

// [Sources released in program order] The device tensor a copy reads is held until the end of
// the next group's forward (max_in_flight_groups = 2), then freed with its copy done: after each
// EndForwardGroup exactly one group's source is allocated, and nothing freed waits on a side
// stream (active bytes equal allocated bytes), so every step reuses the same memory in the same
// order. Backward's first Prefetch frees the last one.
TEST(ActivationOffloaderGpuTest, SourcesAreFreedAtTheEndOfTheNextGroup) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  auto [offloader, f32] = MakeGpuCase();
  constexpr int64_t kElems = kGpuElems;
  constexpr int64_t kBytes = kElems * 4;
  constexpr int kGroups = 5;
  const auto index = static_cast<size_t>(c10::CachingDeviceAllocator::StatType::AGGREGATE);
  torch::cuda::synchronize();
  const int64_t base =
      c10::cuda::CUDACachingAllocator::getDeviceStats(0).allocated_bytes[index].current;
  for (int g = 0; g < kGroups; ++g) {
    torch::Tensor x = torch::full({kElems}, static_cast<float>(g + 1), f32);
    offloader->OffloadInput(g, x);
    x = torch::Tensor();  // the caller lets go at once, as a block's forward does
    offloader->EndForwardGroup(g);
    const auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(0);
    EXPECT_EQ(stats.allocated_bytes[index].current - base, kBytes) << "after group " << g;
    EXPECT_EQ(stats.active_bytes[index].current, stats.allocated_bytes[index].current)
        << "freed sources waiting on a side stream after group " << g;
  }
  offloader->Prefetch(kGroups - 1);  // frees the last source, allocates its upload
  {
    const auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(0);
    EXPECT_EQ(stats.allocated_bytes[index].current - base, kBytes);
  }
  for (int g = kGroups - 1; g >= 0; --g) {
    if (g > 0) offloader->Prefetch(g - 1);
    torch::Tensor back = offloader->TakeInput(g);
    EXPECT_TRUE((back == static_cast<float>(g + 1)).all().item<bool>()) << "group " << g;
    offloader->Clear(g);
  }
}

// [Exact pinned host copies] Pinned copies at their exact size: the values come back, the copies
// stay pinned, and a second step writes into the storages the first one kept (one reuse per
// group), each only after the copies that used it finished.
TEST(ActivationOffloaderGpuTest, ExactPinnedCopiesComeBackAndAreReused) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  auto [offloader, f32] = MakeGpuCase(/*exact_pinned_host=*/true);
  constexpr int64_t kElems = kGpuElems + 3;  // not a power of two's worth of bytes
  constexpr int kGroups = 4;
  for (int step = 0; step < 2; ++step) {
    for (int g = 0; g < kGroups; ++g) {
      offloader->OffloadInput(g, torch::full({kElems}, static_cast<float>(10 * step + g), f32));
      offloader->EndForwardGroup(g);
    }
    offloader->Prefetch(kGroups - 1);
    for (int g = kGroups - 1; g >= 0; --g) {
      if (g > 0) offloader->Prefetch(g - 1);
      torch::Tensor back = offloader->TakeInput(g);
      EXPECT_TRUE((back == static_cast<float>(10 * step + g)).all().item<bool>())
          << "step " << step << " group " << g;
      offloader->Clear(g);
    }
    const ActivationOffloadStats stats = offloader->Stats();
    EXPECT_TRUE(stats.pinned);
    EXPECT_EQ(stats.host_bytes, 0);
    EXPECT_EQ(stats.host_bytes_peak, kGroups * kElems * 4) << "exact sizes, every group's copy";
    EXPECT_EQ(stats.exact_pinned_reuses, step == 0 ? 0 : kGroups) << "step " << step;
  }
}

}  // namespace
}  // namespace memplan
