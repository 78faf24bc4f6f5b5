// memplan-nf4-dump IN OUT [BLOCKSIZE]: quantizes every tensor of the safetensors file IN to NF4
// (agent/quant/nf4.h) and writes OUT with, per input tensor X: X.data, X.absmax_code,
// X.absmax_scale, X.absmax_offset (fp32 [1]), X.deq_fp32 and X.deq_bf16 (DequantizeNf4); plus
// "dynamic_map". Driven by nf4_bnb_parity_test.py.
#include <cstdio>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "agent/io/safetensors_torch.h"
#include "agent/quant/nf4.h"

int main(int argc, char** argv) {
  using memplan::NamedParam;
  if (argc < 3 || argc > 4) {
    std::fprintf(stderr, "usage: memplan-nf4-dump IN.safetensors OUT.safetensors [BLOCKSIZE]\n");
    return 2;
  }
  int64_t blocksize = 64;
  if (argc == 4 && !absl::SimpleAtoi(argv[3], &blocksize)) {
    std::fprintf(stderr, "BLOCKSIZE: not an integer: %s\n", argv[3]);
    return 2;
  }
  absl::StatusOr<std::vector<NamedParam>> in = memplan::io::ReadSafetensorsFile(argv[1]);
  if (!in.ok()) {
    std::fprintf(stderr, "%s\n", std::string(in.status().message()).c_str());
    return 1;
  }
  std::vector<NamedParam> out;
  out.push_back({"dynamic_map", memplan::quant::DynamicMap8Bit()});
  for (const NamedParam& p : *in) {
    absl::StatusOr<memplan::quant::Nf4Tensor> q = memplan::quant::QuantizeNf4(p.param, blocksize);
    if (!q.ok()) {
      std::fprintf(stderr, "%s: %s\n", p.name.c_str(), std::string(q.status().message()).c_str());
      return 1;
    }
    out.push_back({p.name + ".data", q->data});
    out.push_back({p.name + ".absmax_code", q->absmax_code});
    out.push_back({p.name + ".absmax_scale", q->absmax_scale});
    out.push_back({p.name + ".absmax_offset", torch::tensor({q->absmax_offset}, torch::kFloat32)});
    out.push_back({p.name + ".deq_fp32", memplan::quant::DequantizeNf4(*q, torch::kFloat32)});
    out.push_back({p.name + ".deq_bf16", memplan::quant::DequantizeNf4(*q, torch::kBFloat16)});
  }
  if (absl::Status s = memplan::io::SaveSafetensorsFile(argv[2], out); !s.ok()) {
    std::fprintf(stderr, "%s\n", std::string(s.message()).c_str());
    return 1;
  }
  return 0;
}
