#include "planner/daemon/daemon_options.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace memplan {
namespace {

using ::testing::HasSubstr;

TEST(DaemonOptionsTest, DefaultsMatchTheDocumentation) {
  auto options = ParseDaemonOptions({});
  ASSERT_TRUE(options.ok());
  EXPECT_EQ(options->listen_address, "127.0.0.1:50051");
  EXPECT_EQ(options->metrics_address, "127.0.0.1:9464");
  EXPECT_EQ(options->db_path, "./memplan-planner.db");
  EXPECT_EQ(options->log_level, LogLevel::kInfo);
  EXPECT_EQ(options->search_threads, 0);
  EXPECT_FALSE(options->help);
}

TEST(DaemonOptionsTest, AcceptsBothFlagSpellings) {
  auto options =
      ParseDaemonOptions({"--listen=0.0.0.0:7000", "--db", "/tmp/x.db", "--metrics=", "--log-level",
                          "debug", "--search-threads=3", "--shutdown-grace-seconds=2.5"});
  ASSERT_TRUE(options.ok()) << options.status();
  EXPECT_EQ(options->listen_address, "0.0.0.0:7000");
  EXPECT_EQ(options->db_path, "/tmp/x.db");
  EXPECT_EQ(options->metrics_address, "");
  EXPECT_EQ(options->log_level, LogLevel::kDebug);
  EXPECT_EQ(options->search_threads, 3);
  EXPECT_EQ(options->shutdown_grace_seconds, 2.5);
  EXPECT_TRUE(ParseDaemonOptions({"--help"})->help);
}

TEST(DaemonOptionsTest, ErrorsNameTheFlag) {
  EXPECT_THAT(ParseDaemonOptions({"--bogus=1"}).status().message(),
              HasSubstr("unknown flag --bogus"));
  EXPECT_THAT(ParseDaemonOptions({"--db"}).status().message(), HasSubstr("--db needs a value"));
  EXPECT_THAT(ParseDaemonOptions({"--log-level=loud"}).status().message(),
              HasSubstr("debug, info, warning, error"));
  EXPECT_THAT(ParseDaemonOptions({"--search-threads=-1"}).status().message(),
              HasSubstr("--search-threads"));
  EXPECT_THAT(ParseDaemonOptions({"--shutdown-grace-seconds=nan"}).status().message(),
              HasSubstr("[0, 3600]"));
  EXPECT_THAT(ParseDaemonOptions({"positional"}).status().message(),
              HasSubstr("unexpected argument"));
  EXPECT_FALSE(ParseDaemonOptions({"--listen="}).ok());
}

TEST(DaemonOptionsTest, UsageMentionsEveryFlag) {
  const std::string usage = DaemonUsage();
  for (const char* flag :
       {"--listen", "--metrics", "--db", "--log-level", "--search-threads", "--max-queued-searches",
        "--max-rpc-threads", "--shutdown-grace-seconds", "--help"}) {
    EXPECT_THAT(usage, HasSubstr(flag));
  }
}

}  // namespace
}  // namespace memplan
