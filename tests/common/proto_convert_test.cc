#include "common/proto_convert.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <random>

#include "common/presets.h"
#include "google/protobuf/util/message_differencer.h"

namespace memplan {
namespace {

using ::google::protobuf::util::MessageDifferencer;
using ::testing::HasSubstr;

// Fills every field of the domain trace with distinct values so a dropped or swapped field
// shows up in the round trip.
Trace FullTrace() {
  Trace t;
  t.trace_id = "trace-0123456789abcdef";
  t.arch = *FindModelPreset("qwen3-8b");
  t.arch.head_dim = 128;
  t.workload = {3, 4096, 8, 4};
  t.param_dtype = DType::kFloat16;
  t.training.kind = TrainingKind::kLora;
  t.training.lora_rank = 16;
  t.training.lora_target_modules = {"q_proj", "v_proj"};
  t.hardware_name = "h100-80gb";
  t.analytic = false;
  t.embedding = {11, 12, 13, 14, 0.5, 0.25};
  for (int i = 0; i < 5; ++i) {
    t.blocks.push_back({100 + i, 200 + i, 300 + i, 400 + i, 500 + i, 0.1 * i, 0.2 * i, 0.3 * i});
  }
  t.head = {21, 22, 23, 24, 1.5, 2.5};
  t.trainable_param_count = 123456;
  t.total_param_count = 7654321;
  t.forward_end_bytes = 99;
  t.chunk_bytes = int64_t{64} << 20;
  t.chunk_param_bytes = {1, 2, 3};
  return t;
}

// Domain equality through the proto form: both sides serialise the same fields, and the test
// below checks that the proto form itself survives, so comparing protos compares domains.
template <typename Domain>
void ExpectSameProto(const Domain& a, const Domain& b) {
  std::string diff;
  MessageDifferencer d;
  d.ReportDifferencesToString(&diff);
  EXPECT_TRUE(d.Compare(ToProto(a), ToProto(b))) << diff;
}

TEST(ProtoConvertTest, ModelSpecRoundTripsForEveryPreset) {
  for (const ModelSpec& m : ModelPresets()) {
    const ModelSpec back = ModelSpecFromProto(ToProto(m));
    EXPECT_EQ(back.name, m.name);
    EXPECT_EQ(back.family, m.family);
    EXPECT_EQ(back.hidden_size, m.hidden_size);
    EXPECT_EQ(back.num_layers, m.num_layers);
    EXPECT_EQ(back.num_heads, m.num_heads);
    EXPECT_EQ(back.num_kv_heads, m.num_kv_heads);
    EXPECT_EQ(back.head_dim, m.head_dim);
    EXPECT_EQ(back.intermediate_size, m.intermediate_size);
    EXPECT_EQ(back.vocab_size, m.vocab_size);
    EXPECT_EQ(back.tie_word_embeddings, m.tie_word_embeddings);
    EXPECT_EQ(back.qkv_bias, m.qkv_bias);
    EXPECT_EQ(back.qk_norm, m.qk_norm);
    EXPECT_EQ(back.rope_theta, m.rope_theta);
    EXPECT_EQ(back.rms_norm_eps, m.rms_norm_eps);
    EXPECT_EQ(back.max_position_embeddings, m.max_position_embeddings);
  }
}

TEST(ProtoConvertTest, GemmaFieldsRoundTrip) {
  const ModelSpec m = *FindModelPreset("gemma-2-27b");
  const ModelSpec back = ModelSpecFromProto(ToProto(m));
  EXPECT_EQ(back.family, "gemma2");
  EXPECT_EQ(back.query_pre_attn_scalar, 144);
  EXPECT_EQ(back.attn_logit_softcapping, 50);
  EXPECT_EQ(back.final_logit_softcapping, 30);
  EXPECT_EQ(back.sliding_layers, m.sliding_layers);
  EXPECT_EQ(back.HeadDim(), 128);
}

TEST(ProtoConvertTest, SlidingWindowLayersRoundTrip) {
  ModelSpec m = *FindModelPreset("llama-tiny");
  m.sliding_window = 512;
  m.sliding_layers = {0, 2, 3};
  const v1::ModelArch arch = ToProto(m);
  EXPECT_EQ(arch.sliding_window(), 512);
  EXPECT_EQ(arch.sliding_layers_size(), 3);
  const ModelSpec back = ModelSpecFromProto(arch);
  EXPECT_EQ(back.sliding_window, 512);
  EXPECT_EQ(back.sliding_layers, m.sliding_layers);
  EXPECT_EQ(back.LayerWindow(2), 512);
  EXPECT_EQ(back.LayerWindow(1), 0);
}

TEST(ProtoConvertTest, MixtureOfExpertsFieldsRoundTrip) {
  ModelSpec m = *FindModelPreset("llama-tiny");
  m.family = "qwen3_moe";
  m.num_experts = 128;
  m.num_experts_per_tok = 8;
  m.moe_intermediate_size = 768;
  m.norm_topk_prob = true;
  m.decoder_sparse_step = 2;
  m.mlp_only_layers = {0, 3};
  m.output_router_logits = true;
  m.router_aux_loss_coef = 0.001;
  const v1::ModelArch arch = ToProto(m);
  EXPECT_EQ(arch.num_experts(), 128);
  const ModelSpec back = ModelSpecFromProto(arch);
  EXPECT_EQ(back.num_experts, 128);
  EXPECT_EQ(back.num_experts_per_tok, 8);
  EXPECT_EQ(back.moe_intermediate_size, 768);
  EXPECT_TRUE(back.norm_topk_prob);
  EXPECT_EQ(back.decoder_sparse_step, 2);
  EXPECT_EQ(back.mlp_only_layers, m.mlp_only_layers);
  EXPECT_TRUE(back.output_router_logits);
  EXPECT_DOUBLE_EQ(back.router_aux_loss_coef, 0.001);
  // A dense arch: no experts, and an unset decoder_sparse_step keeps its default of 1.
  const ModelSpec dense = ModelSpecFromProto(ToProto(*FindModelPreset("llama-tiny")));
  EXPECT_FALSE(dense.IsMoe());
  EXPECT_EQ(dense.decoder_sparse_step, 1);
}

// A vision-language spec keeps its tower and image fields through the wire (a spec that lost
// them would fail validation as qwen2_5_vl without a tower), and so does the workload's images.
TEST(ProtoConvertTest, VisionLanguageFieldsRoundTrip) {
  ModelSpec m = *FindModelPreset("qwen2.5-7b");
  m.family = "qwen2_5_vl";
  m.vision.depth = 32;
  m.vision.hidden_size = 1280;
  m.vision.intermediate_size = 3420;
  m.vision.num_heads = 16;
  m.vision.window_size = 112;
  m.vision.out_hidden_size = m.hidden_size;
  m.vision.fullatt_block_indexes = {7, 15, 23, 31};
  m.vision.rope_theta = 10000.0;
  m.image_token_id = 151655;
  m.video_token_id = 151656;
  m.vision_start_token_id = 151652;
  m.vision_end_token_id = 151653;
  m.mrope_section = {16, 24, 24};
  const ModelSpec back = ModelSpecFromProto(ToProto(m));
  EXPECT_EQ(back.family, "qwen2_5_vl");
  EXPECT_EQ(back.vision.depth, 32);
  EXPECT_EQ(back.vision.hidden_size, 1280);
  EXPECT_EQ(back.vision.intermediate_size, 3420);
  EXPECT_EQ(back.vision.num_heads, 16);
  EXPECT_EQ(back.vision.patch_size, 14);
  EXPECT_EQ(back.vision.spatial_merge_size, 2);
  EXPECT_EQ(back.vision.temporal_patch_size, 2);
  EXPECT_EQ(back.vision.in_channels, 3);
  EXPECT_EQ(back.vision.window_size, 112);
  EXPECT_EQ(back.vision.out_hidden_size, m.hidden_size);
  EXPECT_EQ(back.vision.fullatt_block_indexes, m.vision.fullatt_block_indexes);
  EXPECT_DOUBLE_EQ(back.vision.rope_theta, 10000.0);
  EXPECT_EQ(back.image_token_id, 151655);
  EXPECT_EQ(back.vision_end_token_id, 151653);
  EXPECT_EQ(back.mrope_section, m.mrope_section);
  EXPECT_FALSE(ModelSpecFromProto(ToProto(*FindModelPreset("llama-tiny"))).IsVisionLanguage());
  Workload w;
  w.images_per_sample = 2;
  w.image_height = 448;
  w.image_width = 336;
  const Workload wb = WorkloadFromProto(ToProto(w));
  EXPECT_EQ(wb.images_per_sample, 2);
  EXPECT_EQ(wb.image_height, 448);
  EXPECT_EQ(wb.image_width, 336);
  EXPECT_FALSE(wb.vision_checkpoint);
  w.vision_checkpoint = true;
  EXPECT_TRUE(WorkloadFromProto(ToProto(w)).vision_checkpoint);
  ResidencyPlan plan;
  plan.vision_checkpoint = true;
  absl::StatusOr<ResidencyPlan> plan_back = ResidencyPlanFromProto(ToProto(plan), "plan.");
  ASSERT_TRUE(plan_back.ok()) << plan_back.status();
  EXPECT_TRUE(plan_back->vision_checkpoint);
}

TEST(ProtoConvertTest, ModelArchZerosKeepDomainDefaults) {
  v1::ModelArch arch;
  arch.set_hidden_size(256);
  const ModelSpec m = ModelSpecFromProto(arch);
  const ModelSpec defaults;
  EXPECT_EQ(m.family, defaults.family);
  EXPECT_EQ(m.rope_theta, defaults.rope_theta);
  EXPECT_EQ(m.rms_norm_eps, defaults.rms_norm_eps);
  EXPECT_EQ(m.max_position_embeddings, defaults.max_position_embeddings);
  EXPECT_EQ(m.hidden_size, 256);
}

TEST(ProtoConvertTest, HardwareSpecRoundTripsForEveryPreset) {
  for (HardwareSpec h : HardwarePresets()) {
    h.measured = true;
    h.pinned_limit_bytes = 12345;
    const HardwareSpec back = HardwareSpecFromProto(ToProto(h));
    ExpectSameProto(back, h);
    EXPECT_EQ(back.gpu_memory_bytes, h.gpu_memory_bytes);
    EXPECT_EQ(back.cpu_adam_params_per_second, h.cpu_adam_params_per_second);
    EXPECT_GT(back.cpu_grad_accumulate_params_per_second, 0);
    EXPECT_EQ(back.cpu_grad_accumulate_params_per_second, h.cpu_grad_accumulate_params_per_second);
    EXPECT_EQ(back.cpu_adam_update_params_per_second, h.cpu_adam_update_params_per_second);
    EXPECT_TRUE(back.measured);
  }
}

TEST(ProtoConvertTest, WorkloadZeroWorldSizeAndAccumMeanOne) {
  v1::Workload w;
  w.set_micro_batch(2);
  w.set_seq_len(1024);
  const Workload out = WorkloadFromProto(w);
  EXPECT_EQ(out.micro_batch, 2);
  EXPECT_EQ(out.seq_len, 1024);
  EXPECT_EQ(out.world_size, 1);
  EXPECT_EQ(out.grad_accum, 1);

  w.set_world_size(-3);  // passes through so validation can name it
  w.set_grad_accum(7);
  EXPECT_EQ(WorkloadFromProto(w).world_size, -3);
  EXPECT_EQ(WorkloadFromProto(w).grad_accum, 7);
  ExpectSameProto(WorkloadFromProto(ToProto(Workload{5, 77, 4, 2})), Workload{5, 77, 4, 2});
}

TEST(ProtoConvertTest, QloraAndTheDequantizationRateRoundTrip) {
  TrainingMethod t;
  t.kind = TrainingKind::kQlora;
  t.lora_rank = 16;
  t.lora_target_modules = {"q_proj", "down_proj"};
  const v1::TrainingMethod proto = ToProto(t);
  EXPECT_EQ(proto.kind(), v1::TrainingMethod::QLORA);
  auto back = TrainingMethodFromProto(proto, "training.");
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->kind, TrainingKind::kQlora);
  EXPECT_EQ(back->lora_target_modules, t.lora_target_modules);
  HardwareSpec hw = *FindHardwarePreset("h100-80gb");
  hw.nf4_dequant_bytes_per_second = 2.5e12;
  EXPECT_EQ(HardwareSpecFromProto(ToProto(hw)).nf4_dequant_bytes_per_second, 2.5e12);
  hw.cpu_adamw8bit_params_per_second = 3.3e8;
  EXPECT_EQ(HardwareSpecFromProto(ToProto(hw)).cpu_adamw8bit_params_per_second, 3.3e8);
  // [Two CPU passes]: fields 21 and 22; an old profile (neither set) reads back 0.
  hw.cpu_grad_accumulate_params_per_second = 4.5e9;
  hw.cpu_adam_update_params_per_second = 1.4e9;
  const v1::HardwareProfile two = ToProto(hw);
  EXPECT_EQ(two.cpu_grad_accumulate_params_per_second(), 4.5e9);
  EXPECT_EQ(two.cpu_adam_update_params_per_second(), 1.4e9);
  EXPECT_EQ(HardwareSpecFromProto(two).cpu_grad_accumulate_params_per_second, 4.5e9);
  EXPECT_EQ(HardwareSpecFromProto(two).cpu_adam_update_params_per_second, 1.4e9);
  v1::HardwareProfile old = two;
  old.clear_cpu_grad_accumulate_params_per_second();
  old.clear_cpu_adam_update_params_per_second();
  EXPECT_EQ(HardwareSpecFromProto(old).cpu_grad_accumulate_params_per_second, 0);
  EXPECT_EQ(HardwareSpecFromProto(old).cpu_adam_update_params_per_second, 0);
  // [CPU pass bytes]: fields 25 and 26; an older profile reads back 0 (priced by bytes).
  hw.cpu_adamw_bf16_params_per_second = 8.5e9;
  hw.cpu_sgd_params_per_second = 7.25e9;
  const v1::HardwareProfile each = ToProto(hw);
  EXPECT_EQ(each.cpu_adamw_bf16_params_per_second(), 8.5e9);
  EXPECT_EQ(each.cpu_sgd_params_per_second(), 7.25e9);
  EXPECT_EQ(HardwareSpecFromProto(each).cpu_adamw_bf16_params_per_second, 8.5e9);
  EXPECT_EQ(HardwareSpecFromProto(each).cpu_sgd_params_per_second, 7.25e9);
  EXPECT_EQ(HardwareSpecFromProto(two).cpu_sgd_params_per_second, 0);
  // [Collectives under compute]: fields 23 and 24.
  hw.nccl_allgather_under_compute_bytes_per_second = 9e10;
  hw.nccl_reduce_scatter_under_compute_bytes_per_second = 8e10;
  const v1::HardwareProfile beside = ToProto(hw);
  EXPECT_EQ(beside.nccl_allgather_under_compute_bytes_per_second(), 9e10);
  EXPECT_EQ(HardwareSpecFromProto(beside).nccl_allgather_under_compute_bytes_per_second, 9e10);
  EXPECT_EQ(HardwareSpecFromProto(beside).nccl_reduce_scatter_under_compute_bytes_per_second, 8e10);
}

TEST(ProtoConvertTest, TraceRoundTripsEveryField) {
  const Trace t = FullTrace();
  const v1::Trace proto = ToProto(t);
  EXPECT_EQ(proto.blocks_size(), 5);
  EXPECT_EQ(proto.param_dtype(), v1::DTYPE_FP16);
  EXPECT_EQ(proto.training().kind(), v1::TrainingMethod::LORA);
  auto back = TraceFromProto(proto, "trace.");
  ASSERT_TRUE(back.ok()) << back.status();
  ExpectSameProto(*back, t);
  EXPECT_EQ(back->blocks[4].recompute_seconds, t.blocks[4].recompute_seconds);
  EXPECT_EQ(back->training.lora_target_modules, t.training.lora_target_modules);
  EXPECT_EQ(back->chunk_param_bytes, t.chunk_param_bytes);
  EXPECT_FALSE(back->analytic);
}

TEST(ProtoConvertTest, TraceRequiresDType) {
  v1::Trace proto = ToProto(FullTrace());
  proto.set_param_dtype(v1::DTYPE_UNSPECIFIED);
  auto back = TraceFromProto(proto, "trace.");
  EXPECT_EQ(back.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(back.status().message(), HasSubstr("trace.param_dtype is unspecified"));
  EXPECT_THAT(back.status().message(), HasSubstr("DTYPE_BF16"));
}

TEST(ProtoConvertTest, UnknownEnumValuesAreRejectedWithField) {
  v1::Trace proto = ToProto(FullTrace());
  proto.set_param_dtype(static_cast<v1::DType>(42));
  EXPECT_THAT(TraceFromProto(proto, "trace.").status().message(),
              HasSubstr("trace.param_dtype = 42 is not a known value"));

  proto = ToProto(FullTrace());
  proto.mutable_training()->set_kind(static_cast<v1::TrainingMethod::Kind>(9));
  EXPECT_THAT(TraceFromProto(proto, "trace.").status().message(),
              HasSubstr("trace.training.kind = 9"));
}

TEST(ProtoConvertTest, OsftRoundTrips) {
  TrainingMethod t;
  t.kind = TrainingKind::kOsft;
  t.osft_rank_ratio = 0.25;
  t.osft_target_modules = {"q_proj", "down_proj"};
  const v1::TrainingMethod proto = ToProto(t);
  EXPECT_EQ(proto.kind(), v1::TrainingMethod::OSFT);
  EXPECT_EQ(proto.osft_rank_ratio(), 0.25);
  auto back = TrainingMethodFromProto(proto, "training.");
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->kind, TrainingKind::kOsft);
  EXPECT_EQ(back->osft_rank_ratio, 0.25);
  EXPECT_EQ(back->osft_target_modules, t.osft_target_modules);
  EXPECT_EQ(TrainingKindName(TrainingKind::kOsft), "osft");
}

TEST(ProtoConvertTest, TrainingKindUnspecifiedIsFullFineTune) {
  v1::TrainingMethod m;
  auto out = TrainingMethodFromProto(m, "training.");
  ASSERT_TRUE(out.ok());
  EXPECT_EQ(out->kind, TrainingKind::kFull);
}

TEST(ProtoConvertTest, FixedKnobsKeepPresence) {
  FixedKnobs none;
  v1::FixedKnobs proto = ToProto(none);
  EXPECT_FALSE(proto.has_n_persist());
  EXPECT_FALSE(proto.has_host_memory());
  auto back = FixedKnobsFromProto(proto, "fixed.");
  ASSERT_TRUE(back.ok());
  EXPECT_FALSE(back->chunk_bytes || back->n_persist || back->n_buffer || back->n_swap ||
               back->n_checkpoint || back->n_hs_offload || back->host_memory);

  // Zero is a real constraint ("no persistent chunks"), not "unset".
  FixedKnobs some;
  some.n_persist = 0;
  some.n_checkpoint = 7;
  some.chunk_bytes = int64_t{32} << 20;
  some.host_memory = HostMemoryKind::kPageable;
  back = FixedKnobsFromProto(ToProto(some), "fixed.");
  ASSERT_TRUE(back.ok());
  EXPECT_EQ(back->n_persist, std::optional<int32_t>(0));
  EXPECT_EQ(back->n_checkpoint, std::optional<int32_t>(7));
  EXPECT_EQ(back->chunk_bytes, some.chunk_bytes);
  EXPECT_EQ(back->host_memory, std::optional<HostMemoryKind>(HostMemoryKind::kPageable));
  EXPECT_FALSE(back->n_buffer.has_value());
}

TEST(ProtoConvertTest, FixedHostMemorySetButUnspecifiedIsAnError) {
  v1::FixedKnobs proto;
  proto.set_host_memory(v1::HOST_MEMORY_UNSPECIFIED);
  auto back = FixedKnobsFromProto(proto, "fixed.");
  EXPECT_EQ(back.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(back.status().message(), HasSubstr("fixed.host_memory"));
  EXPECT_THAT(back.status().message(), HasSubstr("HOST_MEMORY_PAGEABLE"));
}

TEST(ProtoConvertTest, ResidencyPlanRoundTrips) {
  ResidencyPlan p;
  p.chunk_bytes = int64_t{128} << 20;
  p.n_chunks = 9;
  p.n_persist = 3;
  p.n_buffer = 2;
  p.n_swap = 1;
  p.n_checkpoint = 2;
  p.n_hs_offload = 1;
  p.host_memory = HostMemoryKind::kPageable;
  p.block_modes = {BlockMode::kSwap, BlockMode::kHsOffload, BlockMode::kCkpt, BlockMode::kCkpt,
                   BlockMode::kNone};
  p.world_size = 4;
  p.head_chunk_logit_bytes = int64_t{1} << 30;
  auto back = ResidencyPlanFromProto(ToProto(p), "plan.");
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->block_modes, p.block_modes);
  EXPECT_EQ(back->head_chunk_logit_bytes, int64_t{1} << 30);
  ExpectSameProto(*back, p);
  // An older planner's plan has no head chunk: 0, the default chunk.
  v1::ResidencyPlan old = ToProto(p);
  old.clear_head_chunk_logit_bytes();
  back = ResidencyPlanFromProto(old, "plan.");
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->head_chunk_logit_bytes, 0);
}

TEST(ProtoConvertTest, FixedHeadChunkKeepsPresence) {
  FixedKnobs f;
  EXPECT_FALSE(ToProto(f).has_head_chunk_logit_bytes());
  f.head_chunk_logit_bytes = int64_t{256} << 20;
  auto back = FixedKnobsFromProto(ToProto(f), "fixed.");
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->head_chunk_logit_bytes, f.head_chunk_logit_bytes);
}

TEST(ProtoConvertTest, ResidencyPlanNamesBadBlockModeIndex) {
  v1::ResidencyPlan proto;
  proto.set_host_memory(v1::HOST_MEMORY_PINNED);
  proto.add_block_modes(v1::BLOCK_MODE_NONE);
  proto.add_block_modes(v1::BLOCK_MODE_UNSPECIFIED);
  auto back = ResidencyPlanFromProto(proto, "plan.");
  EXPECT_EQ(back.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(back.status().message(), HasSubstr("plan.block_modes[1] is unspecified"));
}

TEST(ProtoConvertTest, PredictionRoundTrips) {
  Prediction p;
  p.peak_bytes = 1;
  p.breakdown = {2, 3, 4, 5, 6, 7, 8, 9, 1.07, 10, 14, 15};
  p.load_peak_bytes = 11;
  p.host_pinned_bytes = 12;
  p.host_pageable_bytes = 13;
  p.iteration_seconds = 1.5;
  p.forward_seconds = 0.5;
  p.backward_seconds = 0.75;
  p.optimizer_seconds = 0.25;
  p.tokens_per_second = 4096.5;
  const Prediction back = PredictionFromProto(ToProto(p));
  ExpectSameProto(back, p);
  EXPECT_EQ(back.breakdown.fragmentation_factor, 1.07);
  EXPECT_EQ(back.breakdown.calibration_residual_bytes, 10);
  EXPECT_EQ(back.breakdown.head_bytes, 14);
  EXPECT_EQ(back.breakdown.exact_bytes, 15);
  // An unset factor means "uncalibrated", never a zero multiplier.
  EXPECT_EQ(MemoryBreakdownFromProto(v1::MemoryBreakdown()).fragmentation_factor, 1.0);
}

TEST(ProtoConvertTest, MeasurementAndCalibrationRoundTrip) {
  const Measurement m{"plan-1", 10, 20, 30, 40, 0.5, true, "note", 1700000000000};
  ExpectSameProto(MeasurementFromProto(ToProto(m)), m);

  Calibration c;
  c.hardware_name = "h200";
  c.param_dtype = DType::kFloat32;
  c.model_family = "qwen2";
  c.fragmentation_factor = 1.04;
  c.residual_bytes = 1 << 20;
  c.samples = 7;
  c.mean_abs_relative_error = 0.03;
  c.updated_at_unix_ms = 42;
  auto back = CalibrationFromProto(ToProto(c), "calibration.");
  ASSERT_TRUE(back.ok());
  ExpectSameProto(*back, c);
  v1::Calibration bad = ToProto(c);
  bad.clear_param_dtype();
  EXPECT_THAT(CalibrationFromProto(bad, "calibration.").status().message(),
              HasSubstr("calibration.param_dtype"));
}

// Proto -> domain -> proto is the identity on messages that are valid (enums specified, factor
// set): randomised over many field values, with a fixed seed.
TEST(ProtoConvertTest, RandomTracesSurviveProtoDomainProto) {
  std::mt19937_64 rng(12345);
  std::uniform_int_distribution<int64_t> big(-(int64_t{1} << 40), int64_t{1} << 40);
  std::uniform_real_distribution<double> real(-1e6, 1e6);
  for (int iter = 0; iter < 200; ++iter) {
    v1::Trace t;
    t.set_trace_id(std::to_string(rng()));
    t.mutable_arch()->set_family("qwen2");
    t.mutable_arch()->set_hidden_size(big(rng));
    t.mutable_arch()->set_rope_theta(real(rng) + 2e6);
    t.mutable_arch()->set_rms_norm_eps(1e-6);
    t.mutable_arch()->set_max_position_embeddings(1 + (rng() % 100000));
    t.mutable_workload()->set_micro_batch(big(rng));
    t.mutable_workload()->set_world_size(1 + static_cast<int>(rng() % 64));
    t.mutable_workload()->set_grad_accum(1 + static_cast<int>(rng() % 64));
    t.set_param_dtype(static_cast<v1::DType>(1 + rng() % 3));
    t.mutable_training()->set_kind(static_cast<v1::TrainingMethod::Kind>(1 + rng() % 2));
    const int blocks = static_cast<int>(rng() % 8);
    for (int b = 0; b < blocks; ++b) {
      v1::BlockTrace* block = t.add_blocks();
      block->set_saved_bytes(big(rng));
      block->set_backward_seconds(real(rng));
    }
    t.mutable_embedding()->set_param_bytes(big(rng));
    t.mutable_head()->set_forward_transient_bytes(big(rng));
    t.add_chunk_param_bytes(big(rng));
    auto domain = TraceFromProto(t, "");
    ASSERT_TRUE(domain.ok()) << domain.status();
    std::string diff;
    MessageDifferencer d;
    d.ReportDifferencesToString(&diff);
    EXPECT_TRUE(d.Compare(ToProto(*domain), t)) << diff;
  }
}

}  // namespace
}  // namespace memplan
