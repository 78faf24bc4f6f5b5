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
  EXPECT_EQ(options->max_rpc_threads, 16);
  EXPECT_EQ(options->max_queued_rpcs, 1024);
  EXPECT_EQ(options->max_streams_per_connection, 64);
  EXPECT_FALSE(options->help);
}

TEST(DaemonOptionsTest, AcceptsBothFlagSpellings) {
  auto options = ParseDaemonOptions({"--listen=0.0.0.0:7000", "--insecure", "--db", "/tmp/x.db",
                                     "--metrics=", "--log-level", "debug", "--search-threads=3",
                                     "--shutdown-grace-seconds=2.5"});
  ASSERT_TRUE(options.ok()) << options.status();
  EXPECT_EQ(options->listen_address, "0.0.0.0:7000");
  EXPECT_EQ(options->db_path, "/tmp/x.db");
  EXPECT_EQ(options->metrics_address, "");
  EXPECT_EQ(options->log_level, LogLevel::kDebug);
  EXPECT_EQ(options->search_threads, 3);
  EXPECT_EQ(options->shutdown_grace_seconds, 2.5);
  EXPECT_TRUE(options->insecure);
  EXPECT_TRUE(ParseDaemonOptions({"--help"})->help);
}

TEST(DaemonOptionsTest, LoopbackAddresses) {
  for (const char* address : {"127.0.0.1:50051", "127.3.4.5:1", "localhost:50051", "[::1]:50051",
                              "unix:/run/memplan.sock", "unix-abstract:memplan"}) {
    EXPECT_TRUE(IsLoopbackAddress(address)) << address;
  }
  for (const char* address : {"0.0.0.0:50051", "[::]:50051", "10.0.0.7:50051", "planner:50051",
                              "[2001:db8::1]:50051", "128.0.0.1:1", ":50051"}) {
    EXPECT_FALSE(IsLoopbackAddress(address)) << address;
  }
}

TEST(DaemonOptionsTest, PlaintextOffLoopbackNeedsTlsOrInsecure) {
  absl::StatusOr<DaemonOptions> refused = ParseDaemonOptions({"--listen=0.0.0.0:50051"});
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(refused.status().message(), HasSubstr("--listen=0.0.0.0:50051 is not a loopback"));
  EXPECT_THAT(refused.status().message(), HasSubstr("--insecure"));
  EXPECT_FALSE(ParseDaemonOptions({"--listen=[::]:50051"}).ok());
  EXPECT_TRUE(ParseDaemonOptions({"--listen=0.0.0.0:50051", "--insecure"}).ok());
  auto tls = ParseDaemonOptions({"--listen=0.0.0.0:50051", "--tls-cert=s.crt", "--tls-key=s.key",
                                 "--tls-client-ca=ca.crt", "--tls-client-auth=optional"});
  ASSERT_TRUE(tls.ok()) << tls.status();
  EXPECT_EQ(tls->tls_cert_file, "s.crt");
  EXPECT_EQ(tls->tls_key_file, "s.key");
  EXPECT_EQ(tls->tls_client_ca_file, "ca.crt");
  EXPECT_EQ(tls->client_cert_mode, ClientCertMode::kOptional);
  EXPECT_EQ(ParseDaemonOptions({"--tls-cert=s.crt", "--tls-key=s.key"})->client_cert_mode,
            ClientCertMode::kRequire);
}

TEST(DaemonOptionsTest, MetricsPlanSeries) {
  EXPECT_EQ(ParseDaemonOptions({})->metrics_plan_series, 256);
  EXPECT_EQ(ParseDaemonOptions({"--metrics-plan-series=10"})->metrics_plan_series, 10);
  EXPECT_THAT(ParseDaemonOptions({"--metrics-plan-series=0"}).status().message(),
              HasSubstr("--metrics-plan-series: 0 is outside [1, 100000]"));
}

TEST(DaemonOptionsTest, QuarantineFlags) {
  const DaemonOptions defaults = *ParseDaemonOptions({});
  EXPECT_EQ(defaults.quarantine_step_ratio, 3);
  EXPECT_EQ(defaults.quarantine_burst, 20);
  auto set = ParseDaemonOptions({"--quarantine-step-ratio=5.5", "--quarantine-burst=0"});
  ASSERT_TRUE(set.ok()) << set.status();
  EXPECT_EQ(set->quarantine_step_ratio, 5.5);
  EXPECT_EQ(set->quarantine_burst, 0);
  EXPECT_THAT(ParseDaemonOptions({"--quarantine-step-ratio=1"}).status().message(),
              HasSubstr("--quarantine-step-ratio: 1 is outside [1.1, 1000]"));
  EXPECT_THAT(ParseDaemonOptions({"--quarantine-burst=-1"}).status().message(),
              HasSubstr("--quarantine-burst"));
}

TEST(DaemonOptionsTest, TlsFlagRules) {
  EXPECT_THAT(ParseDaemonOptions({"--tls-cert=s.crt"}).status().message(),
              HasSubstr("--tls-cert and --tls-key go together"));
  EXPECT_THAT(ParseDaemonOptions({"--tls-key=s.key"}).status().message(),
              HasSubstr("--tls-cert and --tls-key go together"));
  EXPECT_THAT(ParseDaemonOptions({"--tls-client-ca=ca.crt"}).status().message(),
              HasSubstr("--tls-client-ca needs --tls-cert"));
  EXPECT_THAT(
      ParseDaemonOptions({"--tls-cert=s.crt", "--tls-key=s.key", "--insecure"}).status().message(),
      HasSubstr("--insecure contradicts --tls-cert"));
  EXPECT_THAT(ParseDaemonOptions({"--tls-client-auth=maybe"}).status().message(),
              HasSubstr("--tls-client-auth: \"maybe\" is not one of require, optional"));
  EXPECT_THAT(
      ParseDaemonOptions({"--tls-cert=s.crt", "--tls-key=s.key", "--tls-client-auth=optional"})
          .status()
          .message(),
      HasSubstr("--tls-client-auth needs --tls-client-ca"));
  EXPECT_THAT(ParseDaemonOptions({"--tls-cert="}).status().message(),
              HasSubstr("--tls-cert: must not be empty"));
}

TEST(DaemonOptionsTest, ErrorsNameTheFlag) {
  EXPECT_THAT(ParseDaemonOptions({"--bogus=1"}).status().message(),
              HasSubstr("unknown flag --bogus"));
  EXPECT_THAT(ParseDaemonOptions({"--db"}).status().message(), HasSubstr("--db: needs a value"));
  EXPECT_THAT(ParseDaemonOptions({"--log-level=loud"}).status().message(),
              HasSubstr("debug, info, warning, error"));
  EXPECT_THAT(ParseDaemonOptions({"--search-threads=-1"}).status().message(),
              HasSubstr("--search-threads"));
  EXPECT_THAT(ParseDaemonOptions({"--max-queued-rpcs=-1"}).status().message(),
              HasSubstr("--max-queued-rpcs"));
  EXPECT_THAT(ParseDaemonOptions({"--max-streams-per-connection=0"}).status().message(),
              HasSubstr("--max-streams-per-connection"));
  EXPECT_THAT(ParseDaemonOptions({"--shutdown-grace-seconds=nan"}).status().message(),
              HasSubstr("[0, 3600]"));
  EXPECT_THAT(ParseDaemonOptions({"positional"}).status().message(),
              HasSubstr("unexpected argument"));
  EXPECT_FALSE(ParseDaemonOptions({"--listen="}).ok());
}

TEST(DaemonOptionsTest, DatabaseCheckAndRetentionFlags) {
  auto defaults = ParseDaemonOptions({});
  ASSERT_TRUE(defaults.ok());
  EXPECT_EQ(defaults->db_check, DbCheck::kQuick);
  EXPECT_EQ(defaults->db_check_interval_hours, 24);
  EXPECT_EQ(defaults->db_max_plans, 100000);
  EXPECT_EQ(defaults->db_max_plan_age_days, 30);
  auto options = ParseDaemonOptions({"--db-check=full", "--db-check-interval-hours=0.5",
                                     "--db-max-plans=0", "--db-max-plan-age-days", "7"});
  ASSERT_TRUE(options.ok()) << options.status();
  EXPECT_EQ(options->db_check, DbCheck::kFull);
  EXPECT_EQ(options->db_check_interval_hours, 0.5);
  EXPECT_EQ(options->db_max_plans, 0);
  EXPECT_EQ(options->db_max_plan_age_days, 7);
  EXPECT_EQ(ParseDaemonOptions({"--db-check=off"})->db_check, DbCheck::kOff);
  EXPECT_THAT(ParseDaemonOptions({"--db-check=" + std::string(1000, 'x')}).status().message(),
              ::testing::AllOf(HasSubstr("--db-check"), HasSubstr("quick, full, off"),
                               ::testing::Not(HasSubstr(std::string(100, 'x')))));
  EXPECT_THAT(ParseDaemonOptions({"--db-check-interval-hours=-1"}).status().message(),
              HasSubstr("[0, 8760]"));
  EXPECT_THAT(ParseDaemonOptions({"--db-max-plans=-5"}).status().message(),
              HasSubstr("--db-max-plans"));
  EXPECT_THAT(ParseDaemonOptions({"--db-max-plan-age-days=40000"}).status().message(),
              HasSubstr("[0, 36500]"));
}

TEST(DaemonOptionsTest, UsageMentionsEveryFlag) {
  const std::string usage = DaemonUsage();
  for (const char* flag : {"--listen",
                           "--metrics",
                           "--db",
                           "--log-level",
                           "--search-threads",
                           "--max-queued-searches",
                           "--max-rpc-threads",
                           "--max-queued-rpcs",
                           "--max-streams-per-connection",
                           "--shutdown-grace-seconds",
                           "--tls-cert",
                           "--tls-key",
                           "--tls-client-ca",
                           "--tls-client-auth",
                           "--auth-token-file",
                           "--quarantine-step-ratio",
                           "--quarantine-burst",
                           "--insecure",
                           "--help",
                           "--db-check",
                           "--db-check-interval-hours",
                           "--db-max-plans",
                           "--db-max-plan-age-days"}) {
    EXPECT_THAT(usage, HasSubstr(flag));
  }
}

}  // namespace
}  // namespace memplan
