#include "planner/cli/formatters.h"

#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"

#include "common/presets.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace memplan::cli {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::Not;

constexpr int64_t kGiB = int64_t{1} << 30;

google::protobuf::RepeatedField<int> Modes(std::initializer_list<v1::BlockMode> modes) {
  google::protobuf::RepeatedField<int> out;
  for (v1::BlockMode m : modes) out.Add(m);
  return out;
}

v1::PlanResponse SampleResponse() {
  v1::PlanResponse r;
  r.set_fits(true);
  r.set_plan_id("plan-00ff");
  r.set_trace_id("trace-7");
  r.set_analytic_trace(true);
  r.set_capacity_bytes(76 * kGiB);
  r.set_max_micro_batch(3);
  r.set_max_seq_len(12288);
  r.set_min_gpu_memory_bytes(41 * kGiB);
  r.set_search_seconds(0.0042);
  r.set_plans_evaluated(12345);
  v1::ResidencyPlan* plan = r.mutable_plan();
  plan->set_chunk_bytes(64 << 20);
  plan->set_n_chunks(40);
  plan->set_n_persist(40);
  plan->set_n_buffer(0);
  plan->set_n_checkpoint(2);
  plan->set_host_memory(v1::HOST_MEMORY_PINNED);
  for (int i = 0; i < 2; ++i) plan->add_block_modes(v1::BLOCK_MODE_CKPT);
  for (int i = 0; i < 30; ++i) plan->add_block_modes(v1::BLOCK_MODE_NONE);
  v1::Prediction* p = r.mutable_prediction();
  p->set_peak_bytes(70 * kGiB + kGiB / 4);
  p->set_load_peak_bytes(17 * kGiB);
  p->set_host_pinned_bytes(2 * kGiB);
  p->set_iteration_seconds(1.5);
  p->set_forward_seconds(0.4);
  p->set_backward_seconds(0.9);
  p->set_optimizer_seconds(0.2);
  p->set_tokens_per_second(2730.7);
  p->mutable_breakdown()->set_optimizer_state_bytes(60 * kGiB);
  p->mutable_breakdown()->set_cuda_context_bytes(kGiB / 2);
  p->mutable_breakdown()->set_fragmentation_factor(1.04);
  v1::Alternative* a = r.add_alternatives();
  a->mutable_plan()->set_n_persist(20);
  a->mutable_plan()->set_host_memory(v1::HOST_MEMORY_PAGEABLE);
  for (int i = 0; i < 32; ++i) a->mutable_plan()->add_block_modes(v1::BLOCK_MODE_CKPT);
  a->mutable_prediction()->set_peak_bytes(40 * kGiB);
  a->mutable_prediction()->set_iteration_seconds(2.25);
  a->mutable_prediction()->set_tokens_per_second(1820);
  a->set_note("less memory, slower");
  return r;
}

TEST(FormattersTest, CompressBlockModesRunsInOrder) {
  EXPECT_EQ(CompressBlockModes(Modes({})), "-");
  EXPECT_EQ(CompressBlockModes(Modes({v1::BLOCK_MODE_NONE})), "none×1");
  EXPECT_EQ(CompressBlockModes(
                Modes({v1::BLOCK_MODE_SWAP, v1::BLOCK_MODE_HS_OFFLOAD, v1::BLOCK_MODE_HS_OFFLOAD,
                       v1::BLOCK_MODE_CKPT, v1::BLOCK_MODE_NONE, v1::BLOCK_MODE_NONE})),
            "swap×1 hs_offload×2 ckpt×1 none×2");
  // Interleaved modes are not merged across runs: the order is part of the plan.
  EXPECT_EQ(
      CompressBlockModes(Modes({v1::BLOCK_MODE_CKPT, v1::BLOCK_MODE_SWAP, v1::BLOCK_MODE_CKPT})),
      "ckpt×1 swap×1 ckpt×1");
}

TEST(FormattersTest, AnOsftPlanHasNoChunks) {
  // [OSFT plans]: chunk_bytes 0, the blocks' modes and the ranks only.
  v1::ResidencyPlan plan;
  plan.set_n_checkpoint(4);
  plan.set_n_hs_offload(1);
  EXPECT_EQ(FormatKnobs(plan), "unmanaged (no chunks), swap 0, ckpt 4, hs_offload 1");
  plan.set_world_size(2);
  EXPECT_EQ(FormatKnobs(plan),
            "unmanaged (no chunks), swap 0, ckpt 4, hs_offload 1, world 2, model replicated");
}

TEST(FormattersTest, NumberFormats) {
  EXPECT_EQ(FormatGiB(0), "0.00 GiB");
  EXPECT_EQ(FormatGiB(80 * kGiB + kGiB / 2), "80.50 GiB");
  EXPECT_EQ(FormatSeconds(0.0042), "4.2 ms");
  EXPECT_EQ(FormatSeconds(1.5), "1.500 s");
  EXPECT_EQ(FormatCount(0), "0");
  EXPECT_EQ(FormatCount(999), "999");
  EXPECT_EQ(FormatCount(1000), "1,000");
  EXPECT_EQ(FormatCount(1234567.6), "1,234,568");
  EXPECT_EQ(FormatCount(-4321), "-4,321");
}

TEST(FormattersTest, PlanResponseShowsEverySection) {
  const std::string text = FormatPlanResponse(SampleResponse());
  EXPECT_THAT(text, HasSubstr("Verdict           FITS"));
  EXPECT_THAT(text, HasSubstr("plan-00ff"));
  EXPECT_THAT(text, HasSubstr("analytic (trace-7)"));
  EXPECT_THAT(text, HasSubstr("chunk 64 MiB × 40, persist 40, buffer 0, swap 0, ckpt 2"));
  EXPECT_THAT(text, HasSubstr("host pinned"));
  EXPECT_THAT(text, HasSubstr("ckpt×2 none×30"));
  EXPECT_THAT(text, HasSubstr("  optimizer state       60.00\n"));
  EXPECT_THAT(text, HasSubstr("  CUDA context           0.50\n"));
  EXPECT_THAT(text, HasSubstr("×1.040"));
  EXPECT_THAT(text, HasSubstr("Predicted peak    70.25 GiB of 76.00 GiB usable"));
  EXPECT_THAT(text, HasSubstr("Load-time peak    17.00 GiB"));
  EXPECT_THAT(text, HasSubstr("2.00 GiB pinned, 0.00 GiB pageable"));
  EXPECT_THAT(text,
              HasSubstr("1.500 s  (forward 400.0 ms, backward 900.0 ms, optimizer 200.0 ms)"));
  EXPECT_THAT(text, HasSubstr("2,731 per GPU"));
  EXPECT_THAT(text, HasSubstr("Max micro-batch   3"));
  EXPECT_THAT(text, HasSubstr("Max sequence      12288"));
  EXPECT_THAT(text, HasSubstr("Min GPU memory    41.00 GiB"));
  EXPECT_THAT(text, HasSubstr("12,345 plans evaluated"));
  EXPECT_THAT(text, HasSubstr("Alternatives"));
  EXPECT_THAT(text, HasSubstr("ckpt×32"));
  EXPECT_THAT(text, HasSubstr("  1: less memory, slower\n"));
  EXPECT_THAT(text, Not(HasSubstr("Why")));
}

TEST(FormattersTest, ShardedPlanShowsPerRankAndNodeMemory) {
  v1::PlanResponse r = SampleResponse();
  EXPECT_THAT(FormatPlanResponse(r), Not(HasSubstr("Per rank")));  // one rank: nothing to add
  v1::RankMemory* m = r.mutable_prediction()->mutable_rank_memory();
  m->set_world_size(8);
  m->set_local_world_size(8);
  m->set_persistent_device_bytes(3 * kGiB);
  m->set_persistent_state_device_bytes(12 * kGiB);
  m->set_buffer_device_bytes(kGiB);
  m->set_chunk_host_pinned_bytes(18 * kGiB);
  m->set_chunk_host_pageable_bytes(72 * kGiB);
  m->set_node_host_bytes(760 * kGiB);
  const std::string text = FormatPlanResponse(r);
  EXPECT_THAT(text, HasSubstr("Per rank (chunks)  device 3.00 GiB persistent + 12.00 GiB their "
                              "state + 1.00 GiB buffers; host 18.00 GiB pinned + 72.00 GiB "
                              "pageable"))
      << text;
  EXPECT_THAT(text, HasSubstr("Node host memory   760.00 GiB for 8 local ranks of 8")) << text;
}

TEST(FormattersTest, SkippedLimitsAreNotShownAsNoFit) {
  v1::PlanResponse r = SampleResponse();
  r.set_max_micro_batch(0);
  r.set_max_seq_len(0);
  r.set_min_gpu_memory_bytes(0);
  const std::string text = FormatPlanResponse(r);
  EXPECT_THAT(text, HasSubstr("Limits            not computed (skip_limits)"));
  EXPECT_THAT(text, Not(HasSubstr("none fits")));
}

TEST(FormattersTest, NoFitShowsTheReasonAndMissingLimits) {
  v1::PlanResponse r;
  r.set_fits(false);
  r.set_reason("needs 95.1 GiB, 76.0 GiB usable: model states alone exceed the card");
  const std::string text = FormatPlanResponse(r);
  EXPECT_THAT(text, HasSubstr("DOES NOT FIT"));
  EXPECT_THAT(text, HasSubstr("Why               needs 95.1 GiB"));
  EXPECT_THAT(text, HasSubstr("Max micro-batch   none fits"));
  EXPECT_THAT(text, Not(HasSubstr("Alternatives")));
  // Without a plan there are no knobs or breakdown to show.
  EXPECT_THAT(text, Not(HasSubstr("Knobs")));
  EXPECT_THAT(text, Not(HasSubstr("Memory")));
}

TEST(FormattersTest, PresetsAndCalibrationTables) {
  v1::ListPresetsResponse presets;
  v1::ModelArch* m = presets.add_models();
  m->set_name("llama-3.1-8b");
  m->set_family("llama");
  m->set_num_layers(32);
  v1::HardwareProfile* h = presets.add_hardware();
  h->set_name("h100-80gb");
  h->set_gpu_memory_bytes(80 * kGiB);
  h->set_hbm_bytes_per_second(3.35e12);
  h->set_measured(true);
  const std::string both = FormatPresets(presets, true, true);
  EXPECT_THAT(both, HasSubstr("llama-3.1-8b"));
  EXPECT_THAT(both, HasSubstr("h100-80gb"));
  EXPECT_THAT(both, HasSubstr("80.0"));
  EXPECT_THAT(both, HasSubstr("3.35 TB/s"));
  EXPECT_THAT(both, HasSubstr("measured"));
  EXPECT_THAT(FormatPresets(presets, true, false), Not(HasSubstr("h100-80gb")));
  EXPECT_THAT(FormatPresets(presets, false, true), Not(HasSubstr("llama-3.1-8b")));

  v1::GetCalibrationResponse none;
  EXPECT_THAT(FormatCalibrations(none), HasSubstr("No calibration yet"));
  v1::GetCalibrationResponse cal;
  v1::Calibration* c = cal.add_calibrations();
  c->set_hardware_name("h100-80gb");
  c->set_param_dtype(v1::DTYPE_BF16);
  c->set_model_family("llama");
  c->set_fragmentation_factor(1.0625);
  c->set_residual_bytes(kGiB);
  c->set_samples(7);
  c->set_mean_abs_relative_error(0.031);
  c->set_updated_at_unix_ms(1700000000000);
  const std::string text = FormatCalibrations(cal);
  EXPECT_THAT(text, HasSubstr("bf16"));
  EXPECT_THAT(text, HasSubstr("×1.062"));  // printf rounds 1.0625 half-to-even
  EXPECT_THAT(text, HasSubstr("1.00 GiB"));
  EXPECT_THAT(text, HasSubstr("3.1%"));
  EXPECT_THAT(text, HasSubstr("2023-11-14 22:13:20"));
}

TEST(FormattersTest, MeasurementReplyAndStoredPlan) {
  v1::ReportMeasurementResponse reply;
  reply.set_measurement_id("m-1");
  reply.set_relative_error(-0.025);
  reply.mutable_calibration()->set_hardware_name("rtx-4090");
  reply.mutable_calibration()->set_samples(1);
  const std::string text = FormatMeasurementReply(reply);
  EXPECT_THAT(text, HasSubstr("m-1"));
  EXPECT_THAT(text, HasSubstr("-2.5% (predicted - measured) / measured"));
  EXPECT_THAT(text, HasSubstr("rtx-4090"));
  // An OOM report's answer has no error: none is printed, not +0.0%.
  reply.clear_relative_error();
  EXPECT_THAT(FormatMeasurementReply(reply),
              AllOf(HasSubstr("none: an out-of-memory run"), Not(HasSubstr("+0.0%"))));

  v1::StoredPlan stored;
  stored.set_plan_id("plan-9");
  stored.mutable_request()->set_arch_preset("qwen3-8b");
  stored.mutable_request()->set_hardware_preset("l40s");
  stored.mutable_request()->mutable_workload()->set_micro_batch(2);
  stored.mutable_request()->mutable_workload()->set_seq_len(2048);
  *stored.mutable_response() = SampleResponse();
  v1::Measurement* m = stored.add_measurements();
  m->set_peak_reserved_bytes(71 * kGiB);
  m->set_step_seconds(1.6);
  m->set_note("run-a");
  const std::string plan_text = FormatStoredPlan(stored);
  EXPECT_THAT(plan_text, HasSubstr("qwen3-8b"));
  EXPECT_THAT(plan_text, HasSubstr("l40s"));
  EXPECT_THAT(plan_text, HasSubstr("2 × 2048 tokens"));
  EXPECT_THAT(plan_text, HasSubstr("FITS"));
  EXPECT_THAT(plan_text, HasSubstr("Measurements"));
  EXPECT_THAT(plan_text, HasSubstr("71.00"));
  EXPECT_THAT(plan_text, HasSubstr("run-a"));

  v1::ListPlansResponse page;
  *page.add_plans() = stored;
  const std::string list = FormatPlansList(page);
  EXPECT_THAT(list, HasSubstr("plan-9"));
  EXPECT_THAT(list, HasSubstr("2×2048"));
  EXPECT_THAT(list, HasSubstr("fits"));
  EXPECT_THAT(FormatPlansList(v1::ListPlansResponse()), HasSubstr("No stored plans"));
}

TEST(FormattersTest, TraceAndHardwareProfile) {
  v1::Trace t;
  t.set_trace_id("trace-3");
  t.mutable_arch()->set_name("llama-tiny");
  t.mutable_arch()->set_num_layers(2);
  t.set_param_dtype(v1::DTYPE_BF16);
  t.add_blocks()->set_param_bytes(kGiB);
  t.add_blocks()->set_saved_bytes(kGiB / 2);
  const std::string trace = FormatTrace(t);
  EXPECT_THAT(trace, HasSubstr("trace-3"));
  EXPECT_THAT(trace, HasSubstr("profiled"));
  EXPECT_THAT(trace, HasSubstr("block 0"));
  EXPECT_THAT(trace, HasSubstr("block 1"));
  EXPECT_THAT(trace, HasSubstr("0.500"));

  v1::HardwareProfile h;
  h.set_name("rtx-4090");
  h.set_gpu_memory_bytes(24 * kGiB);
  h.set_h2d_pinned_bytes_per_second(25e9);
  const std::string hw = FormatHardwareProfile(h);
  EXPECT_THAT(hw, HasSubstr("rtx-4090"));
  EXPECT_THAT(hw, HasSubstr("24.00 GiB"));
  EXPECT_THAT(hw, HasSubstr("25.0 GB/s"));
  EXPECT_THAT(hw, HasSubstr("unlimited"));
  EXPECT_THAT(hw, HasSubstr("not measured (one CPU Adam pass priced)"));
  h.set_cpu_grad_accumulate_params_per_second(4.5e9);
  h.set_cpu_adam_update_params_per_second(1.25e9);
  EXPECT_THAT(FormatHardwareProfile(h),
              HasSubstr("CPU accumulate / update  4,500,000,000 / 1,250,000,000 params/s"));
  // [CPU pass bytes]: each optimizer's own update figure, or what is priced without it.
  auto line_of = [](const std::string& text, absl::string_view key) {
    for (absl::string_view line : absl::StrSplit(text, '\n')) {
      if (absl::StartsWith(line, key)) return std::string(line);
    }
    return std::string();
  };
  EXPECT_THAT(line_of(hw, "CPU update adamw_bf16"),
              HasSubstr("not measured (adamw's update scaled by bytes)"));
  EXPECT_THAT(line_of(hw, "CPU update adamw8bit"), HasSubstr("not measured (adamw's time x1.4)"));
  h.set_cpu_adamw_bf16_params_per_second(8.5e9);
  h.set_cpu_sgd_params_per_second(7.25e9);
  const std::string measured = FormatHardwareProfile(h);
  EXPECT_THAT(line_of(measured, "CPU update adamw_bf16"), HasSubstr("8,500,000,000 params/s"));
  EXPECT_THAT(line_of(measured, "CPU update sgd"), HasSubstr("7,250,000,000 params/s"));
}

// The vision tower below a vision-language plan: Qwen2.5-VL-7B's tower with one 448x448 image.
TEST(FormattersTest, VisionTowerShare) {
  ModelSpec m = *FindModelPreset("qwen2.5-7b");
  m.family = "qwen2_5_vl";
  m.vision.depth = 32;
  m.vision.hidden_size = 1280;
  m.vision.intermediate_size = 3420;
  m.vision.num_heads = 16;
  m.vision.out_hidden_size = m.hidden_size;
  m.vision.fullatt_block_indexes = {7, 15, 23, 31};
  Workload w;
  w.seq_len = 2048;
  w.images_per_sample = 1;
  w.image_height = 448;
  w.image_width = 448;
  v1::PlanResponse r = SampleResponse();
  r.mutable_prediction()->set_peak_bytes(20 * kGiB);
  const std::string lora = FormatVisionTower(m, w, DType::kBFloat16, /*trains=*/false, r);
  EXPECT_THAT(lora, AllOf(HasSubstr("32x32 patches; 1024 patches, 256 image tokens"),
                          HasSubstr("1.26 GiB (676,550,144 parameters"),
                          HasSubstr("fp32 pixels 4.6 MiB, frozen"), HasSubstr("of 20.00 GiB")));
  const std::string full = FormatVisionTower(m, w, DType::kBFloat16, /*trains=*/true, r);
  EXPECT_THAT(full, AllOf(HasSubstr("trained: saved activations 2.03 GiB"),
                          HasSubstr("backward per micro-batch")));
  // No images, or no tower: nothing.
  w.images_per_sample = 0;
  EXPECT_EQ(FormatVisionTower(m, w, DType::kBFloat16, false, r), "");
  EXPECT_EQ(FormatVisionTower(*FindModelPreset("qwen2.5-7b"), w, DType::kBFloat16, false, r), "");
}

}  // namespace
}  // namespace memplan::cli
