// memplan-adamw8bit-parity IN OUT: runs memplan's 8-bit AdamW (agent/chunks/cpu_adamw.h) for the
// tensors and gradients in IN (safetensors), checks that the LibTorch path
// (agent/chunks/adamw8bit_torch.h) gives the same bits, and writes the final parameters and
// 8-bit states to OUT, for adamw8bit_parity_test.py to compare with bitsandbytes.
// IN: "hparams" (float64: lr, beta1, beta2, eps, weight_decay, steps, clip), and per tensor
// "<name>" (fp32 or bf16, the initial values) and "<name>.grad<k>" for k = 1..steps (its dtype).
// OUT: "<name>", "<name>.exp_avg.q8", "<name>.exp_avg.absmax", "<name>.exp_avg_sq.q8",
// "<name>.exp_avg_sq.absmax".
#include <cstdio>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "agent/chunks/adamw8bit_torch.h"
#include "agent/chunks/cpu_adamw.h"
#include "agent/chunks/torch_sqrt.h"
#include "agent/io/safetensors_torch.h"

int main(int argc, char** argv) {
  using namespace memplan;
  if (argc != 3) {
    std::fprintf(stderr, "usage: memplan-adamw8bit-parity IN.safetensors OUT.safetensors\n");
    return 2;
  }
  absl::StatusOr<std::vector<NamedParam>> in = io::ReadSafetensorsFile(argv[1]);
  if (!in.ok()) {
    std::fprintf(stderr, "%s\n", std::string(in.status().message()).c_str());
    return 1;
  }
  std::map<std::string, torch::Tensor> by_name;
  for (const NamedParam& t : *in) by_name[t.name] = t.param;
  if (by_name.count("hparams") == 0 || by_name["hparams"].numel() != 7) {
    std::fprintf(stderr, "IN: \"hparams\" must hold 7 float64 values\n");
    return 1;
  }
  const torch::Tensor h = by_name["hparams"].to(torch::kFloat64);
  const AdamWOptions o{h[0].item<double>(), h[1].item<double>(), h[2].item<double>(),
                       h[3].item<double>(), h[4].item<double>()};
  const int64_t steps = static_cast<int64_t>(h[5].item<double>());
  const float clip = static_cast<float>(h[6].item<double>());
  const QuantMapTensors maps = MakeQuantMapTensors(torch::kCPU);
  std::vector<NamedParam> out;
  for (const auto& [name, init] : by_name) {
    if (name == "hparams" || absl::StrContains(name, ".grad")) continue;
    const int64_t n = init.numel(), blocks = (n + 255) / 256;
    torch::Tensor p = init.contiguous().clone(), q = p.clone();
    std::vector<torch::Tensor> st = {torch::zeros({n}, torch::kUInt8),
                                     torch::zeros({n}, torch::kUInt8), torch::zeros({blocks}),
                                     torch::zeros({blocks})};
    std::vector<torch::Tensor> st2;
    for (const torch::Tensor& t : st) st2.push_back(t.clone());
    const torch::Tensor coef = clip != 1.0f ? torch::full({}, clip) : torch::Tensor();
    for (int64_t k = 1; k <= steps; ++k) {
      const auto it = by_name.find(absl::StrCat(name, ".grad", k));
      if (it == by_name.end()) {
        std::fprintf(stderr, "IN: missing %s.grad%lld\n", name.c_str(),
                     static_cast<long long>(k));
        return 1;
      }
      const torch::Tensor g = it->second.contiguous();
      const AdamWStepScalars s = MakeAdamWStepScalars(o, k);
      if (p.scalar_type() == torch::kBFloat16) {
        AdamW8bitUpdateBf16(s, clip, n, QuantBlocks{},
                            reinterpret_cast<uint16_t*>(p.data_ptr<at::BFloat16>()),
                            reinterpret_cast<const uint16_t*>(g.data_ptr<at::BFloat16>()),
                            st[0].data_ptr<uint8_t>(), st[1].data_ptr<uint8_t>(),
                            st[2].data_ptr<float>(), st[3].data_ptr<float>(), &TorchSqrt);
      } else {
        AdamW8bitUpdate(s, clip, n, QuantBlocks{}, p.data_ptr<float>(), g.data_ptr<float>(),
                        st[0].data_ptr<uint8_t>(), st[1].data_ptr<uint8_t>(),
                        st[2].data_ptr<float>(), st[3].data_ptr<float>(), &TorchSqrt);
      }
      AdamW8bitTorchUpdate(o, k, coef, maps, q, g, st2[0], st2[1], st2[2], st2[3]);
    }
    bool same = torch::equal(p, q);
    for (int i = 0; i < 4; ++i) same = same && torch::equal(st[i], st2[i]);
    if (!same) {
      std::fprintf(stderr, "%s: the CPU kernel and the LibTorch path differ\n", name.c_str());
      return 1;
    }
    out.push_back({name, p});
    out.push_back({name + ".exp_avg.q8", st[0].view(init.sizes())});
    out.push_back({name + ".exp_avg.absmax", st[2]});
    out.push_back({name + ".exp_avg_sq.q8", st[1].view(init.sizes())});
    out.push_back({name + ".exp_avg_sq.absmax", st[3]});
  }
  if (const absl::Status s = io::SaveSafetensorsFile(argv[2], out); !s.ok()) {
    std::fprintf(stderr, "%s\n", std::string(s.message()).c_str());
    return 1;
  }
  return 0;
}
