// The OSFT side of `memplan-agent train`'s configuration: --osft-rank-ratio and --osft-targets,
// what an OSFT run refuses for now (LoRA, a residency plan), and its checkpoint flags.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "agent/train/train_config.h"

namespace memplan {
namespace {

std::vector<std::string> Args(std::vector<std::string> extra) {
  std::vector<std::string> args = {"--arch", "llama-tiny", "--synthetic-data"};
  args.insert(args.end(), extra.begin(), extra.end());
  return args;
}

std::string Error(std::vector<std::string> extra) {
  return std::string(ParseTrainArgs(Args(std::move(extra))).status().message());
}

TEST(OsftConfigTest, RatioAndTargets) {
  auto all = ParseTrainArgs(Args({"--osft-rank-ratio", "0.5"}));
  ASSERT_TRUE(all.ok()) << all.status();
  EXPECT_EQ(all->osft.rank_ratio, 0.5);
  EXPECT_EQ(all->osft.targets.size(), 7u);  // default: every projection
  auto some = ParseTrainArgs(Args({"--osft-rank-ratio", "0.25", "--osft-targets", "q_proj,o_proj"}));
  ASSERT_TRUE(some.ok()) << some.status();
  EXPECT_EQ(some->osft.targets, (std::vector<std::string>{"q_proj", "o_proj"}));
  auto none = ParseTrainArgs(Args({}));
  ASSERT_TRUE(none.ok()) << none.status();
  EXPECT_FALSE(none->osft.enabled());
}

TEST(OsftConfigTest, BadFlagsNameTheFlag) {
  EXPECT_NE(Error({"--osft-rank-ratio", "1"}).find("--osft-rank-ratio"), std::string::npos);
  EXPECT_NE(Error({"--osft-rank-ratio", "0"}).find("--osft-rank-ratio"), std::string::npos);
  EXPECT_NE(Error({"--osft-targets", "all"}).find("needs --osft-rank-ratio"), std::string::npos);
  EXPECT_NE(Error({"--osft-rank-ratio", "0.5", "--osft-targets", "qproj"}).find("--osft-targets"),
            std::string::npos);
}

TEST(OsftConfigTest, RefusesWhatOsftDoesNotRunYet) {
  for (const std::vector<std::string>& extra : std::vector<std::vector<std::string>>{
           {"--lora-rank", "4", "--lora-targets", "all"}, {"--chunk-mib", "1"}}) {
    std::vector<std::string> args = {"--osft-rank-ratio", "0.5"};
    args.insert(args.end(), extra.begin(), extra.end());
    const std::string error = Error(args);
    EXPECT_NE(error.find("--osft-rank-ratio"), std::string::npos) << extra[0] << ": " << error;
    EXPECT_NE(error.find(extra[0].substr(0, 7)), std::string::npos) << extra[0] << ": " << error;
  }
}

// [OSFT checkpoints] (agent/io/osft_checkpoint.h)
TEST(OsftConfigTest, SavesAndResumes) {
  auto c = ParseTrainArgs(
      Args({"--osft-rank-ratio", "0.5", "--save", "a", "--save-every", "2", "--resume", "b"}));
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->save_dir, "a");
  EXPECT_EQ(c->resume_dir, "b");
}

}  // namespace
}  // namespace memplan
