#include "agent/model/osft.h"

#include <algorithm>
#include <cmath>
#include <tuple>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "agent/model/osft_options.h"

namespace memplan {
namespace {

constexpr const char* kHighSuffixes[] = {".osft_u_high", ".osft_s_high", ".osft_v_high"};
constexpr const char* kLowSuffixes[] = {".osft_u_low", ".osft_s_low", ".osft_v_low"};

// W = U diag(S) V^T with V (not V^T) returned. On CUDA the default drivers (gesvd, gesvdj) take
// about 1 s for one 4096 x 4096 fp32 matrix on an H200, so an 8B model's 224 targets took minutes
// before the first step; cuSOLVER's gesvda takes 0.13-0.28 s for the same shapes. gesvda wants a
// tall matrix (the wide ones are decomposed transposed) and its accuracy depends on the
// conditioning, so its result is checked by reconstruction and replaced by the default driver's
// where it misses by more than 1e-4 relative (bf16 weights round at 4e-3). On the CPU, the
// default (gesdd) throughout.
std::tuple<torch::Tensor, torch::Tensor, torch::Tensor> ThinSvd(const torch::Tensor& w) {
  if (w.is_cuda()) {
    const bool wide = w.size(0) < w.size(1);
    const torch::Tensor tall = wide ? w.t() : w;
    auto [u, s, vh] = torch::linalg_svd(tall, /*full_matrices=*/false, "gesvda");
    const double miss = (torch::mm(u * s, vh) - tall).norm().item<double>() /
                        std::max(tall.norm().item<double>(), 1e-30);
    if (std::isfinite(miss) && miss < 1e-4) {
      torch::Tensor v = vh.transpose(0, 1);
      return wide ? std::make_tuple(v, s, u) : std::make_tuple(u, s, v);
    }
  }
  auto [u, s, vh] = torch::linalg_svd(w, /*full_matrices=*/false);
  return {u, s, vh.transpose(0, 1)};
}
}  // namespace

OsftFactors OsftSplit(const torch::Tensor& weight, double rank_ratio, const torch::Device& compute,
                      const torch::TensorOptions& store) {
  torch::NoGradGuard no_grad;
  TORCH_CHECK(weight.dim() == 2, "OSFT splits a matrix; got ", weight.dim(), " dimensions");
  const torch::Tensor w = weight.detach().to(compute, torch::kFloat32);
  auto [u, s, v] = ThinSvd(w);
  // The SVD fixes each singular pair only up to a common sign: choosing it from U makes two
  // runs (and the reference) agree factor by factor, not only in their product.
  torch::Tensor signs = torch::sign(u.gather(0, u.abs().argmax(0, /*keepdim=*/true)));
  signs = torch::where(signs == 0, torch::ones_like(signs), signs);
  u = u * signs;
  v = v * signs;
  const OsftRanks ranks = OsftSplitRanks(w.size(0), w.size(1), rank_ratio);
  TORCH_CHECK(ranks.low > 0, "OSFT: a [", w.size(0), ", ", w.size(1),
              "] weight has no spectrum to split");
  auto part = [&store](const torch::Tensor& t, int64_t dim, int64_t begin, int64_t len,
                       bool trainable) {
    return t.narrow(dim, begin, len).contiguous().to(store).requires_grad_(trainable);
  };
  OsftFactors f;
  f.u_high = part(u, 1, 0, ranks.high, false);
  f.s_high = part(s, 0, 0, ranks.high, false);
  f.v_high = part(v, 1, 0, ranks.high, false);
  f.u_low = part(u, 1, ranks.high, ranks.low, true);
  f.s_low = part(s, 0, ranks.high, ranks.low, true);
  f.v_low = part(v, 1, ranks.high, ranks.low, true);
  return f;
}

OsftFactors OsftZeroFactors(int64_t out_features, int64_t in_features, double rank_ratio,
                            const torch::TensorOptions& store) {
  const OsftRanks ranks = OsftSplitRanks(out_features, in_features, rank_ratio);
  TORCH_CHECK(ranks.low > 0, "OSFT: a [", out_features, ", ", in_features,
              "] weight has no spectrum to split");
  auto zeros = [&store](std::vector<int64_t> shape, bool trainable) {
    return torch::zeros(shape, store).requires_grad_(trainable);
  };
  OsftFactors f;
  f.u_high = zeros({out_features, ranks.high}, false);
  f.s_high = zeros({ranks.high}, false);
  f.v_high = zeros({in_features, ranks.high}, false);
  f.u_low = zeros({out_features, ranks.low}, true);
  f.s_low = zeros({ranks.low}, true);
  f.v_low = zeros({in_features, ranks.low}, true);
  return f;
}

torch::Tensor OsftLinear(const torch::Tensor& x, const OsftFactors& f, const torch::Tensor& bias) {
  const torch::Tensor x2 = x.reshape({-1, x.size(-1)});
  const torch::Tensor high = torch::mm(x2, f.v_high) * f.s_high;
  torch::Tensor y = bias.defined() ? torch::addmm(bias, high, f.u_high.t())
                                   : torch::mm(high, f.u_high.t());
  // In place: neither product keeps its output for backward, so autograd allows it, and the
  // low part needs no second [rows, out] tensor.
  y.addmm_(torch::mm(x2, f.v_low) * f.s_low, f.u_low.t());
  std::vector<int64_t> shape = x.sizes().vec();
  shape.back() = y.size(-1);
  return y.view(shape);
}

void ProjectOsftGrads(const OsftFactors& f) {
  torch::NoGradGuard no_grad;
  // Two thin products each ([k_high, out]·[out, k_low], then back): the k_low x k_low and
  // out x out matrices of the dense projector never exist.
  if (torch::Tensor g = f.u_low.grad(); g.defined()) {
    g.sub_(torch::mm(f.u_high, torch::mm(f.u_high.t(), g)));
  }
  if (torch::Tensor g = f.v_low.grad(); g.defined()) {
    g.sub_(torch::mm(f.v_high, torch::mm(f.v_high.t(), g)));
  }
}

std::vector<NamedParam> OsftFrozenNamed(const std::string& module_path, const OsftFactors& f) {
  return {{module_path + kHighSuffixes[0], f.u_high},
          {module_path + kHighSuffixes[1], f.s_high},
          {module_path + kHighSuffixes[2], f.v_high}};
}

std::vector<NamedParam> OsftTrainableNamed(const std::string& module_path, const OsftFactors& f) {
  return {{module_path + kLowSuffixes[0], f.u_low},
          {module_path + kLowSuffixes[1], f.s_low},
          {module_path + kLowSuffixes[2], f.v_low}};
}

std::vector<std::pair<std::string, int>> ExpandOsftOrder(
    const std::vector<std::pair<std::string, int>>& order,
    const std::function<bool(const std::string&)>& listed) {
  std::vector<std::pair<std::string, int>> out;
  out.reserve(order.size());
  for (const auto& [name, group] : order) {
    if (absl::EndsWith(name, ".weight") && !listed(name)) {
      const std::string path = name.substr(0, name.size() - 7);
      if (listed(path + kHighSuffixes[0])) {
        for (const char* suffix : kHighSuffixes) out.emplace_back(path + suffix, group);
        continue;
      }
    }
    out.emplace_back(name, group);
  }
  return out;
}

}  // namespace memplan
