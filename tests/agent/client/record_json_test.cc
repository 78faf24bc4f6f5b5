#include "agent/client/record_json.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include "common/presets.h"
#ifdef MEMPLAN_HAVE_TRAIN_CONFIG
#include "agent/train/train_config.h"
#endif

namespace memplan {
namespace {

using ::testing::HasSubstr;

ResidencyPlan SamplePlan() {
  ResidencyPlan p;
  p.chunk_bytes = int64_t{96} << 20;
  p.n_chunks = 17;
  p.n_persist = 5;
  p.n_buffer = 3;
  p.n_swap = 1;
  p.n_checkpoint = 2;
  p.n_hs_offload = 1;
  p.host_memory = HostMemoryKind::kPageable;
  p.block_modes = {BlockMode::kSwap, BlockMode::kCkpt, BlockMode::kHsOffload, BlockMode::kCkpt,
                   BlockMode::kNone};
  p.world_size = 1;
  p.layout_fingerprint = "0123456789abcdef";
  p.vision_checkpoint = true;
  p.head_chunk_logit_bytes = int64_t{1} << 30;
  return p;
}

Prediction SamplePrediction(int64_t salt) {
  Prediction p;
  p.peak_bytes = (int64_t{70} << 30) + salt;  // beyond 2^32: int64 must survive
  p.breakdown.persistent_chunks_bytes = 1 + salt;
  p.breakdown.buffers_bytes = 2;
  p.breakdown.grads_bytes = 3;
  p.breakdown.optimizer_state_bytes = 4;
  p.breakdown.activations_bytes = 5;
  p.breakdown.checkpoint_chain_bytes = 6;
  p.breakdown.transient_bytes = 7;
  p.breakdown.cuda_context_bytes = 8;
  p.breakdown.fragmentation_factor = 1.0625;
  p.breakdown.calibration_residual_bytes = -9;
  p.breakdown.head_bytes = 11;
  p.breakdown.exact_bytes = 1;
  p.load_peak_bytes = 10;
  p.host_pinned_bytes = 11;
  p.host_pageable_bytes = 12;
  p.iteration_seconds = 0.125;
  p.forward_seconds = 0.03125;
  p.backward_seconds = 0.0625;
  p.optimizer_seconds = 0.015625;
  p.tokens_per_second = 65536.5;
  return p;
}

PlanAnswer SampleAnswer() {
  PlanAnswer a;
  a.fits = true;
  a.reason = "fits with \"quotes\" and\nnewlines";
  a.plan = SamplePlan();
  a.prediction = SamplePrediction(0);
  a.max_micro_batch = 12;
  a.max_seq_len = 32768;
  a.min_gpu_memory_bytes = int64_t{24} << 30;
  ResidencyPlan alt_plan = SamplePlan();
  alt_plan.n_persist = 0;
  a.alternatives.push_back({alt_plan, SamplePrediction(1), "less memory"});
  a.alternatives.push_back({SamplePlan(), SamplePrediction(2), "faster"});
  a.plan_id = "plan-42";
  a.trace_id = "trace-7";
  a.analytic_trace = false;
  a.capacity_bytes = int64_t{75} << 30;
  a.search_seconds = 0.004;
  a.plans_evaluated = 123456;
  return a;
}

void ExpectSamePlan(const ResidencyPlan& a, const ResidencyPlan& b) {
  EXPECT_EQ(a.chunk_bytes, b.chunk_bytes);
  EXPECT_EQ(a.n_chunks, b.n_chunks);
  EXPECT_EQ(a.n_persist, b.n_persist);
  EXPECT_EQ(a.n_buffer, b.n_buffer);
  EXPECT_EQ(a.n_swap, b.n_swap);
  EXPECT_EQ(a.n_checkpoint, b.n_checkpoint);
  EXPECT_EQ(a.n_hs_offload, b.n_hs_offload);
  EXPECT_EQ(a.host_memory, b.host_memory);
  EXPECT_EQ(a.block_modes, b.block_modes);
  EXPECT_EQ(a.world_size, b.world_size);
  EXPECT_EQ(a.layout_fingerprint, b.layout_fingerprint);
  EXPECT_EQ(a.vision_checkpoint, b.vision_checkpoint);
  EXPECT_EQ(a.head_chunk_logit_bytes, b.head_chunk_logit_bytes);
}

void ExpectSamePrediction(const Prediction& a, const Prediction& b) {
  EXPECT_EQ(a.peak_bytes, b.peak_bytes);
  EXPECT_EQ(a.breakdown.persistent_chunks_bytes, b.breakdown.persistent_chunks_bytes);
  EXPECT_EQ(a.breakdown.buffers_bytes, b.breakdown.buffers_bytes);
  EXPECT_EQ(a.breakdown.grads_bytes, b.breakdown.grads_bytes);
  EXPECT_EQ(a.breakdown.optimizer_state_bytes, b.breakdown.optimizer_state_bytes);
  EXPECT_EQ(a.breakdown.activations_bytes, b.breakdown.activations_bytes);
  EXPECT_EQ(a.breakdown.checkpoint_chain_bytes, b.breakdown.checkpoint_chain_bytes);
  EXPECT_EQ(a.breakdown.transient_bytes, b.breakdown.transient_bytes);
  EXPECT_EQ(a.breakdown.cuda_context_bytes, b.breakdown.cuda_context_bytes);
  EXPECT_EQ(a.breakdown.fragmentation_factor, b.breakdown.fragmentation_factor);
  EXPECT_EQ(a.breakdown.calibration_residual_bytes, b.breakdown.calibration_residual_bytes);
  EXPECT_EQ(a.breakdown.head_bytes, b.breakdown.head_bytes);
  EXPECT_EQ(a.breakdown.exact_bytes, b.breakdown.exact_bytes);
  EXPECT_EQ(a.load_peak_bytes, b.load_peak_bytes);
  EXPECT_EQ(a.host_pinned_bytes, b.host_pinned_bytes);
  EXPECT_EQ(a.host_pageable_bytes, b.host_pageable_bytes);
  EXPECT_EQ(a.iteration_seconds, b.iteration_seconds);
  EXPECT_EQ(a.forward_seconds, b.forward_seconds);
  EXPECT_EQ(a.backward_seconds, b.backward_seconds);
  EXPECT_EQ(a.optimizer_seconds, b.optimizer_seconds);
  EXPECT_EQ(a.tokens_per_second, b.tokens_per_second);
}

TEST(RecordJsonTest, PlanAnswerRoundTripsEveryField) {
  const PlanAnswer a = SampleAnswer();
  absl::StatusOr<PlanAnswer> b = PlanAnswerFromJson(PlanAnswerToJson(a));
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ(b->fits, a.fits);
  EXPECT_EQ(b->reason, a.reason);
  ExpectSamePlan(b->plan, a.plan);
  ExpectSamePrediction(b->prediction, a.prediction);
  EXPECT_EQ(b->max_micro_batch, a.max_micro_batch);
  EXPECT_EQ(b->max_seq_len, a.max_seq_len);
  EXPECT_EQ(b->min_gpu_memory_bytes, a.min_gpu_memory_bytes);
  ASSERT_EQ(b->alternatives.size(), a.alternatives.size());
  for (size_t i = 0; i < a.alternatives.size(); ++i) {
    ExpectSamePlan(b->alternatives[i].plan, a.alternatives[i].plan);
    ExpectSamePrediction(b->alternatives[i].prediction, a.alternatives[i].prediction);
    EXPECT_EQ(b->alternatives[i].note, a.alternatives[i].note);
  }
  EXPECT_EQ(b->plan_id, a.plan_id);
  EXPECT_EQ(b->trace_id, a.trace_id);
  EXPECT_EQ(b->analytic_trace, a.analytic_trace);
  EXPECT_EQ(b->capacity_bytes, a.capacity_bytes);
  EXPECT_EQ(b->search_seconds, a.search_seconds);
  EXPECT_EQ(b->plans_evaluated, a.plans_evaluated);
}

TEST(RecordJsonTest, PlanFileNamesTheBadField) {
  absl::StatusOr<PlanAnswer> bad_mode =
      PlanAnswerFromJson(R"({"plan": {"block_modes": ["ckpt", "sideways"]}})");
  ASSERT_EQ(bad_mode.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(bad_mode.status().message(), HasSubstr("plan.block_modes[1]"));

  absl::StatusOr<PlanAnswer> bad_type = PlanAnswerFromJson(R"({"plan": {"n_persist": "three"}})");
  ASSERT_EQ(bad_type.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(bad_type.status().message(), HasSubstr("plan.n_persist"));

  absl::StatusOr<PlanAnswer> bad_host =
      PlanAnswerFromJson(R"({"plan": {"host_memory": "swapfile"}})");
  EXPECT_THAT(bad_host.status().message(), HasSubstr("plan.host_memory"));

  absl::StatusOr<PlanAnswer> nested = PlanAnswerFromJson(
      R"({"plan": {}, "alternatives": [{"plan": {}}, {"prediction": {"breakdown": []}}]})");
  ASSERT_EQ(nested.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(nested.status().message(), HasSubstr("alternatives[1].prediction.breakdown"));

  EXPECT_THAT(PlanAnswerFromJson("{}").status().message(), HasSubstr("plan is missing"));
  EXPECT_THAT(PlanAnswerFromJson("{not json").status().message(), HasSubstr("not valid JSON"));
  EXPECT_THAT(PlanAnswerFromJson("[1, 2]").status().message(), HasSubstr("JSON object"));
}

// The one plan-file reader: holders at any depth, what the plan was made for, both key spellings,
// 64-bit integers as strings, enums by short name, proto name or proto number.
TEST(RecordJsonTest, PlanFileReadsEveryHolderOnce) {
  absl::StatusOr<PlanFile> f = PlanFileFromJson(R"({"request": {"optimizer": "sgd",
      "training": {"kind": "LORA", "loraRank": "8", "loraTargetModules": ["q_proj"]}},
      "plan": {"fits": true, "planId": "p-2",
               "prediction": {"peakBytes": "5", "tokensPerSecond": "Infinity"},
               "plan": {"chunkBytes": "1024", "nPersist": 2, "hostMemory": 2,
                        "blockModes": [2, "BLOCK_MODE_SWAP", "hs-offload"]}}})");
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_FALSE(f->bare);
  EXPECT_FALSE(f->does_not_fit_reason.has_value());
  EXPECT_EQ(f->optimizer, OptimizerKind::kSgd);
  ASSERT_TRUE(f->training.has_value());
  EXPECT_EQ(f->training->kind, TrainingKind::kLora);
  EXPECT_EQ(f->training->lora_rank, 8);
  EXPECT_EQ(f->training->lora_target_modules, std::vector<std::string>{"q_proj"});
  EXPECT_TRUE(f->answer.fits);
  EXPECT_EQ(f->answer.plan_id, "p-2");
  EXPECT_EQ(f->answer.prediction.peak_bytes, 5);
  EXPECT_EQ(f->answer.prediction.tokens_per_second, std::numeric_limits<double>::infinity());
  EXPECT_EQ(f->answer.plan.chunk_bytes, 1024);
  EXPECT_EQ(f->answer.plan.n_persist, 2);
  EXPECT_EQ(f->answer.plan.host_memory, HostMemoryKind::kPageable);
  EXPECT_EQ(f->answer.plan.block_modes,
            (std::vector<BlockMode>{BlockMode::kCkpt, BlockMode::kSwap, BlockMode::kHsOffload}));

  // A bare plan: no holder, so no verdict; PlanAnswerFromJson wants one.
  f = PlanFileFromJson(R"({"n_persist": 1, "fits": false, "optimizer": "adamw"})");
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_TRUE(f->bare);
  EXPECT_FALSE(f->does_not_fit_reason.has_value());
  EXPECT_EQ(f->answer.plan.n_persist, 1);
  EXPECT_EQ(f->optimizer, OptimizerKind::kAdamW);
  EXPECT_THAT(PlanAnswerFromJson(R"({"n_persist": 1})").status().message(),
              HasSubstr("plan is missing"));

  // A "does not fit" verdict anywhere on the way in is kept, with its reason.
  f = PlanFileFromJson(R"({"plan": {"fits": false, "reason": "too big", "plan": {}}})");
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ(f->does_not_fit_reason, "too big");
  EXPECT_FALSE(f->answer.fits);
  EXPECT_EQ(f->answer.reason, "too big");
}

TEST(RecordJsonTest, PlanFileErrorsNameTheFieldByItsPath) {
  auto message = [](const char* json) {
    return std::string(PlanFileFromJson(json).status().message());
  };
  EXPECT_THAT(message(R"({"plan": {"plan": {"n_buffer": "x"}}})"),
              HasSubstr("plan.plan.n_buffer is not an integer"));
  EXPECT_THAT(message(R"({"n_buffer": 1.5})"), HasSubstr("plan.n_buffer is not an integer"));
  // Numbers are range-checked, never truncated into a narrower field.
  EXPECT_THAT(message(R"({"plan": {"n_persist": 4294967296}})"),
              HasSubstr("plan.n_persist = 4294967296 is outside [0, 1048576]"));
  EXPECT_THAT(message(R"({"plan": {"chunk_bytes": "-1"}})"),
              HasSubstr("plan.chunk_bytes = -1 is outside [0, 17592186044416]"));
  EXPECT_THAT(message(R"({"plan": {}, "max_seq_len": 18446744073709551615})"),
              HasSubstr("max_seq_len = 18446744073709551615 is outside"));
  EXPECT_THAT(message(R"({"plan": {"shard_persistent_state": "yes"}})"),
              HasSubstr("plan.shard_persistent_state must be true or false"));
  EXPECT_THAT(message(R"({"plan": {"host_memory": 3}})"),
              HasSubstr("plan.host_memory = 3 is not pinned or pageable"));
  EXPECT_THAT(message(R"({"request": {"optimizer": "adafactor"}, "plan": {}})"),
              HasSubstr("request.optimizer = \"adafactor\" is not one of adamw"));
  EXPECT_THAT(message(R"({"plan": {"training": {"kind": "prefix"}}})"),
              HasSubstr("plan.training.kind = \"prefix\" is not full, lora or qlora"));
  EXPECT_THAT(message(R"({"plan": 5})"), HasSubstr("plan must be a JSON object"));
}

TEST(RecordJsonTest, EnumNamesInAnySpelling) {
  EXPECT_EQ(ParseBlockModeName(" BLOCK_MODE_HS_OFFLOAD "), BlockMode::kHsOffload);
  EXPECT_EQ(ParseBlockModeName("hs-offload"), BlockMode::kHsOffload);
  EXPECT_EQ(ParseBlockModeName("Checkpoint"), BlockMode::kCkpt);
  EXPECT_EQ(ParseBlockModeName("fast"), std::nullopt);
  EXPECT_EQ(ParseHostMemoryName("HOST_MEMORY_PAGEABLE"), HostMemoryKind::kPageable);
  EXPECT_EQ(ParseHostMemoryName("gpu"), std::nullopt);
}

Trace SampleTrace() {
  Trace t;
  t.trace_id = "t-1";
  t.arch = *FindModelPreset("qwen2.5-0.5b");
  t.arch.sliding_window = 1024;
  t.arch.sliding_layers = {20, 22, 23};
  t.workload = Workload{4, 2048, 1, 2};
  t.param_dtype = DType::kFloat16;
  t.training.kind = TrainingKind::kLora;
  t.training.lora_rank = 16;
  t.training.lora_target_modules = {"q_proj", "v_proj"};
  t.hardware_name = "h100-80gb";
  t.analytic = false;
  t.embedding = EdgeTrace{100, 200, 300, 400, 0.5, 0.25};
  for (int i = 0; i < 3; ++i) {
    t.blocks.push_back(
        BlockTrace{1000 + i, 2000, 3000, 4000, 5000, 0.001 * (i + 1), 0.002, 0.0011});
  }
  t.head = EdgeTrace{7, 8, 9, 10, 0.75, 1.5};
  t.trainable_param_count = 123;
  t.total_param_count = int64_t{5} << 33;
  t.forward_end_bytes = int64_t{3} << 32;
  t.chunk_bytes = 1 << 26;
  t.chunk_param_bytes = {1, 2, int64_t{1} << 40};
  return t;
}

TEST(RecordJsonTest, TraceRoundTripsEveryField) {
  const Trace a = SampleTrace();
  absl::StatusOr<Trace> b = TraceFromJson(TraceToJson(a));
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ(b->trace_id, a.trace_id);
  EXPECT_EQ(b->arch.name, a.arch.name);
  EXPECT_EQ(b->arch.family, a.arch.family);
  EXPECT_EQ(b->arch.hidden_size, a.arch.hidden_size);
  EXPECT_EQ(b->arch.num_layers, a.arch.num_layers);
  EXPECT_EQ(b->arch.num_heads, a.arch.num_heads);
  EXPECT_EQ(b->arch.num_kv_heads, a.arch.num_kv_heads);
  EXPECT_EQ(b->arch.head_dim, a.arch.head_dim);
  EXPECT_EQ(b->arch.intermediate_size, a.arch.intermediate_size);
  EXPECT_EQ(b->arch.vocab_size, a.arch.vocab_size);
  EXPECT_EQ(b->arch.tie_word_embeddings, a.arch.tie_word_embeddings);
  EXPECT_EQ(b->arch.qkv_bias, a.arch.qkv_bias);
  EXPECT_EQ(b->arch.qk_norm, a.arch.qk_norm);
  EXPECT_EQ(b->arch.rope_theta, a.arch.rope_theta);
  EXPECT_EQ(b->arch.rms_norm_eps, a.arch.rms_norm_eps);
  EXPECT_EQ(b->arch.max_position_embeddings, a.arch.max_position_embeddings);
  EXPECT_EQ(b->arch.sliding_window, 1024);
  EXPECT_EQ(b->arch.sliding_layers, a.arch.sliding_layers);
  EXPECT_EQ(b->workload.micro_batch, 4);
  EXPECT_EQ(b->workload.seq_len, 2048);
  EXPECT_EQ(b->workload.grad_accum, 2);
  EXPECT_EQ(b->param_dtype, DType::kFloat16);
  EXPECT_EQ(b->training.kind, TrainingKind::kLora);
  EXPECT_EQ(b->training.lora_rank, 16);
  EXPECT_EQ(b->training.lora_target_modules, a.training.lora_target_modules);
  EXPECT_EQ(b->hardware_name, a.hardware_name);
  EXPECT_FALSE(b->analytic);
  EXPECT_EQ(b->embedding.saved_bytes, 200);
  EXPECT_EQ(b->embedding.backward_seconds, 0.25);
  ASSERT_EQ(b->blocks.size(), 3u);
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(b->blocks[i].param_bytes, a.blocks[i].param_bytes);
    EXPECT_EQ(b->blocks[i].input_bytes, a.blocks[i].input_bytes);
    EXPECT_EQ(b->blocks[i].saved_bytes, a.blocks[i].saved_bytes);
    EXPECT_EQ(b->blocks[i].forward_transient_bytes, a.blocks[i].forward_transient_bytes);
    EXPECT_EQ(b->blocks[i].backward_transient_bytes, a.blocks[i].backward_transient_bytes);
    EXPECT_EQ(b->blocks[i].forward_seconds, a.blocks[i].forward_seconds);
    EXPECT_EQ(b->blocks[i].backward_seconds, a.blocks[i].backward_seconds);
    EXPECT_EQ(b->blocks[i].recompute_seconds, a.blocks[i].recompute_seconds);
  }
  EXPECT_EQ(b->head.param_bytes, 7);
  EXPECT_EQ(b->head.forward_seconds, 0.75);
  EXPECT_EQ(b->trainable_param_count, 123);
  EXPECT_EQ(b->total_param_count, a.total_param_count);
  EXPECT_EQ(b->forward_end_bytes, a.forward_end_bytes);
  EXPECT_EQ(b->chunk_bytes, a.chunk_bytes);
  EXPECT_EQ(b->chunk_param_bytes, a.chunk_param_bytes);
}

TEST(RecordJsonTest, TraceNeedsAKnownDType) {
  EXPECT_THAT(TraceFromJson(R"({"blocks": []})").status().message(),
              HasSubstr("param_dtype is missing"));
  EXPECT_THAT(TraceFromJson(R"({"param_dtype": "fp8"})").status().message(),
              HasSubstr("param_dtype"));
  EXPECT_THAT(TraceFromJson(R"({"param_dtype": "bf16", "blocks": [{}, {"saved_bytes": 1.5}]})")
                  .status()
                  .message(),
              HasSubstr("blocks[1].saved_bytes"));
}

TEST(RecordJsonTest, HardwareRoundTripsEveryField) {
  HardwareSpec a = *FindHardwarePreset("h100-80gb");
  a.name = "measured-h100";
  a.bidirectional_pinned_bytes_per_second = 77e9;
  a.nccl_allgather_bytes_per_second = 1.5e11;
  a.nccl_reduce_scatter_bytes_per_second = 1.25e11;
  a.nccl_allgather_under_compute_bytes_per_second = 0.9e11;
  a.nccl_reduce_scatter_under_compute_bytes_per_second = 0.8e11;
  a.pinned_limit_bytes = int64_t{1} << 36;
  a.measured = true;
  a.cpu_grad_accumulate_params_per_second = 4.5e9;
  a.cpu_adam_update_params_per_second = 1.4e9;
  a.cpu_adamw_bf16_params_per_second = 8.5e9;
  a.cpu_sgd_params_per_second = 7.25e9;
  absl::StatusOr<HardwareSpec> b = HardwareSpecFromJson(HardwareSpecToJson(a));
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ(b->name, a.name);
  EXPECT_EQ(b->gpu_memory_bytes, a.gpu_memory_bytes);
  EXPECT_EQ(b->cuda_context_bytes, a.cuda_context_bytes);
  EXPECT_EQ(b->h2d_pinned_bytes_per_second, a.h2d_pinned_bytes_per_second);
  EXPECT_EQ(b->d2h_pinned_bytes_per_second, a.d2h_pinned_bytes_per_second);
  EXPECT_EQ(b->h2d_pageable_bytes_per_second, a.h2d_pageable_bytes_per_second);
  EXPECT_EQ(b->d2h_pageable_bytes_per_second, a.d2h_pageable_bytes_per_second);
  EXPECT_EQ(b->bidirectional_pinned_bytes_per_second, a.bidirectional_pinned_bytes_per_second);
  EXPECT_EQ(b->hbm_bytes_per_second, a.hbm_bytes_per_second);
  EXPECT_EQ(b->matmul_bf16_flops, a.matmul_bf16_flops);
  EXPECT_EQ(b->matmul_fp16_flops, a.matmul_fp16_flops);
  EXPECT_EQ(b->matmul_fp32_flops, a.matmul_fp32_flops);
  EXPECT_EQ(b->nccl_allgather_bytes_per_second, a.nccl_allgather_bytes_per_second);
  EXPECT_EQ(b->nccl_reduce_scatter_bytes_per_second, a.nccl_reduce_scatter_bytes_per_second);
  EXPECT_EQ(b->nccl_allgather_under_compute_bytes_per_second,
            a.nccl_allgather_under_compute_bytes_per_second);
  EXPECT_EQ(b->nccl_reduce_scatter_under_compute_bytes_per_second,
            a.nccl_reduce_scatter_under_compute_bytes_per_second);
  EXPECT_EQ(b->cpu_adam_params_per_second, a.cpu_adam_params_per_second);
  EXPECT_EQ(b->cpu_grad_accumulate_params_per_second, a.cpu_grad_accumulate_params_per_second);
  EXPECT_EQ(b->cpu_adam_update_params_per_second, a.cpu_adam_update_params_per_second);
  EXPECT_EQ(b->cpu_adamw_bf16_params_per_second, a.cpu_adamw_bf16_params_per_second);
  EXPECT_EQ(b->cpu_sgd_params_per_second, a.cpu_sgd_params_per_second);
  EXPECT_EQ(b->host_memory_bytes, a.host_memory_bytes);
  EXPECT_EQ(b->pinned_limit_bytes, a.pinned_limit_bytes);
  EXPECT_TRUE(b->measured);
}

TEST(RecordJsonTest, FilesRoundTripAndMissingFilesAreNotFound) {
  const std::string path =
      ::testing::TempDir() + "/record_json_test_" + std::to_string(::getpid()) + ".json";
  const std::string text = PlanAnswerToJson(SampleAnswer());
  ASSERT_TRUE(WriteTextFile(path, text).ok());
  absl::StatusOr<std::string> back = ReadTextFile(path);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(*back, text);
  std::remove(path.c_str());
  EXPECT_EQ(ReadTextFile(path).status().code(), absl::StatusCode::kNotFound);
  EXPECT_FALSE(WriteTextFile("/nonexistent-dir/x.json", text).ok());
}

#ifdef MEMPLAN_HAVE_TRAIN_CONFIG
// `memplan-agent train --plan-file` reads plan files with agent/train's parser.
TEST(RecordJsonTest, TrainConfigReadsPlanFiles) {
  const PlanAnswer a = SampleAnswer();
  absl::StatusOr<ResidencyPlan> plan = ParsePlanJson(PlanAnswerToJson(a));
  ASSERT_TRUE(plan.ok()) << plan.status();
  ExpectSamePlan(*plan, a.plan);
}
#endif

}  // namespace
}  // namespace memplan
