#include "agent/bench/hardware_bench.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>

#include "agent/chunks/torch_sqrt.h"
#include "agent/core/torch_pch.h"
#include "common/validate.h"

namespace memplan {
namespace {

using ::testing::HasSubstr;

HardwareBenchOptions SmallOptions(std::vector<std::string>* lines) {
  HardwareBenchOptions o;
  o.adam_params = int64_t{1} << 20;
  o.adam_repetitions = 1;
  o.adam_min_seconds = 0.01;
  o.adam_threads = 2;
  o.transfer_bytes = int64_t{64} << 20;
  o.transfer_repetitions = 2;
  o.hbm_copy_bytes = int64_t{256} << 20;
  o.matmul_size = 2048;
  o.matmul_repetitions = 2;
  o.progress = [lines](const std::string& line) { lines->push_back(line); };
  return o;
}

const BenchFigure* Find(const HardwareBenchResult& r, const std::string& name) {
  for (const BenchFigure& f : r.figures) {
    if (f.name == name) return &f;
  }
  return nullptr;
}

TEST(HardwareBenchTest, HostFiguresAreAlwaysMeasured) {
  std::vector<std::string> lines;
  const HardwareBenchResult r = MeasureHardware(SmallOptions(&lines));
  EXPECT_GT(r.spec.cpu_adam_params_per_second, 0);
  EXPECT_GT(r.spec.host_memory_bytes, int64_t{1} << 20);
  EXPECT_GE(r.spec.pinned_limit_bytes, 0);
  ASSERT_NE(Find(r, "cpu_adamw"), nullptr);
  EXPECT_DOUBLE_EQ(Find(r, "cpu_adamw")->value, r.spec.cpu_adam_params_per_second / 1e6);
  EXPECT_EQ(lines.size(), r.figures.size()) << "one progress line per figure";
  EXPECT_THAT(FormatBenchTable(r), HasSubstr("cpu_adamw"));
  EXPECT_GT(r.seconds, 0);
}

// [Two CPU passes] (common/optimizer_bytes.h): the accumulate and update passes the chunk manager
// runs are measured on their own, land in the profile and have a row each, with the run count.
TEST(HardwareBenchTest, TwoCpuPassesAreMeasuredApart) {
  std::vector<std::string> lines;
  HardwareBenchOptions o = SmallOptions(&lines);
  o.adam_repetitions = 3;
  const HardwareBenchResult r = MeasureHardware(o);
  EXPECT_GT(r.spec.cpu_grad_accumulate_params_per_second, 0);
  EXPECT_GT(r.spec.cpu_adam_update_params_per_second, 0);
  EXPECT_TRUE(std::isfinite(r.spec.cpu_grad_accumulate_params_per_second));
  EXPECT_TRUE(std::isfinite(r.spec.cpu_adam_update_params_per_second));
  const BenchFigure* acc = Find(r, "cpu_grad_accumulate");
  const BenchFigure* upd = Find(r, "cpu_adam_update");
  ASSERT_NE(acc, nullptr);
  ASSERT_NE(upd, nullptr);
  EXPECT_DOUBLE_EQ(acc->value, r.spec.cpu_grad_accumulate_params_per_second / 1e6);
  EXPECT_DOUBLE_EQ(upd->value, r.spec.cpu_adam_update_params_per_second / 1e6);
  EXPECT_EQ(acc->unit, "Mparams/s");
  // At least adam_repetitions timed runs, their median reported (the note says how many).
  EXPECT_THAT(acc->note, ::testing::ContainsRegex("median of ([3-9]|[1-9][0-9]+) "));
  EXPECT_THAT(upd->note, ::testing::ContainsRegex("median of ([3-9]|[1-9][0-9]+) "));
  EXPECT_THAT(upd->note, HasSubstr("1M params"));
  EXPECT_THAT(FormatBenchTable(r), HasSubstr("cpu_grad_accumulate"));
  EXPECT_THAT(FormatBenchTable(r), HasSubstr("cpu_adam_update"));
  // [CPU pass bytes]: sgd's and adamw_bf16's updates, each timed as the chunk manager runs it
  // (adamw_bf16 where torch's CPU dispatch is one AdamWBf16Update reproduces).
  EXPECT_GT(r.spec.cpu_sgd_params_per_second, 0);
  const BenchFigure* sgd = Find(r, "cpu_sgd");
  ASSERT_NE(sgd, nullptr);
  EXPECT_DOUBLE_EQ(sgd->value, r.spec.cpu_sgd_params_per_second / 1e6);
  const BenchFigure* bf16 = Find(r, "cpu_adamw_bf16");
  ASSERT_NE(bf16, nullptr);
  if (TorchBf16VectorElems() > 0) {
    EXPECT_GT(r.spec.cpu_adamw_bf16_params_per_second, 0);
    EXPECT_DOUBLE_EQ(bf16->value, r.spec.cpu_adamw_bf16_params_per_second / 1e6);
  } else {
    EXPECT_EQ(r.spec.cpu_adamw_bf16_params_per_second, 0);
    EXPECT_THAT(bf16->note, HasSubstr("not measured"));
  }
}

TEST(HardwareBenchTest, WithoutCudaTheGpuPartIsAFailedPrecondition) {
  if (torch::cuda::is_available()) GTEST_SKIP() << "a CUDA device is present";
  std::vector<std::string> lines;
  const HardwareBenchResult r = MeasureHardware(SmallOptions(&lines));
  EXPECT_EQ(r.gpu_status.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_FALSE(r.spec.measured);
  EXPECT_EQ(r.spec.name, "cpu");
  EXPECT_EQ(r.spec.h2d_pinned_bytes_per_second, 0);
  EXPECT_THAT(FormatBenchTable(r), HasSubstr("no CUDA device"));
  absl::StatusOr<HardwareSpec> spec = RunHardwareBench(SmallOptions(&lines));
  EXPECT_EQ(spec.status().code(), absl::StatusCode::kFailedPrecondition);
}

TEST(HardwareBenchTest, OnAGpuEveryRequiredFigureIsMeasured) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  std::vector<std::string> lines;
  absl::StatusOr<HardwareSpec> spec = RunHardwareBench(SmallOptions(&lines));
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_TRUE(ValidateHardwareSpec(*spec, "").ok());
  EXPECT_TRUE(spec->measured);
  EXPECT_GT(spec->h2d_pinned_bytes_per_second, spec->h2d_pageable_bytes_per_second * 0.5);
  EXPECT_GT(spec->hbm_bytes_per_second, spec->h2d_pinned_bytes_per_second);
  EXPECT_GT(spec->matmul_bf16_flops, spec->matmul_fp32_flops);
  EXPECT_GT(spec->cuda_context_bytes, 0);
  EXPECT_LT(spec->cuda_context_bytes, spec->gpu_memory_bytes);
}

}  // namespace
}  // namespace memplan
