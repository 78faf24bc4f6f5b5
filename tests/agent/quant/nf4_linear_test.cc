#include "agent/quant/nf4_linear.h"

#include <gtest/gtest.h>

namespace memplan::quant {
namespace {

struct Case {
  torch::Tensor x, w, bias, grad_out;
  Nf4Tensor q;
};

Case MakeCase(torch::ScalarType dtype) {
  torch::manual_seed(3);
  Case c;
  c.x = torch::randn({3, 7, 64}).to(dtype);
  c.w = torch::randn({48, 64}) * 0.05;
  c.bias = torch::randn({48}).to(dtype);
  c.grad_out = torch::randn({3, 7, 48}).to(dtype);
  absl::StatusOr<Nf4Tensor> q = QuantizeNf4(c.w);
  EXPECT_TRUE(q.ok()) << q.status();
  c.q = *std::move(q);
  return c;
}

// Forward and input gradient of the plain linear on the dequantized weight.
std::pair<torch::Tensor, torch::Tensor> Reference(const Case& c) {
  const torch::Tensor x = c.x.detach().clone().requires_grad_(true);
  const torch::Tensor y = torch::linear(x, DequantizeNf4(c.q, c.x.scalar_type()), c.bias);
  y.backward(c.grad_out);
  return {y.detach(), x.grad()};
}

TEST(Nf4LinearTest, EqualsALinearOnTheDequantizedWeight) {
  for (torch::ScalarType dtype : {torch::kFloat32, torch::kBFloat16}) {
    const Case c = MakeCase(dtype);
    const auto [y_ref, gx_ref] = Reference(c);
    const torch::Tensor x = c.x.detach().clone().requires_grad_(true);
    const torch::Tensor y = Nf4Linear(x, c.q, c.bias);
    EXPECT_TRUE(torch::equal(y.detach(), y_ref)) << dtype;
    y.backward(c.grad_out);
    // The same GEMM as linear's backward on the same operands.
    EXPECT_TRUE(torch::equal(x.grad(), gx_ref)) << dtype;
    EXPECT_FALSE(c.q.data.grad().defined());
  }
}

TEST(Nf4LinearTest, BackwardDequantizesTheCurrentStorage) {
  // A chunk manager swaps a parameter's storage (set_data) between forward and backward; backward
  // must read the NF4 bytes where they are then, not where they were in forward.
  const Case c = MakeCase(torch::kFloat32);
  const auto [y_ref, gx_ref] = Reference(c);
  const torch::Tensor x = c.x.detach().clone().requires_grad_(true);
  const torch::Tensor y = Nf4Linear(x, c.q, c.bias);
  torch::Tensor old = c.q.data.detach();
  torch::Tensor data = c.q.data;  // the handle the model and the autograd node share
  data.set_data(old.clone());
  old.zero_();  // what forward read is gone
  y.backward(c.grad_out);
  EXPECT_TRUE(torch::equal(x.grad(), gx_ref));
}

TEST(Nf4LinearTest, WithoutBias) {
  const Case c = MakeCase(torch::kFloat32);
  const torch::Tensor y = Nf4Linear(c.x, c.q);
  EXPECT_TRUE(torch::equal(y, torch::linear(c.x, DequantizeNf4(c.q, torch::kFloat32))));
}

}  // namespace
}  // namespace memplan::quant
