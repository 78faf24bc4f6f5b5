// memplan-nf4-bench [ROWS COLS [REPS]]: NF4 dequantization throughput to bf16 on GPU 0, LibTorch
// ops against the CUDA kernel (when built), for one weight shape (default: Qwen2.5-32B's MLP
// projection, 27648 x 5120). GB/s counts the NF4 bytes read plus the bf16 bytes written. Prints
// one line per path; exits 0 with a note when no CUDA device is present.
#include <chrono>
#include <cstdio>
#include <functional>

#include "absl/strings/numbers.h"
#include "agent/quant/nf4.h"
#include "common/nf4_bytes.h"

int main(int argc, char** argv) {
  int64_t rows = 27648, cols = 5120, reps = 50;
  if ((argc >= 3 && (!absl::SimpleAtoi(argv[1], &rows) || !absl::SimpleAtoi(argv[2], &cols))) ||
      (argc >= 4 && !absl::SimpleAtoi(argv[3], &reps)) || rows <= 0 || cols <= 0 || reps <= 0) {
    std::fprintf(stderr, "usage: memplan-nf4-bench [ROWS COLS [REPS]] (positive integers)\n");
    return 2;
  }
  if (!torch::cuda::is_available()) {
    std::printf("no CUDA device: nothing to measure\n");
    return 0;
  }
  using memplan::quant::Nf4Tensor;
  const torch::Tensor w =
      torch::randn({rows, cols}, torch::dtype(torch::kBFloat16).device(torch::kCUDA));
  absl::StatusOr<Nf4Tensor> q = memplan::quant::QuantizeNf4(w);
  if (!q.ok()) {
    std::fprintf(stderr, "%s\n", std::string(q.status().message()).c_str());
    return 1;
  }
  const double bytes =
      static_cast<double>(memplan::Nf4Parts(w.numel()).total() + w.numel() * 2);
  auto time = [&](const std::function<void()>& fn) {
    fn();
    torch::cuda::synchronize();
    const auto t0 = std::chrono::steady_clock::now();
    for (int64_t i = 0; i < reps; ++i) fn();
    torch::cuda::synchronize();
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() /
           static_cast<double>(reps);
  };
  const double ops = time([&] { memplan::quant::DequantizeNf4Ops(*q, torch::kBFloat16); });
  std::printf("nf4 dequant %lld x %lld -> bf16  ops     %8.3f ms  %7.1f GB/s\n",
              static_cast<long long>(rows), static_cast<long long>(cols), ops * 1e3,
              bytes / ops / 1e9);
  if (memplan::quant::Nf4CudaKernelBuilt()) {
    const double kernel =
        time([&] { (void)memplan::quant::DequantizeNf4Kernel(*q, torch::kBFloat16); });
    std::printf("nf4 dequant %lld x %lld -> bf16  kernel  %8.3f ms  %7.1f GB/s\n",
                static_cast<long long>(rows), static_cast<long long>(cols), kernel * 1e3,
                bytes / kernel / 1e9);
  } else {
    std::printf("kernel: not built (no nvcc at configure time)\n");
  }
  return 0;
}
