// memplan-gpu-adamw8bit-bench: parameters per second of the persistent chunks' 8-bit AdamW update
// on a GPU, as the chunk manager runs it (AdamW8bitTorchUpdate on one contiguous bf16 parameter:
// the fused CUDA kernel where the build has it; `ops` times the LibTorch-ops path instead), and
// the HBM rate its bytes would take (grad read, parameter and both moments' codes read and
// written: 10 B an element, common/optimizer_bytes.h).
// Usage: memplan-gpu-adamw8bit-bench [num_params (default 256M)] [reps (default 10)] [ops]
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "agent/chunks/adamw8bit_torch.h"
#include "agent/core/torch_pch.h"
#include "common/optimizer_bytes.h"

int main(int argc, char** argv) {
  if (argc > 1 && (std::string(argv[1]) == "-h" || std::string(argv[1]) == "--help")) {
    std::printf(
        "usage: memplan-gpu-adamw8bit-bench [num_params (default 268435456)] [reps (default 10)] "
        "[ops]\n");
    return 0;
  }
  if (!torch::cuda::is_available()) {
    std::fprintf(stderr, "memplan-gpu-adamw8bit-bench: no CUDA device\n");
    return 1;
  }
  const int64_t n = argc > 1 ? std::atoll(argv[1]) : int64_t{1} << 28;
  const int reps = argc > 2 ? std::atoi(argv[2]) : 10;
  const bool ops = argc > 3 && std::string(argv[3]) == "ops";
  if (n < 1 || reps < 1) {
    std::fprintf(stderr, "memplan-gpu-adamw8bit-bench: num_params and reps must be >= 1\n");
    return 2;
  }
  const torch::Device cuda(torch::kCUDA);
  const auto bf16 = torch::dtype(torch::kBFloat16).device(cuda);
  const int64_t blocks = memplan::QuantBlockCount(n);
  torch::Tensor param = torch::randn({n}, bf16);
  torch::Tensor grad = torch::randn({n}, bf16);
  torch::Tensor m = torch::zeros({n}, torch::dtype(torch::kUInt8).device(cuda));
  torch::Tensor v = m.clone();
  torch::Tensor am = torch::zeros({blocks}, torch::dtype(torch::kFloat32).device(cuda));
  torch::Tensor av = am.clone();
  const memplan::QuantMapTensors maps = memplan::MakeQuantMapTensors(cuda);
  const memplan::AdamWOptions options{1e-4, 0.9, 0.999, 1e-8, 0.01};
  const torch::Tensor clip = torch::full({}, 0.5f, torch::dtype(torch::kFloat32).device(cuda));
  auto step = [&](int64_t s) {
    memplan::AdamW8bitTorchUpdate(options, s, clip, maps, param, grad, m, v, am, av, {}, ops);
  };
  step(1);
  step(2);
  torch::cuda::synchronize();
  const auto start = std::chrono::steady_clock::now();
  for (int r = 0; r < reps; ++r) step(3 + r);
  torch::cuda::synchronize();
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() / reps;
  std::printf("%s n=%lld: %.3f ms a pass, %.3g params/s, %.0f GB/s over 10 B an element\n",
              ops ? "ops" : (memplan::AdamW8bitFusedKernelBuilt() ? "fused" : "ops (no kernel)"),
              static_cast<long long>(n), seconds * 1e3, static_cast<double>(n) / seconds,
              10.0 * static_cast<double>(n) / seconds / 1e9);
  return 0;
}
