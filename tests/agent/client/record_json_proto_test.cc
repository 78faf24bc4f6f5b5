// The agent's JSON records against the wire schema: a trace file is proto JSON the planner CLI
// accepts, and proto JSON of a PlanResponse (`memplan --json plan`) is a plan file.
#include <google/protobuf/util/json_util.h>
#include <gtest/gtest.h>

#include "agent/client/record_json.h"
#include "common/presets.h"
#include "common/proto_convert.h"
#include "memplan/v1/planner.pb.h"

namespace memplan {
namespace {

TEST(RecordJsonProtoTest, TraceFileIsProtoJson) {
  Trace t;
  t.arch = *FindModelPreset("llama-tiny");
  t.arch.sliding_window = 16;
  t.arch.sliding_layers = {1, 3};
  t.workload = Workload{2, 64, 1, 1};
  t.param_dtype = DType::kBFloat16;
  t.training.kind = TrainingKind::kLora;
  t.training.lora_rank = 8;
  t.hardware_name = "h100-80gb";
  t.analytic = false;
  for (int64_t i = 0; i < t.arch.num_layers; ++i) {
    t.blocks.push_back(BlockTrace{10 + i, 20, 30, 40, 50, 0.5, 0.25, 0.125});
  }
  t.forward_end_bytes = int64_t{1} << 40;
  t.chunk_param_bytes = {int64_t{1} << 35, 7};
  v1::Trace message;
  google::protobuf::util::JsonParseOptions strict;
  strict.ignore_unknown_fields = false;
  const auto parsed = google::protobuf::util::JsonStringToMessage(TraceToJson(t), &message, strict);
  ASSERT_TRUE(parsed.ok()) << parsed.ToString();
  absl::StatusOr<Trace> back = TraceFromProto(message, "");
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->param_dtype, DType::kBFloat16);
  EXPECT_EQ(back->arch.sliding_window, 16);
  EXPECT_EQ(back->arch.sliding_layers, (std::vector<int64_t>{1, 3}));
  EXPECT_EQ(back->training.kind, TrainingKind::kLora);
  EXPECT_EQ(back->forward_end_bytes, t.forward_end_bytes);
  EXPECT_EQ(back->chunk_param_bytes, t.chunk_param_bytes);
  ASSERT_EQ(back->blocks.size(), t.blocks.size());
  EXPECT_EQ(back->blocks[3].param_bytes, 13);
  EXPECT_EQ(back->blocks[3].recompute_seconds, 0.125);
}

TEST(RecordJsonProtoTest, MixtureOfExpertsTraceKeepsItsExperts) {
  Trace t;
  t.arch = *FindModelPreset("llama-tiny");
  t.arch.family = "qwen3_moe";
  t.arch.qk_norm = true;
  t.arch.num_experts = 16;
  t.arch.num_experts_per_tok = 4;
  t.arch.moe_intermediate_size = 96;
  t.arch.norm_topk_prob = true;
  t.arch.decoder_sparse_step = 2;
  t.arch.mlp_only_layers = {1};
  t.arch.output_router_logits = true;
  t.arch.router_aux_loss_coef = 0.01;
  t.workload = Workload{1, 32, 1, 1};
  t.param_dtype = DType::kBFloat16;
  t.hardware_name = "h200";
  for (int64_t i = 0; i < t.arch.num_layers; ++i) {
    t.blocks.push_back(BlockTrace{10, 20, 30, 40, 50, 0.5, 0.25, 0.125});
  }
  v1::Trace message;
  google::protobuf::util::JsonParseOptions strict;
  strict.ignore_unknown_fields = false;
  const auto parsed = google::protobuf::util::JsonStringToMessage(TraceToJson(t), &message, strict);
  ASSERT_TRUE(parsed.ok()) << parsed.ToString();
  EXPECT_EQ(message.arch().num_experts(), 16);
  absl::StatusOr<Trace> back = TraceFromProto(message, "");
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->arch.num_experts, 16);
  EXPECT_EQ(back->arch.num_experts_per_tok, 4);
  EXPECT_EQ(back->arch.moe_intermediate_size, 96);
  EXPECT_TRUE(back->arch.norm_topk_prob);
  EXPECT_EQ(back->arch.decoder_sparse_step, 2);
  EXPECT_EQ(back->arch.mlp_only_layers, (std::vector<int64_t>{1}));
  EXPECT_TRUE(back->arch.output_router_logits);
  EXPECT_DOUBLE_EQ(back->arch.router_aux_loss_coef, 0.01);
}

TEST(RecordJsonProtoTest, HardwareFileIsProtoJson) {
  HardwareSpec h = *FindHardwarePreset("h200");
  h.measured = true;
  v1::HardwareProfile message;
  google::protobuf::util::JsonParseOptions strict;
  ASSERT_TRUE(
      google::protobuf::util::JsonStringToMessage(HardwareSpecToJson(h), &message, strict).ok());
  const HardwareSpec back = HardwareSpecFromProto(message);
  EXPECT_EQ(back.gpu_memory_bytes, h.gpu_memory_bytes);
  EXPECT_EQ(back.hbm_bytes_per_second, h.hbm_bytes_per_second);
  EXPECT_TRUE(back.measured);
}

TEST(RecordJsonProtoTest, PlanResponseProtoJsonIsAPlanFile) {
  v1::PlanResponse r;
  r.set_fits(true);
  r.set_reason("fits");
  r.set_plan_id("plan-9");
  r.set_capacity_bytes(int64_t{70} << 30);
  ResidencyPlan plan;
  plan.chunk_bytes = int64_t{64} << 20;
  plan.n_chunks = 9;
  plan.n_persist = 4;
  plan.n_buffer = 2;
  plan.n_checkpoint = 1;
  plan.host_memory = HostMemoryKind::kPageable;
  plan.block_modes = {BlockMode::kCkpt, BlockMode::kHsOffload, BlockMode::kNone};
  *r.mutable_plan() = ToProto(plan);
  r.mutable_prediction()->set_peak_bytes(int64_t{60} << 30);
  google::protobuf::util::JsonPrintOptions camel;  // lowerCamelCase keys, int64 as strings
  std::string json;
  ASSERT_TRUE(google::protobuf::util::MessageToJsonString(r, &json, camel).ok());
  ASSERT_NE(json.find("planId"), std::string::npos);
  absl::StatusOr<PlanAnswer> a = PlanAnswerFromJson(json);
  ASSERT_TRUE(a.ok()) << a.status() << "\n" << json;
  EXPECT_TRUE(a->fits);
  EXPECT_EQ(a->plan_id, "plan-9");
  EXPECT_EQ(a->capacity_bytes, int64_t{70} << 30);
  EXPECT_EQ(a->prediction.peak_bytes, int64_t{60} << 30);
  EXPECT_EQ(a->plan.chunk_bytes, plan.chunk_bytes);
  EXPECT_EQ(a->plan.n_persist, 4);
  EXPECT_EQ(a->plan.host_memory, HostMemoryKind::kPageable);
  EXPECT_EQ(a->plan.block_modes, plan.block_modes);
}

}  // namespace
}  // namespace memplan
