// The PlannerCore fixture the planner_core_*_test.cc files share: a core over a memory store, real
// metrics and a one-thread executor, with a test clock; a tiny request and a profiled trace for it.
#pragma once

#include <gtest/gtest.h>

#include <memory>
#include <string>

#include "common/presets.h"
#include "common/proto_convert.h"
#include "planner/metrics/planner_metrics.h"
#include "planner/service/planner_core.h"
#include "planner/service/search_executor.h"
#include "planner/store/store.h"
#include "prometheus/registry.h"

namespace memplan {

inline constexpr int64_t kGiB = int64_t{1} << 30;

class PlannerCoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    store_ = NewMemoryStore();
    registry_ = std::make_shared<prometheus::Registry>();
    metrics_ = std::make_unique<PlannerMetrics>(registry_);
    executor_ = std::make_unique<SearchExecutor>(SearchExecutor::Options{.threads = 1});
    RecreateCore(PlannerCoreOptions());
  }

  // A core over the same store, metrics and executor with these options (the test clock added).
  void RecreateCore(PlannerCoreOptions options) {
    options.now_unix_ms = [this] { return ++clock_ms_; };
    auto core = PlannerCore::Create(*store_, *executor_, metrics_.get(), options);
    ASSERT_TRUE(core.ok()) << core.status();
    core_ = *std::move(core);
  }

  // A small model on a big card: always fits, searches fast.
  static v1::PlanRequest TinyRequest() {
    v1::PlanRequest r;
    r.set_arch_preset("llama-tiny");
    r.set_hardware_preset("rtx-3090");
    r.mutable_workload()->set_micro_batch(2);
    r.mutable_workload()->set_seq_len(512);
    r.set_param_dtype(v1::DTYPE_BF16);
    r.set_optimizer("adamw");
    r.set_skip_limits(true);
    return r;
  }

  static v1::PlanRequest InlineRequest() {
    v1::PlanRequest r = TinyRequest();
    *r.mutable_arch() = ToProto(*FindModelPreset("llama-tiny"));
    *r.mutable_hardware_spec() = ToProto(*FindHardwarePreset("rtx-3090"));
    return r;
  }

  // A profiled trace for llama-tiny at micro_batch 2, seq_len 512 in bf16.
  static v1::Trace TinyTrace(const std::string& hardware_name) {
    const ModelSpec m = *FindModelPreset("llama-tiny");
    Trace t;
    t.arch = m;
    t.workload = {2, 512, 1, 1};
    t.param_dtype = DType::kBFloat16;
    t.hardware_name = hardware_name;
    t.analytic = false;
    const int64_t hidden_bytes = 2 * 512 * m.hidden_size * 2;
    const int64_t block_params = 4 * m.hidden_size * m.hidden_size +
                                 3 * m.hidden_size * m.intermediate_size + 2 * m.hidden_size;
    for (int i = 0; i < m.num_layers; ++i) {
      BlockTrace b;
      b.param_bytes = block_params * 2;
      b.input_bytes = hidden_bytes;
      b.saved_bytes = 20 * hidden_bytes;
      b.forward_transient_bytes = 4 * hidden_bytes;
      b.backward_transient_bytes = 6 * hidden_bytes;
      b.forward_seconds = 1e-4;
      b.backward_seconds = 2e-4;
      b.recompute_seconds = 1e-4;
      t.blocks.push_back(b);
    }
    t.embedding = {m.vocab_size * m.hidden_size * 2, hidden_bytes, 0, 0, 1e-5, 1e-5};
    t.head = {m.vocab_size * m.hidden_size * 2,
              2 * 512 * m.vocab_size * 4,
              2 * 512 * m.vocab_size * 4,
              2 * 512 * m.vocab_size * 4,
              1e-4,
              2e-4};
    t.total_param_count = m.num_layers * block_params + 2 * m.vocab_size * m.hidden_size;
    t.trainable_param_count = t.total_param_count;
    return ToProto(t);
  }

  absl::StatusOr<v1::PlanResponse> Plan(const v1::PlanRequest& r) { return core_->Plan(r); }

  int64_t clock_ms_ = 1'700'000'000'000;
  std::unique_ptr<Store> store_;
  std::shared_ptr<prometheus::Registry> registry_;
  std::unique_ptr<PlannerMetrics> metrics_;
  std::unique_ptr<SearchExecutor> executor_;
  std::unique_ptr<PlannerCore> core_;
};

}  // namespace memplan
