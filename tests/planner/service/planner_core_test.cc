#include "planner/service/planner_core.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <limits>
#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "common/presets.h"
#include "common/proto_convert.h"
#include "planner/core/plan_engine.h"
#include "planner/metrics/planner_metrics.h"
#include "planner/service/search_executor.h"
#include "planner/store/store.h"
#include "prometheus/registry.h"
#include "tests/planner/service/planner_core_fixture.h"

namespace memplan {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::StartsWith;

void ExpectInvalid(const absl::StatusOr<v1::PlanResponse>& result, const std::string& field,
                   const std::string& detail) {
  ASSERT_FALSE(result.ok());
  EXPECT_EQ(result.status().code(), absl::StatusCode::kInvalidArgument) << result.status();
  EXPECT_THAT(result.status().message(), AllOf(HasSubstr(field), HasSubstr(detail)));
}

// ---------------------------------------------------------------- plans

TEST_F(PlannerCoreTest, PlansFromPresetsAndStoresTheResolvedRequest) {
  auto response = Plan(TinyRequest());
  ASSERT_TRUE(response.ok()) << response.status();
  EXPECT_TRUE(response->fits()) << response->reason();
  EXPECT_THAT(response->plan_id(), StartsWith("plan-"));
  EXPECT_TRUE(response->analytic_trace());
  EXPECT_GT(response->prediction().peak_bytes(), 0);
  EXPECT_LE(response->prediction().peak_bytes(), response->capacity_bytes());
  EXPECT_EQ(response->plan().block_modes_size(), 4);
  EXPECT_GT(response->plans_evaluated(), 0);
  EXPECT_GE(response->search_seconds(), 0);
  EXPECT_EQ(metrics_->TrackedPlanCount(), 1);

  v1::GetPlanRequest get;
  get.set_plan_id(response->plan_id());
  auto stored = core_->GetPlan(get);
  ASSERT_TRUE(stored.ok()) << stored.status();
  EXPECT_EQ(stored->plan().plan_id(), response->plan_id());
  EXPECT_EQ(stored->plan().response().plan_id(), response->plan_id());
  EXPECT_EQ(stored->plan().response().prediction().peak_bytes(),
            response->prediction().peak_bytes());
  // Presets were resolved into the stored request, with defaults explicit.
  const v1::PlanRequest& req = stored->plan().request();
  EXPECT_EQ(req.arch().name(), "llama-tiny");
  EXPECT_EQ(req.arch().num_layers(), 4);
  EXPECT_EQ(req.hardware_spec().name(), "rtx-3090");
  EXPECT_EQ(req.safety_margin(), 0.05);
  EXPECT_EQ(req.workload().world_size(), 1);
}

TEST_F(PlannerCoreTest, InlineArchAndSpecGiveTheSameAnswerAsPresets) {
  auto by_preset = Plan(TinyRequest());
  auto inline_spec = Plan(InlineRequest());
  ASSERT_TRUE(by_preset.ok() && inline_spec.ok());
  EXPECT_EQ(by_preset->prediction().peak_bytes(), inline_spec->prediction().peak_bytes());
  EXPECT_NE(by_preset->plan_id(), inline_spec->plan_id());
}

TEST_F(PlannerCoreTest, DefaultsApplyWhenOptionalFieldsAreUnset) {
  v1::PlanRequest r = TinyRequest();
  r.clear_param_dtype();
  r.clear_optimizer();
  r.mutable_workload()->clear_world_size();
  auto response = Plan(r);
  ASSERT_TRUE(response.ok()) << response.status();
  v1::GetPlanRequest get;
  get.set_plan_id(response->plan_id());
  auto stored = core_->GetPlan(get);
  ASSERT_TRUE(stored.ok());
  EXPECT_EQ(stored->plan().request().param_dtype(), v1::DTYPE_BF16);
  EXPECT_EQ(stored->plan().request().optimizer(), "adamw");
}

// ---------------------------------------------------------------- bad input

TEST_F(PlannerCoreTest, ZeroLayersNamesFieldAndRange) {
  v1::PlanRequest r = InlineRequest();
  r.mutable_arch()->set_num_layers(0);
  ExpectInvalid(Plan(r), "arch.num_layers = 0", "[1, 4096]");
}

TEST_F(PlannerCoreTest, HeadsMustDivideHidden) {
  v1::PlanRequest r = InlineRequest();
  r.mutable_arch()->set_num_heads(6);
  r.mutable_arch()->set_num_kv_heads(3);
  ExpectInvalid(Plan(r), "arch.num_heads = 6", "must divide arch.hidden_size = 256");
}

TEST_F(PlannerCoreTest, KvHeadsMustDivideHeads) {
  v1::PlanRequest r = InlineRequest();
  r.mutable_arch()->set_num_kv_heads(3);
  ExpectInvalid(Plan(r), "arch.num_kv_heads = 3", "must divide arch.num_heads = 8");
}

TEST_F(PlannerCoreTest, NegativeAndAbsurdSizesNameFieldAndRange) {
  v1::PlanRequest r = TinyRequest();
  r.mutable_workload()->set_micro_batch(-1);
  ExpectInvalid(Plan(r), "workload.micro_batch = -1", "[1, 65536]");

  r = TinyRequest();
  r.mutable_workload()->set_seq_len(0);
  ExpectInvalid(Plan(r), "workload.seq_len = 0", "[1, 16777216]");

  r = InlineRequest();
  r.mutable_arch()->set_hidden_size(int64_t{1} << 40);
  ExpectInvalid(Plan(r), "arch.hidden_size = 1099511627776", "[1, 131072]");

  r = InlineRequest();
  r.mutable_arch()->set_vocab_size(-5);
  ExpectInvalid(Plan(r), "arch.vocab_size = -5", "[1, 16777216]");

  r = InlineRequest();
  r.mutable_hardware_spec()->set_gpu_memory_bytes(int64_t{1} << 60);
  ExpectInvalid(Plan(r), "hardware_spec.gpu_memory_bytes", "out of range");

  r = InlineRequest();
  r.mutable_hardware_spec()->set_h2d_pinned_bytes_per_second(-1);
  ExpectInvalid(Plan(r), "hardware_spec.h2d_pinned_bytes_per_second = -1", "out of range");

  r = TinyRequest();
  r.mutable_workload()->set_world_size(-2);
  ExpectInvalid(Plan(r), "workload.world_size = -2", "[1, 65536]");
}

TEST_F(PlannerCoreTest, CapacityBelowCudaContextIsRejected) {
  v1::PlanRequest r = InlineRequest();
  r.mutable_hardware_spec()->set_gpu_memory_bytes(256 << 20);
  r.mutable_hardware_spec()->set_cuda_context_bytes(512 << 20);
  ExpectInvalid(Plan(r), "hardware_spec.gpu_memory_bytes = 268435456", "below the CUDA context");
}

TEST_F(PlannerCoreTest, UnknownOptimizerListsTheAllowList) {
  v1::PlanRequest r = TinyRequest();
  r.set_optimizer("adafactor");
  ExpectInvalid(Plan(r), "optimizer = \"adafactor\"", "allowed: adamw, adamw_bf16, sgd");
}

TEST_F(PlannerCoreTest, SafetyMarginAndAlternativesAreRangeChecked) {
  v1::PlanRequest r = TinyRequest();
  r.set_safety_margin(0.7);
  ExpectInvalid(Plan(r), "safety_margin = 0.7", "[0, 0.5]");
  r.set_safety_margin(-0.1);
  ExpectInvalid(Plan(r), "safety_margin = -0.1", "[0, 0.5]");
  r.set_safety_margin(std::numeric_limits<double>::quiet_NaN());
  ExpectInvalid(Plan(r), "safety_margin = nan", "[0, 0.5]");
  r = TinyRequest();
  r.set_max_alternatives(-1);
  ExpectInvalid(Plan(r), "max_alternatives = -1", "[0, 20]");
}

TEST_F(PlannerCoreTest, UnknownEnumValuesAreRejected) {
  v1::PlanRequest r = TinyRequest();
  r.set_param_dtype(static_cast<v1::DType>(17));
  ExpectInvalid(Plan(r), "param_dtype = 17", "DTYPE_BF16");
  r = TinyRequest();
  r.mutable_fixed()->set_host_memory(static_cast<v1::HostMemoryKind>(9));
  ExpectInvalid(Plan(r), "fixed.host_memory = 9", "HOST_MEMORY_PINNED");
}

TEST_F(PlannerCoreTest, FixedKnobOutOfRangeNamesTheKnob) {
  v1::PlanRequest r = TinyRequest();
  r.mutable_fixed()->set_n_checkpoint(99);
  ExpectInvalid(Plan(r), "fixed.n_checkpoint", "out of range");
}

TEST_F(PlannerCoreTest, MissingModelOrHardwareIsInvalid) {
  v1::PlanRequest r = TinyRequest();
  r.clear_model();
  ExpectInvalid(Plan(r), "model is required", "arch, trace_id, arch_preset");
  r = TinyRequest();
  r.clear_hardware();
  ExpectInvalid(Plan(r), "hardware is required",
                "hardware_spec, hardware_profile_id, hardware_preset");
}

TEST_F(PlannerCoreTest, UnknownIdsAndPresetsAreNotFound) {
  v1::PlanRequest r = TinyRequest();
  r.set_arch_preset("gpt-7");
  auto result = Plan(r);
  EXPECT_EQ(result.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(result.status().message(), AllOf(HasSubstr("arch_preset \"gpt-7\""),
                                               HasSubstr("llama-3.1-8b"), HasSubstr("qwen3-8b")));

  r = TinyRequest();
  r.set_hardware_preset("tpu-v9");
  result = Plan(r);
  EXPECT_EQ(result.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(result.status().message(),
              AllOf(HasSubstr("hardware_preset \"tpu-v9\""), HasSubstr("h100-80gb")));

  r = TinyRequest();
  r.set_trace_id("trace-0000000000000000");
  result = Plan(r);
  EXPECT_EQ(result.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(result.status().message(), HasSubstr("trace_id \"trace-0000000000000000\""));

  r = TinyRequest();
  r.set_hardware_profile_id("hw-nope");
  result = Plan(r);
  EXPECT_EQ(result.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(result.status().message(), HasSubstr("hardware_profile_id \"hw-nope\""));

  v1::GetPlanRequest get;
  get.set_plan_id("plan-missing");
  EXPECT_EQ(core_->GetPlan(get).status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(core_->GetPlan(get).status().message(), HasSubstr("plan_id \"plan-missing\""));
}

// Every string and list a client sends is bounded: refused INVALID_ARGUMENT naming the field
// and the bound, quoting at most 64 bytes of the value, before anything is stored.
TEST_F(PlannerCoreTest, OversizedStringsAndListsNameTheFieldAndAreNotEchoed) {
  const std::string huge(3 << 20, 'x');
  auto expect_refused = [&](const absl::Status& status, const std::string& field,
                            const std::string& bound) {
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << field << ": " << status;
    EXPECT_THAT(status.message(), AllOf(HasSubstr(field), HasSubstr(bound)));
    EXPECT_LT(status.message().size(), 512u) << field;
  };
  auto plan = [&](const std::function<void(v1::PlanRequest&)>& edit) {
    v1::PlanRequest r = InlineRequest();
    edit(r);
    return core_->Plan(r).status();
  };
  expect_refused(plan([&](v1::PlanRequest& r) { r.mutable_arch()->set_name(huge); }), "arch.name",
                 "at most 256");
  expect_refused(plan([&](v1::PlanRequest& r) { r.mutable_arch()->set_family(huge); }),
                 "arch.family", "at most 256");
  expect_refused(plan([&](v1::PlanRequest& r) { r.mutable_hardware_spec()->set_name(huge); }),
                 "hardware_spec.name", "at most 256");
  expect_refused(plan([&](v1::PlanRequest& r) { r.set_trace_id(huge); }), "trace_id",
                 "at most 128");
  expect_refused(plan([&](v1::PlanRequest& r) { r.set_arch_preset(huge); }), "arch_preset",
                 "at most 256");
  expect_refused(plan([&](v1::PlanRequest& r) { r.set_hardware_profile_id(huge); }),
                 "hardware_profile_id", "at most 128");
  expect_refused(plan([&](v1::PlanRequest& r) { r.set_hardware_preset(huge); }), "hardware_preset",
                 "at most 256");
  expect_refused(plan([&](v1::PlanRequest& r) { r.set_optimizer(huge); }), "optimizer",
                 "at most 256");
  expect_refused(plan([&](v1::PlanRequest& r) {
                   r.mutable_training()->set_kind(v1::TrainingMethod::LORA);
                   r.mutable_training()->set_lora_rank(8);
                   for (int i = 0; i < 100000; ++i) {
                     r.mutable_training()->add_lora_target_modules("q_proj");
                   }
                 }),
                 "training.lora_target_modules", "at most 16");

  v1::GetPlanRequest get;
  get.set_plan_id(huge);
  expect_refused(core_->GetPlan(get).status(), "plan_id", "at most 128");
  v1::GetTraceRequest get_trace;
  get_trace.set_trace_id(huge);
  expect_refused(core_->GetTrace(get_trace).status(), "trace_id", "at most 128");
  v1::GetHardwareProfileRequest get_profile;
  get_profile.set_profile_id(huge);
  expect_refused(core_->GetHardwareProfile(get_profile).status(), "profile_id", "at most 128");
  v1::ListPlansRequest list;
  list.set_page_token(huge);
  expect_refused(core_->ListPlans(list).status(), "page_token", "at most 128");
  v1::GetCalibrationRequest calibration;
  calibration.set_hardware_name(huge);
  expect_refused(core_->GetCalibration(calibration).status(), "hardware_name", "at most 256");

  v1::SubmitHardwareProfileRequest profile;
  *profile.mutable_profile() = ToProto(*FindHardwarePreset("rtx-3090"));
  profile.mutable_profile()->set_name(huge);
  expect_refused(core_->SubmitHardwareProfile(profile).status(), "profile.name", "at most 256");

  v1::SubmitTraceRequest trace;
  *trace.mutable_trace() = TinyTrace("rtx-3090");
  trace.mutable_trace()->set_hardware_name(huge);
  expect_refused(core_->SubmitTrace(trace).status(), "trace.hardware_name", "at most 256");
  *trace.mutable_trace() = TinyTrace("rtx-3090");
  for (int i = 0; i < 70000; ++i) trace.mutable_trace()->add_chunk_param_bytes(1);
  expect_refused(core_->SubmitTrace(trace).status(), "trace.chunk_param_bytes", "at most 65536");

  auto made = core_->Plan(TinyRequest());
  ASSERT_TRUE(made.ok()) << made.status();
  v1::ReportMeasurementRequest report;
  report.mutable_measurement()->set_plan_id(made->plan_id());
  report.mutable_measurement()->set_peak_reserved_bytes(kGiB);
  report.mutable_measurement()->set_note(huge);
  expect_refused(core_->ReportMeasurement(report).status(), "measurement.note", "at most 4096");
  report.mutable_measurement()->set_note("");
  report.mutable_measurement()->set_plan_id(huge);
  expect_refused(core_->ReportMeasurement(report).status(), "measurement.plan_id", "at most 128");

  v1::AdmitRequest admit;
  *admit.mutable_job() = TinyRequest();
  admit.mutable_job()->clear_hardware_preset();
  admit.add_pools()->set_name(huge);
  admit.mutable_pools(0)->set_gpus(1);
  admit.mutable_pools(0)->set_hardware_preset("rtx-3090");
  expect_refused(core_->Admit(admit).status(), "pools[0].name", "at most 256");

  // Only the one plan made above was stored.
  v1::ListPlansRequest all;
  auto listed = core_->ListPlans(all);
  ASSERT_TRUE(listed.ok());
  EXPECT_EQ(listed->plans_size(), 1);
}

// An unknown id is quoted in NOT_FOUND, but never more than 64 bytes of it.
TEST_F(PlannerCoreTest, NotFoundQuotesAtMostTheStartOfTheId) {
  v1::GetPlanRequest get;
  get.set_plan_id(std::string(100, 'p'));
  const absl::Status status = core_->GetPlan(get).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(status.message(), AllOf(HasSubstr(std::string(64, 'p') + "\"... (100 bytes)"),
                                      ::testing::Not(HasSubstr(std::string(65, 'p')))));
}

TEST_F(PlannerCoreTest, FullSearchQueueIsResourceExhausted) {
  // A core over a one-thread executor with no queue, whose thread we keep busy. `release` is
  // declared first so that it outlives the executor, whose destructor joins the thread still
  // returning from WaitForNotification (TSan found the Notification destroyed under it).
  absl::Notification release;
  SearchExecutor busy({.threads = 1, .max_queued = 0});
  auto core = PlannerCore::Create(*store_, busy, nullptr);
  ASSERT_TRUE(core.ok());
  ASSERT_TRUE(busy.Submit([&] { release.WaitForNotification(); }).ok());
  auto result = (*core)->Plan(TinyRequest());
  release.Notify();
  EXPECT_EQ(result.status().code(), absl::StatusCode::kResourceExhausted) << result.status();
}

// ---------------------------------------------------------------- admission

v1::NodePool Pool(const std::string& name, const std::string& preset, int gpus) {
  v1::NodePool pool;
  pool.set_name(name);
  pool.set_hardware_preset(preset);
  pool.set_gpus(gpus);
  return pool;
}

// Issue 12's example: a llama-3.1-8b full fine-tune does not fit an RTX 4090 and fits an H100.
TEST_F(PlannerCoreTest, AdmitSaysWhichPoolsFitWithPlanAndTokensPerSecond) {
  v1::AdmitRequest request;
  request.mutable_job()->set_arch_preset("llama-3.1-8b");
  request.mutable_job()->mutable_workload()->set_micro_batch(1);
  request.mutable_job()->mutable_workload()->set_seq_len(4096);
  request.mutable_job()->set_skip_limits(true);
  *request.add_pools() = Pool("consumer", "rtx-4090", 16);
  *request.add_pools() = Pool("datacenter", "h100-80gb", 8);
  auto admitted = core_->Admit(request);
  ASSERT_TRUE(admitted.ok()) << admitted.status();
  ASSERT_EQ(admitted->pools_size(), 2);
  const v1::PoolVerdict& consumer = admitted->pools(0);
  const v1::PoolVerdict& datacenter = admitted->pools(1);
  EXPECT_EQ(consumer.pool(), "consumer");
  EXPECT_EQ(consumer.hardware_name(), "rtx-4090");
  EXPECT_FALSE(consumer.fits());
  EXPECT_THAT(consumer.reason(), StartsWith("does not fit"));
  EXPECT_EQ(consumer.job_tokens_per_second(), 0);
  EXPECT_EQ(datacenter.hardware_name(), "h100-80gb");
  EXPECT_TRUE(datacenter.fits()) << datacenter.reason();
  EXPECT_EQ(datacenter.gpus(), 8);
  EXPECT_GT(datacenter.prediction().tokens_per_second(), 0);
  EXPECT_EQ(datacenter.job_tokens_per_second(), datacenter.prediction().tokens_per_second());
  EXPECT_EQ(static_cast<int>(datacenter.plan().block_modes_size()),
            FindModelPreset("llama-3.1-8b")->num_layers);
  EXPECT_EQ(admitted->best_pool(), "datacenter");

  // The same answer as Plan gives for that card, and the plan is stored under its id.
  v1::PlanRequest direct = request.job();
  direct.set_hardware_preset("h100-80gb");
  auto plan = Plan(direct);
  ASSERT_TRUE(plan.ok());
  EXPECT_EQ(plan->prediction().peak_bytes(), datacenter.prediction().peak_bytes());
  v1::GetPlanRequest get;
  get.set_plan_id(datacenter.plan_id());
  auto stored = core_->GetPlan(get);
  ASSERT_TRUE(stored.ok()) << stored.status();
  EXPECT_EQ(stored->plan().request().hardware_spec().name(), "h100-80gb");
}

TEST_F(PlannerCoreTest, AdmitNeedsWorldSizeGpusAndPicksTheFastestJob) {
  v1::AdmitRequest request;
  request.mutable_job()->set_arch_preset("llama-tiny");
  request.mutable_job()->mutable_workload()->set_micro_batch(2);
  request.mutable_job()->mutable_workload()->set_seq_len(512);
  request.mutable_job()->mutable_workload()->set_world_size(4);
  request.mutable_job()->set_skip_limits(true);
  *request.add_pools() = Pool("three", "h100-80gb", 3);
  *request.add_pools() = Pool("slow", "rtx-3090", 4);
  *request.add_pools() = Pool("fast", "h100-80gb", 8);
  auto admitted = core_->Admit(request);
  ASSERT_TRUE(admitted.ok()) << admitted.status();
  EXPECT_FALSE(admitted->pools(0).fits());
  EXPECT_THAT(admitted->pools(0).reason(),
              HasSubstr("the job needs 4 GPUs (workload.world_size) and the pool has 3"));
  ASSERT_TRUE(admitted->pools(1).fits());
  ASSERT_TRUE(admitted->pools(2).fits());
  EXPECT_EQ(admitted->pools(2).job_tokens_per_second(),
            4 * admitted->pools(2).prediction().tokens_per_second());
  EXPECT_GT(admitted->pools(2).job_tokens_per_second(), admitted->pools(1).job_tokens_per_second());
  EXPECT_EQ(admitted->best_pool(), "fast");

  // Nothing fits: no best pool.
  v1::AdmitRequest none = request;
  none.clear_pools();
  *none.add_pools() = Pool("three", "h100-80gb", 3);
  auto refused = core_->Admit(none);
  ASSERT_TRUE(refused.ok());
  EXPECT_EQ(refused->best_pool(), "");
}

TEST_F(PlannerCoreTest, AdmitErrorsNameTheFieldAndAllowedValues) {
  v1::AdmitRequest base;
  base.mutable_job()->set_arch_preset("llama-tiny");
  base.mutable_job()->mutable_workload()->set_micro_batch(2);
  base.mutable_job()->mutable_workload()->set_seq_len(512);
  base.mutable_job()->set_skip_limits(true);
  auto error = [&](const v1::AdmitRequest& r) {
    auto result = core_->Admit(r);
    EXPECT_FALSE(result.ok());
    return result.status();
  };
  EXPECT_THAT(error(base).message(), HasSubstr("pools: 0 given; allowed 1 to 64"));
  v1::AdmitRequest r = base;
  *r.add_pools() = Pool("a", "h100-80gb", 1);
  r.mutable_job()->set_hardware_preset("h100-80gb");
  EXPECT_THAT(error(r).message(), HasSubstr("job.hardware_spec, job.hardware_profile_id and "
                                            "job.hardware_preset must be unset"));
  r = base;
  *r.add_pools() = Pool("a", "h100-80gb", 1);
  *r.add_pools() = Pool("a", "rtx-4090", 1);
  EXPECT_THAT(error(r).message(), HasSubstr("pools[1].name \"a\" is used twice"));
  r = base;
  *r.add_pools() = Pool("a", "h100-80gb", 0);
  EXPECT_THAT(error(r).message(), HasSubstr("pools[0].gpus = 0 is out of range; allowed [1, "));
  r = base;
  *r.add_pools() = Pool("", "h100-80gb", 1);
  EXPECT_THAT(error(r).message(), HasSubstr("pools[0].name is empty"));
  r = base;
  r.add_pools()->set_name("bare");
  r.mutable_pools(0)->set_gpus(1);
  EXPECT_THAT(error(r).message(),
              HasSubstr("pools[0]: set one of hardware_spec, hardware_profile_id"));
  r = base;
  *r.add_pools() = Pool("a", "h100-80gb", 1);
  *r.add_pools() = Pool("b", "tpu-v9", 1);
  const absl::Status unknown = error(r);
  EXPECT_EQ(unknown.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(unknown.message()),
              StartsWith("pools[1] (\"b\"): hardware_preset \"tpu-v9\""));
  r = base;
  r.mutable_job()->mutable_workload()->set_micro_batch(0);
  *r.add_pools() = Pool("a", "h100-80gb", 1);
  EXPECT_THAT(error(r).message(), HasSubstr("job.workload.micro_batch = 0 is out of range"));
  r = base;
  r.mutable_job()->set_arch_preset("llama-99t");
  *r.add_pools() = Pool("a", "h100-80gb", 1);
  EXPECT_THAT(std::string(error(r).message()), StartsWith("job.arch_preset \"llama-99t\""));
}

// The case: Llama-3.1-70B on 8 H100s of one node. The preset's node has 256 GiB of RAM,
// too little for the offloaded chunks of 8 ranks; the real node has 2 TiB.
TEST_F(PlannerCoreTest, HostMemoryOverridesThePresetsNode) {
  v1::PlanRequest r;
  r.set_arch_preset("llama-3.1-70b");
  r.set_hardware_preset("h100-80gb");
  r.mutable_workload()->set_micro_batch(1);
  r.mutable_workload()->set_seq_len(4096);
  r.mutable_workload()->set_world_size(8);
  r.set_skip_limits(true);
  auto preset_node = Plan(r);
  ASSERT_TRUE(preset_node.ok()) << preset_node.status();
  EXPECT_FALSE(preset_node->fits());
  EXPECT_THAT(preset_node->reason(), HasSubstr("256.0 GiB shared by 8 local ranks"));

  r.set_host_memory_bytes(int64_t{2048} << 30);
  auto big_node = Plan(r);
  ASSERT_TRUE(big_node.ok()) << big_node.status();
  EXPECT_TRUE(big_node->fits()) << big_node->reason();
  EXPECT_GT(big_node->prediction().host_pinned_bytes() + big_node->prediction().host_pageable_bytes(),
            int64_t{32} << 30);  // more than the preset node's share of one rank
  v1::GetPlanRequest get;
  get.set_plan_id(big_node->plan_id());
  auto stored = core_->GetPlan(get);
  ASSERT_TRUE(stored.ok()) << stored.status();
  EXPECT_EQ(stored->plan().request().hardware_spec().host_memory_bytes(), int64_t{2048} << 30);
  EXPECT_EQ(stored->plan().request().hardware_spec().name(), "h100-80gb");

  // The reason's host limit is the given node: its RAM, shared by the given ranks per node.
  r.set_host_memory_bytes(int64_t{96} << 30);
  r.mutable_workload()->set_local_world_size(4);
  auto small_node = Plan(r);
  ASSERT_TRUE(small_node.ok()) << small_node.status();
  EXPECT_FALSE(small_node->fits());
  EXPECT_THAT(small_node->reason(), HasSubstr("96.0 GiB shared by 4 local ranks"));

  for (const int64_t bad : {int64_t{1}, (int64_t{1} << 30) - 1, (int64_t{65536} << 30) + 1,
                            int64_t{-1}}) {
    r.set_host_memory_bytes(bad);
    ExpectInvalid(Plan(r), "host_memory_bytes",
                  absl::StrCat(bad, " is out of range; allowed 0 (the hardware's) or [1073741824, "
                                    "70368744177664] (1 to 65536 GiB)"));
  }

  // Admit applies the job's figure to every pool, and names it as the job's.
  v1::AdmitRequest admit;
  *admit.mutable_job() = r;
  admit.mutable_job()->clear_hardware_preset();
  admit.mutable_job()->mutable_workload()->clear_local_world_size();
  admit.mutable_job()->set_host_memory_bytes(int64_t{2048} << 30);
  *admit.add_pools() = Pool("h100", "h100-80gb", 8);
  auto admitted = core_->Admit(admit);
  ASSERT_TRUE(admitted.ok()) << admitted.status();
  EXPECT_TRUE(admitted->pools(0).fits()) << admitted->pools(0).reason();
  admit.mutable_job()->set_host_memory_bytes(5);
  auto refused = core_->Admit(admit);
  ASSERT_FALSE(refused.ok());
  EXPECT_THAT(std::string(refused.status().message()), StartsWith("job.host_memory_bytes = 5"));
}

TEST_F(PlannerCoreTest, CalibrationIsKeyedByHardwareDtypeAndFamily) {
  auto first = Plan(TinyRequest());
  ASSERT_TRUE(first.ok());
  v1::ReportMeasurementRequest report;
  report.mutable_measurement()->set_plan_id(first->plan_id());
  report.mutable_measurement()->set_peak_reserved_bytes(first->prediction().peak_bytes() * 2);
  ASSERT_TRUE(core_->ReportMeasurement(report).ok());
  // Another card: no calibration applies.
  v1::PlanRequest other = TinyRequest();
  other.set_hardware_preset("rtx-4090");
  auto response = Plan(other);
  ASSERT_TRUE(response.ok());
  EXPECT_EQ(response->prediction().breakdown().fragmentation_factor(),
            kDefaultFragmentationFactor);  // only the default
  EXPECT_EQ(response->prediction().breakdown().calibration_residual_bytes(), 0);
}

TEST_F(PlannerCoreTest, BadMeasurementsAreRejected) {
  auto plan = Plan(TinyRequest());
  ASSERT_TRUE(plan.ok());
  v1::ReportMeasurementRequest report;
  EXPECT_EQ(core_->ReportMeasurement(report).status().code(), absl::StatusCode::kInvalidArgument);

  report.mutable_measurement()->set_plan_id("plan-unknown");
  report.mutable_measurement()->set_peak_reserved_bytes(1 << 30);
  auto result = core_->ReportMeasurement(report);
  EXPECT_EQ(result.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(result.status().message(), HasSubstr("measurement.plan_id \"plan-unknown\""));

  report.mutable_measurement()->set_plan_id(plan->plan_id());
  report.mutable_measurement()->set_peak_reserved_bytes(-5);
  result = core_->ReportMeasurement(report);
  EXPECT_EQ(result.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(result.status().message(),
              AllOf(HasSubstr("measurement.peak_reserved_bytes = -5"), HasSubstr("[0, ")));

  report.mutable_measurement()->set_peak_reserved_bytes(1 << 30);
  report.mutable_measurement()->set_load_peak_bytes(-1);
  EXPECT_THAT(core_->ReportMeasurement(report).status().message(),
              HasSubstr("measurement.load_peak_bytes = -1"));

  report.mutable_measurement()->set_load_peak_bytes(0);
  report.mutable_measurement()->set_step_seconds(std::nan(""));
  EXPECT_THAT(core_->ReportMeasurement(report).status().message(),
              HasSubstr("measurement.step_seconds = nan"));

  // Nothing was stored by the rejected reports.
  v1::GetPlanRequest get;
  get.set_plan_id(plan->plan_id());
  EXPECT_EQ(core_->GetPlan(get)->plan().measurements_size(), 0);
}

// ---------------------------------------------------------------- hardware profiles

TEST_F(PlannerCoreTest, MeasuredProfileSupersedesThePresetOfTheSameName) {
  auto datasheet = Plan(TinyRequest());
  ASSERT_TRUE(datasheet.ok());

  HardwareSpec measured = *FindHardwarePreset("rtx-3090");
  measured.gpu_memory_bytes = 12 * kGiB;  // e.g. a card shared with another process
  measured.h2d_pinned_bytes_per_second = 6e9;
  // Submitted but not measured: must not supersede anything.
  HardwareSpec unmeasured = measured;
  unmeasured.gpu_memory_bytes = 2 * kGiB;
  unmeasured.measured = false;
  v1::SubmitHardwareProfileRequest submit;
  *submit.mutable_profile() = ToProto(unmeasured);
  ASSERT_TRUE(core_->SubmitHardwareProfile(submit).ok());
  auto still_datasheet = Plan(TinyRequest());
  ASSERT_TRUE(still_datasheet.ok());
  EXPECT_EQ(still_datasheet->capacity_bytes(), datasheet->capacity_bytes());

  measured.measured = true;
  *submit.mutable_profile() = ToProto(measured);
  auto id = core_->SubmitHardwareProfile(submit);
  ASSERT_TRUE(id.ok()) << id.status();
  EXPECT_THAT(id->profile_id(), StartsWith("hw-"));

  auto superseded = Plan(TinyRequest());
  ASSERT_TRUE(superseded.ok());
  EXPECT_LT(superseded->capacity_bytes(), datasheet->capacity_bytes());
  v1::GetPlanRequest get;
  get.set_plan_id(superseded->plan_id());
  auto stored = core_->GetPlan(get);
  ASSERT_TRUE(stored.ok());
  EXPECT_TRUE(stored->plan().request().hardware_spec().measured());
  EXPECT_EQ(stored->plan().request().hardware_spec().gpu_memory_bytes(), 12 * kGiB);

  // ListPresets serves the measured one under the preset's name; other presets are unchanged.
  auto presets = core_->ListPresets({});
  ASSERT_TRUE(presets.ok());
  bool saw = false;
  for (const v1::HardwareProfile& h : presets->hardware()) {
    if (h.name() == "rtx-3090") {
      saw = true;
      EXPECT_TRUE(h.measured());
      EXPECT_EQ(h.gpu_memory_bytes(), 12 * kGiB);
    } else {
      EXPECT_FALSE(h.measured()) << h.name();
    }
  }
  EXPECT_TRUE(saw);
  EXPECT_EQ(presets->models_size(), static_cast<int>(ModelPresets().size()));

  // And by id.
  v1::PlanRequest by_id = TinyRequest();
  by_id.set_hardware_profile_id(id->profile_id());
  auto by_id_response = Plan(by_id);
  ASSERT_TRUE(by_id_response.ok());
  EXPECT_EQ(by_id_response->capacity_bytes(), superseded->capacity_bytes());
}

TEST_F(PlannerCoreTest, HardwareProfileIsValidated) {
  HardwareSpec h = *FindHardwarePreset("h100-80gb");
  h.cuda_context_bytes = h.gpu_memory_bytes;
  v1::SubmitHardwareProfileRequest submit;
  *submit.mutable_profile() = ToProto(h);
  auto result = core_->SubmitHardwareProfile(submit);
  EXPECT_EQ(result.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(result.status().message(), HasSubstr("profile.gpu_memory_bytes"));

  h = *FindHardwarePreset("h100-80gb");
  h.name.clear();
  *submit.mutable_profile() = ToProto(h);
  EXPECT_THAT(core_->SubmitHardwareProfile(submit).status().message(),
              HasSubstr("profile.name is empty"));
  EXPECT_EQ(core_->SubmitHardwareProfile({}).status().code(), absl::StatusCode::kInvalidArgument);
}

// ---------------------------------------------------------------- traces

TEST_F(PlannerCoreTest, SubmittedTraceIsValidated) {
  v1::SubmitTraceRequest submit;
  *submit.mutable_trace() = TinyTrace("rtx-3090");
  submit.mutable_trace()->mutable_blocks()->RemoveLast();
  auto result = core_->SubmitTrace(submit);
  EXPECT_EQ(result.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(result.status().message(), AllOf(HasSubstr("trace.blocks has 3 entries"),
                                               HasSubstr("trace.arch.num_layers = 4")));

  *submit.mutable_trace() = TinyTrace("rtx-3090");
  submit.mutable_trace()->mutable_blocks(2)->set_saved_bytes(-7);
  EXPECT_THAT(core_->SubmitTrace(submit).status().message(),
              HasSubstr("trace.blocks[2].saved_bytes = -7"));

  *submit.mutable_trace() = TinyTrace("rtx-3090");
  submit.mutable_trace()->clear_param_dtype();
  EXPECT_THAT(core_->SubmitTrace(submit).status().message(),
              HasSubstr("trace.param_dtype is unspecified"));

  *submit.mutable_trace() = TinyTrace("");
  EXPECT_THAT(core_->SubmitTrace(submit).status().message(),
              HasSubstr("trace.hardware_name is empty"));

  *submit.mutable_trace() = TinyTrace("rtx-3090");
  submit.mutable_trace()->mutable_arch()->set_num_kv_heads(5);
  EXPECT_THAT(core_->SubmitTrace(submit).status().message(), HasSubstr("trace.arch.num_kv_heads"));
}

TEST_F(PlannerCoreTest, ProfiledTraceIsUsedByIdAndByMatchingRequest) {
  v1::SubmitTraceRequest submit;
  *submit.mutable_trace() = TinyTrace("rtx-3090");
  auto id = core_->SubmitTrace(submit);
  ASSERT_TRUE(id.ok()) << id.status();
  EXPECT_THAT(id->trace_id(), StartsWith("trace-"));

  v1::GetTraceRequest get;
  get.set_trace_id(id->trace_id());
  auto stored = core_->GetTrace(get);
  ASSERT_TRUE(stored.ok());
  EXPECT_EQ(stored->trace().blocks_size(), 4);

  // By id: workload, dtype and training come from the trace.
  v1::PlanRequest by_id;
  by_id.set_trace_id(id->trace_id());
  by_id.set_hardware_preset("rtx-3090");
  by_id.set_skip_limits(true);
  auto response = Plan(by_id);
  ASSERT_TRUE(response.ok()) << response.status();
  EXPECT_EQ(response->trace_id(), id->trace_id());
  EXPECT_FALSE(response->analytic_trace());

  // By content: the same model, workload, dtype and hardware find the stored trace.
  auto matching = Plan(TinyRequest());
  ASSERT_TRUE(matching.ok()) << matching.status();
  EXPECT_EQ(matching->trace_id(), id->trace_id());
  EXPECT_FALSE(matching->analytic_trace());

  // Another sequence length does not.
  v1::PlanRequest other = TinyRequest();
  other.mutable_workload()->set_seq_len(1024);
  auto analytic = Plan(other);
  ASSERT_TRUE(analytic.ok());
  EXPECT_TRUE(analytic->analytic_trace());
  EXPECT_EQ(analytic->trace_id(), "");

  // A request that names the trace but asks for another workload is refused, not ignored.
  by_id.mutable_workload()->set_micro_batch(2);
  by_id.mutable_workload()->set_seq_len(2048);
  ExpectInvalid(Plan(by_id), "workload.seq_len = 2048", "differs from the trace's 512");
}

// ---------------------------------------------------------------- listing

TEST_F(PlannerCoreTest, ListPlansPagesNewestFirst) {
  std::vector<std::string> ids;
  for (int i = 0; i < 5; ++i) {
    v1::PlanRequest r = TinyRequest();
    r.mutable_workload()->set_micro_batch(i + 1);
    auto response = Plan(r);
    ASSERT_TRUE(response.ok());
    ids.push_back(response->plan_id());
  }
  v1::ListPlansRequest list;
  list.set_page_size(2);
  std::vector<std::string> seen;
  for (int page = 0; page < 10; ++page) {
    auto response = core_->ListPlans(list);
    ASSERT_TRUE(response.ok()) << response.status();
    EXPECT_LE(response->plans_size(), 2);
    for (const v1::StoredPlan& p : response->plans()) {
      seen.push_back(p.plan_id());
      EXPECT_EQ(p.response().plan_id(), p.plan_id());
    }
    if (response->next_page_token().empty()) break;
    list.set_page_token(response->next_page_token());
  }
  ASSERT_EQ(seen.size(), ids.size());
  for (size_t i = 0; i < ids.size(); ++i) EXPECT_EQ(seen[i], ids[ids.size() - 1 - i]);

  list.set_page_size(-1);
  EXPECT_THAT(core_->ListPlans(list).status().message(),
              AllOf(HasSubstr("page_size = -1"), HasSubstr("[0, 1000]")));
}

}  // namespace
}  // namespace memplan
