#include "agent/cli/version_text.h"

#include <ATen/detail/CUDAHooksInterface.h>
#include <torch/version.h>

#include "absl/strings/str_cat.h"
#include "agent/dist/process_group.h"
#include "common/build_info.h"

namespace memplan {
namespace {

// CUDA and cuDNN encode versions as one integer: 12080 = 12.8 (CUDA), 90100 = 9.1.0 (cuDNN 9).
std::string CudaVersionText(long v) { return absl::StrCat(v / 1000, ".", (v % 1000) / 10); }
std::string CudnnVersionText(long v) {
  return absl::StrCat(v / 10000, ".", (v % 10000) / 100, ".", v % 100);
}

}  // namespace

std::string AgentVersionText() {
  std::string text = absl::StrCat(build_info::VersionLine("memplan-agent"), "\n");
  absl::StrAppend(&text, "torch ", TORCH_VERSION, "\n");
  const at::CUDAHooksInterface& cuda = at::detail::getCUDAHooks();
  // A CPU-only LibTorch has no CUDA hooks: the queries throw c10::Error.
  std::string cuda_runtime = "none";
  std::string cudnn = "none";
  try {
    if (cuda.hasCUDART()) cuda_runtime = CudaVersionText(cuda.versionCUDART());
  } catch (const c10::Error&) {
  }
  try {
    cudnn = CudnnVersionText(cuda.versionCuDNN());
  } catch (const c10::Error&) {
  }
  absl::StrAppend(&text, "cuda_runtime ", cuda_runtime, "\n", "cudnn ", cudnn, "\n", "nccl ",
                  NcclVersionText(), "\n");
  return text;
}

}  // namespace memplan
