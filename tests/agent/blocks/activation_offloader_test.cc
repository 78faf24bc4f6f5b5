#include "agent/blocks/activation_offloader.h"

#include <gtest/gtest.h>

namespace memplan {
namespace {

std::unique_ptr<ActivationOffloader> MakeOffloader(ActivationOffloadOptions options = {}) {
  auto offloader = ActivationOffloader::Create(options);
  EXPECT_TRUE(offloader.ok()) << offloader.status();
  return std::move(offloader).value();
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

}  // namespace
}  // namespace memplan
