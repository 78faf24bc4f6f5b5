// The LoRA side of `memplan-agent train`'s configuration: flags and the plan file's method.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "agent/train/train_config.h"

namespace memplan {
namespace {

std::vector<std::string> Base() { return {"--arch", "llama-tiny", "--synthetic-data"}; }

TEST(LoraConfigTest, FlagsFillLoraOptions) {
  std::vector<std::string> args = Base();
  for (const char* a : {"--lora-rank", "8", "--lora-alpha", "32", "--lora-dropout", "0.05",
                        "--lora-targets", "all", "--save-adapter", "out"}) {
    args.push_back(a);
  }
  auto c = ParseTrainArgs(args);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->lora.rank, 8);
  EXPECT_EQ(c->lora.alpha, 32);
  EXPECT_EQ(c->lora.dropout, 0.05);
  EXPECT_EQ(c->lora.targets.size(), 7u);
  EXPECT_EQ(c->save_adapter_dir, "out");
  std::vector<std::string> alpha_only = Base();
  alpha_only.insert(alpha_only.end(), {"--lora-alpha", "8"});
  EXPECT_NE(ParseTrainArgs(alpha_only).status().message().find("needs --lora-rank"),
            std::string::npos);
}

TEST(LoraConfigTest, PlanFileForAnotherMethodIsRefused) {
  TrainConfig lora;
  lora.plan_file = "p.json";
  lora.lora.rank = 16;
  lora.lora.targets = {"v_proj", "q_proj"};
  const std::string lora_plan =
      R"({"request": {"training": {"kind": "TRAINING_KIND_LORA", "lora_rank": "16",
          "lora_target_modules": ["q_proj", "v_proj"]}}, "plan": {"n_persist": 1}})";
  auto file = PlanFileFromJson(lora_plan);
  ASSERT_TRUE(file.ok()) << file.status();
  const std::optional<TrainingMethod> t = file->training;
  ASSERT_TRUE(t.has_value());
  EXPECT_EQ(t->kind, TrainingKind::kLora);
  EXPECT_TRUE(CheckPlanTraining(lora, t).ok());

  TrainConfig full;
  full.plan_file = "p.json";
  const absl::Status refused = CheckPlanTraining(full, t);
  EXPECT_EQ(refused.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(refused.message().find("was made for LoRA rank 16 on q_proj,v_proj, this run is a "
                                   "full fine-tune"),
            std::string::npos)
      << refused;
  lora.lora.rank = 8;
  EXPECT_FALSE(CheckPlanTraining(lora, t).ok());

  // A file that names no method (a bare plan) is accepted.
  auto none = PlanFileFromJson(R"({"n_persist": 1})");
  ASSERT_TRUE(none.ok());
  EXPECT_FALSE(none->training.has_value());
  EXPECT_TRUE(CheckPlanTraining(full, none->training).ok());
}

}  // namespace
}  // namespace memplan
