// `memplan-agent bench`'s multi-process flags and torchrun's environment.
#include "agent/bench/collective_flags.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <map>
#include <string>
#include <vector>

namespace memplan {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

EnvLookup Env(std::map<std::string, std::string> vars) {
  return [vars = std::move(vars)](const std::string& name) -> std::optional<std::string> {
    auto it = vars.find(name);
    if (it == vars.end()) return std::nullopt;
    return it->second;
  };
}

absl::StatusOr<CollectiveFlags> Take(std::vector<std::string> args,
                                     std::map<std::string, std::string> env = {}) {
  return TakeCollectiveFlags(&args, Env(std::move(env)));
}

std::string Error(std::vector<std::string> args, std::map<std::string, std::string> env = {}) {
  absl::StatusOr<CollectiveFlags> f = Take(std::move(args), std::move(env));
  EXPECT_FALSE(f.ok());
  if (f.ok()) return "";
  EXPECT_EQ(f.status().code(), absl::StatusCode::kInvalidArgument);
  return std::string(f.status().message());
}

TEST(CollectiveFlagsTest, NoFlagsNoEnvironmentIsWorldSizeOne) {
  std::vector<std::string> args = {"--out", "hw.json", "--device", "1"};
  absl::StatusOr<CollectiveFlags> f = TakeCollectiveFlags(&args, Env({}));
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ(f->options.world_size, 1);
  EXPECT_EQ(f->options.rank, 0);
  EXPECT_EQ(f->options.master_addr, "127.0.0.1");
  EXPECT_EQ(f->options.master_port, 29500);
  EXPECT_EQ(f->options.backend, CollectiveBackend::kAuto);
  EXPECT_EQ(f->options.message_bytes, 0);
  EXPECT_FALSE(f->local_rank.has_value());
  EXPECT_THAT(args, ElementsAre("--out", "hw.json", "--device", "1")) << "other flags stay";
}

TEST(CollectiveFlagsTest, FlagsAreTakenOutAndParsed) {
  std::vector<std::string> args = {"--name",
                                   "x",
                                   "--world-size=2",
                                   "--rank",
                                   "1",
                                   "--master-addr",
                                   "127.0.0.2",
                                   "--master-port",
                                   "31000",
                                   "--collective-backend",
                                   "gloo",
                                   "--collective-bytes",
                                   "64M",
                                   "--collective-repetitions=3",
                                   "--collective-timeout",
                                   "30"};
  absl::StatusOr<CollectiveFlags> f = TakeCollectiveFlags(&args, Env({}));
  ASSERT_TRUE(f.ok()) << f.status();
  const CollectiveBenchOptions& o = f->options;
  EXPECT_EQ(o.world_size, 2);
  EXPECT_EQ(o.rank, 1);
  EXPECT_EQ(o.master_addr, "127.0.0.2");
  EXPECT_EQ(o.master_port, 31000);
  EXPECT_EQ(o.backend, CollectiveBackend::kGloo);
  EXPECT_EQ(o.message_bytes, int64_t{64} << 20);
  EXPECT_EQ(o.repetitions, 3);
  EXPECT_EQ(o.timeout_seconds, 30);
  EXPECT_THAT(args, ElementsAre("--name", "x"));
  EXPECT_TRUE(ValidateCollectiveBenchOptions(o).ok());
}

TEST(CollectiveFlagsTest, TorchrunEnvironmentFillsWhatFlagsLeaveOut) {
  absl::StatusOr<CollectiveFlags> f =
      Take({"--master-port", "31001"}, {{"WORLD_SIZE", "4"},
                                        {"RANK", "3"},
                                        {"LOCAL_RANK", "1"},
                                        {"MASTER_ADDR", "localhost"},
                                        {"MASTER_PORT", "29999"}});
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ(f->options.world_size, 4);
  EXPECT_EQ(f->options.rank, 3);
  EXPECT_EQ(f->options.master_addr, "localhost");
  EXPECT_EQ(f->options.master_port, 31001) << "the flag wins over MASTER_PORT";
  ASSERT_TRUE(f->local_rank.has_value());
  EXPECT_EQ(*f->local_rank, 1);
  EXPECT_FALSE(f->options.store_already_served);
}

TEST(CollectiveFlagsTest, UnderTorchrunsAgentStoreRankZeroIsAClientToo) {
  absl::StatusOr<CollectiveFlags> f =
      Take({}, {{"WORLD_SIZE", "2"}, {"RANK", "0"}, {"TORCHELASTIC_USE_AGENT_STORE", "True"}});
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_TRUE(f->options.store_already_served);
  f = Take({}, {{"WORLD_SIZE", "2"}, {"RANK", "0"}, {"TORCHELASTIC_USE_AGENT_STORE", "False"}});
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_FALSE(f->options.store_already_served);
}

TEST(CollectiveFlagsTest, ByteCountsTakeBinarySuffixes) {
  EXPECT_EQ(Take({"--collective-bytes", "4096"})->options.message_bytes, 4096);
  EXPECT_EQ(Take({"--collective-bytes", "8K"})->options.message_bytes, 8192);
  EXPECT_EQ(Take({"--collective-bytes", "1GiB"})->options.message_bytes, int64_t{1} << 30);
}

TEST(CollectiveFlagsTest, RankMustBeBelowTheWorldSize) {
  EXPECT_EQ(Error({"--world-size", "2", "--rank", "2"}),
            "--rank: 2 is outside [0, 1] (world size 2)");
  EXPECT_EQ(Error({"--rank", "-1", "--world-size", "2"}),
            "--rank: -1 is outside [0, 1] (world size 2)");
  EXPECT_EQ(Error({}, {{"WORLD_SIZE", "2"}, {"RANK", "5"}}),
            "RANK (environment): 5 is outside [0, 1] (world size 2)");
  EXPECT_EQ(Error({"--rank", "1"}), "--rank: 1 is outside [0, 0] (world size 1)");
}

TEST(CollectiveFlagsTest, RankIsRequiredAboveWorldSizeOne) {
  EXPECT_THAT(Error({"--world-size", "2"}),
              HasSubstr("--rank (or RANK) is required with world size 2"));
}

TEST(CollectiveFlagsTest, WorldSizeRange) {
  EXPECT_EQ(Error({"--world-size", "0", "--rank", "0"}), "--world-size: 0 is outside [1, 256]");
  EXPECT_EQ(Error({"--world-size", "two"}), "--world-size: \"two\" is not an integer in [1, 256]");
  EXPECT_EQ(Error({}, {{"WORLD_SIZE", "1000"}}),
            "WORLD_SIZE (environment): 1000 is outside [1, 256]");
}

TEST(CollectiveFlagsTest, PortRange) {
  const std::vector<std::string> two = {"--world-size", "2", "--rank", "0"};
  auto with = [&](std::vector<std::string> extra) {
    std::vector<std::string> args = two;
    args.insert(args.end(), extra.begin(), extra.end());
    return args;
  };
  EXPECT_EQ(Error(with({"--master-port", "0"})), "--master-port: 0 is outside [1, 65535]");
  EXPECT_EQ(Error(with({"--master-port", "65536"})), "--master-port: 65536 is outside [1, 65535]");
  EXPECT_EQ(Error(with({"--master-port", "http"})),
            "--master-port: \"http\" is not an integer in [1, 65535]");
  EXPECT_EQ(Error(two, {{"MASTER_PORT", "99999"}}),
            "MASTER_PORT (environment): 99999 is outside [1, 65535]");
}

TEST(CollectiveFlagsTest, OtherValuesNameTheFlagAndWhatItTakes) {
  EXPECT_EQ(Error({"--collective-backend", "mpi"}),
            "--collective-backend: \"mpi\" is not one of nccl, gloo");
  EXPECT_THAT(Error({"--world-size", "4", "--rank", "0", "--collective-bytes", "8"}),
              HasSubstr("--collective-bytes: 8 is outside [16, 68719476736] (4 bytes per rank at "
                        "least; world size 4)"));
  EXPECT_THAT(Error({"--collective-bytes", "lots"}),
              HasSubstr("--collective-bytes: \"lots\" is not a byte count in [4, 68719476736] "
                        "(suffixes K, M, G)"));
  EXPECT_EQ(Error({"--collective-repetitions", "0"}),
            "--collective-repetitions: 0 is outside [1, 1000]");
  EXPECT_EQ(Error({"--collective-timeout", "0"}),
            "--collective-timeout: 0 is outside [1, 86400] seconds");
  EXPECT_EQ(Error({"--master-addr", ""}), "--master-addr: \"\" is not a host name or address");
  EXPECT_EQ(Error({}, {{"LOCAL_RANK", "x"}}),
            "LOCAL_RANK (environment): \"x\" is not an integer in [0, 0] (local world size 1)");
  EXPECT_EQ(Error({"--world-size"}), "--world-size: needs a value");
}

TEST(CollectiveFlagsTest, UsageNamesEveryFlag) {
  const std::string usage = CollectiveFlagsUsage();
  for (const char* flag :
       {"--world-size", "--rank", "--master-addr", "--master-port", "--collective-backend",
        "--collective-bytes", "--collective-repetitions", "--collective-timeout", "RANK",
        "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "LOCAL_RANK"}) {
    EXPECT_THAT(usage, HasSubstr(flag));
  }
}

}  // namespace
}  // namespace memplan
