// torchrun's environment as DistOptions.
#include "agent/dist/dist_options.h"

#include <map>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace memplan {
namespace {

using ::testing::HasSubstr;

EnvLookup Env(std::map<std::string, std::string> vars) {
  return [vars](const std::string& name) -> std::optional<std::string> {
    auto it = vars.find(name);
    if (it == vars.end()) return std::nullopt;
    return it->second;
  };
}

TEST(DistOptionsTest, NoVariablesIsOneRank) {
  absl::StatusOr<DistOptions> o = DistOptionsFromEnvironment(Env({}));
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->world_size, 1);
  EXPECT_EQ(o->rank, 0);
  EXPECT_EQ(o->local_rank, 0);
  EXPECT_EQ(o->local_world_size, 1);
  EXPECT_TRUE(o->high_priority_streams);
}

TEST(DistOptionsTest, NcclStreamPriorityFromTheEnvironment) {
  absl::StatusOr<DistOptions> o =
      DistOptionsFromEnvironment(Env({{"MEMPLAN_NCCL_HIGH_PRIORITY", "0"}}));
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_FALSE(o->high_priority_streams);
  o = DistOptionsFromEnvironment(Env({{"MEMPLAN_NCCL_HIGH_PRIORITY", "1"}}));
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_TRUE(o->high_priority_streams);
}

TEST(DistOptionsTest, GatherCoalescingFromTheEnvironment) {
  absl::StatusOr<DistOptions> o = DistOptionsFromEnvironment(Env({}));
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_TRUE(o->coalesce_gathers);
  o = DistOptionsFromEnvironment(Env({{"MEMPLAN_COALESCE_GATHERS", "0"}}));
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_FALSE(o->coalesce_gathers);
}

TEST(DistOptionsTest, ReadsTorchrunVariables) {
  absl::StatusOr<DistOptions> o =
      DistOptionsFromEnvironment(Env({{"WORLD_SIZE", "8"},
                                      {"RANK", "5"},
                                      {"LOCAL_RANK", "1"},
                                      {"LOCAL_WORLD_SIZE", "4"},
                                      {"MASTER_ADDR", " node0 "},
                                      {"MASTER_PORT", "29400"},
                                      {"TORCHELASTIC_USE_AGENT_STORE", "True"}}));
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->world_size, 8);
  EXPECT_EQ(o->rank, 5);
  EXPECT_EQ(o->local_rank, 1);
  EXPECT_EQ(o->local_world_size, 4);
  EXPECT_EQ(o->master_addr, "node0");
  EXPECT_EQ(o->master_port, 29400);
  EXPECT_TRUE(o->store_already_served);
  EXPECT_TRUE(ValidateDistOptions(*o).ok());
}

TEST(DistOptionsTest, LocalRankDefaultsFromRankAndLocalWorldSize) {
  absl::StatusOr<DistOptions> o = DistOptionsFromEnvironment(
      Env({{"WORLD_SIZE", "4"}, {"RANK", "3"}, {"LOCAL_WORLD_SIZE", "2"}}));
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->local_rank, 1);
}

TEST(DistOptionsTest, BadValuesNameTheVariable) {
  struct Case {
    std::map<std::string, std::string> env;
    std::string message;
  };
  const Case cases[] = {
      {{{"WORLD_SIZE", "2"}}, "RANK (environment) is required with world size 2"},
      {{{"WORLD_SIZE", "2"}, {"RANK", "2"}},
       "RANK (environment): 2 is outside [0, 1] (world size 2)"},
      {{{"WORLD_SIZE", "0"}}, "WORLD_SIZE (environment): 0 is outside [1, 256]"},
      {{{"MASTER_PORT", "70000"}}, "MASTER_PORT (environment): 70000 is outside [1, 65535]"},
      {{{"WORLD_SIZE", "2"}, {"RANK", "0"}, {"LOCAL_WORLD_SIZE", "2"}, {"LOCAL_RANK", "2"}},
       "LOCAL_RANK (environment): 2 is outside [0, 1] (local world size 2)"},
      {{{"MASTER_ADDR", " "}}, "MASTER_ADDR (environment): \" \" is not a host name or address"},
      {{{"MEMPLAN_NCCL_HIGH_PRIORITY", "yes"}},
       "MEMPLAN_NCCL_HIGH_PRIORITY (environment): \"yes\" is not an integer in [0, 1]"},
      {{{"MEMPLAN_COALESCE_GATHERS", "2"}},
       "MEMPLAN_COALESCE_GATHERS (environment): 2 is outside [0, 1]"},
  };
  for (const Case& c : cases) {
    absl::StatusOr<DistOptions> o = DistOptionsFromEnvironment(Env(c.env));
    ASSERT_FALSE(o.ok()) << c.message;
    EXPECT_EQ(o.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(o.status().message()), HasSubstr(c.message));
  }
}

TEST(DistOptionsTest, ValidateNamesTheField) {
  DistOptions o;
  o.world_size = 2;
  o.rank = 2;
  EXPECT_THAT(std::string(ValidateDistOptions(o).message()),
              HasSubstr("rank = 2 is out of range [0, 1]"));
  o.rank = 0;
  o.heartbeat_milliseconds = 1;
  EXPECT_THAT(std::string(ValidateDistOptions(o).message()), HasSubstr("heartbeat_milliseconds"));
  EXPECT_EQ(DistBackendName(DistBackend::kGloo), "gloo");
  EXPECT_EQ(DistBackendName(DistBackend::kNccl), "nccl");
}

}  // namespace
}  // namespace memplan
