#include "planner/daemon/daemon_options.h"

#include <arpa/inet.h>
#include <netinet/in.h>

#include <cstring>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/flags.h"

namespace memplan {

bool IsLoopbackAddress(const std::string& address) {
  if (absl::StartsWith(address, "unix:") || absl::StartsWith(address, "unix-abstract:")) {
    return true;
  }
  std::string host = address;
  if (const size_t colon = address.rfind(':'); colon != std::string::npos) {
    host = address.substr(0, colon);
  }
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
  }
  if (host == "localhost") return true;
  in_addr v4{};
  if (inet_pton(AF_INET, host.c_str(), &v4) == 1) {
    return (ntohl(v4.s_addr) >> 24) == 127;
  }
  in6_addr v6{};
  if (inet_pton(AF_INET6, host.c_str(), &v6) == 1) {
    return std::memcmp(&v6, &in6addr_loopback, sizeof(v6)) == 0;
  }
  return false;
}

std::string DaemonUsage() {
  return R"(memplan-planner: the memplan planning service (gRPC memplan.v1.Planner).

Usage: memplan-planner [flags]

  --listen=HOST:PORT         gRPC address (default 127.0.0.1:50051; port 0 picks a free port,
                             printed as "listening on HOST:PORT")
  --metrics=HOST:PORT        Prometheus /metrics address (default 127.0.0.1:9464; "" disables;
                             port 0 picks a free port, printed as "metrics on HOST:PORT")
  --metrics-plan-series=N    newest plans that keep memplan_plan_*_peak_bytes{plan_id} series
                             (default 256; older series are dropped; [1, 100000])
  --metrics-token-file=PATH  a scrape of /metrics must send "Authorization: Bearer TOKEN", TOKEN
                             being this file's first line (default: no auth). /metrics names plan
                             ids and hardware: set it, or keep --metrics on loopback
  --db=PATH                  SQLite database, created when missing (default ./memplan-planner.db;
                             an existing empty file is refused)
  --db-check=MODE            quick (default; PRAGMA quick_check) | full (integrity_check) | off:
                             a corrupt database refuses the start, naming the file
  --db-check-interval-hours=H
                             check again every H hours while serving (default 24; 0 = at start
                             only; [0, 8760]); a failure is logged and health turns NOT_SERVING
  --db-max-plans=N           stored plans kept, newest first (default 100000; 0 = no cap;
                             [0, 1000000000]); plans with measurements are always kept
  --db-max-plan-age-days=D   plans older than D days are deleted (default 30; 0 = never;
                             [0, 36500]); measured plans are kept
  --log-level=LEVEL          debug | info | warning | error (default info; debug logs every RPC)
  --search-threads=N         plan-search threads (default 0 = one per CPU, at most 16)
  --max-queued-searches=N    searches waiting for a thread before RESOURCE_EXHAUSTED (default 256)
  --max-rpc-threads=N        threads that run RPC handlers; Plan waits there for a search thread
                             (default 16)
  --max-queued-rpcs=N        calls waiting for a handler thread before RESOURCE_EXHAUSTED
                             (default 1024; refusals: memplan_planner_rpc_refused_total)
  --max-streams-per-connection=N
                             concurrent calls per client connection; more wait in the client's
                             HTTP/2 queue (default 64)
  --shutdown-grace-seconds=S on SIGTERM/SIGINT, how long in-flight RPCs may finish (default 10)

Transport security (gRPC's own TLS):
  --tls-cert=FILE            PEM server certificate (chain); turns TLS on. Needs --tls-key
  --tls-key=FILE             PEM private key of --tls-cert
  --tls-client-ca=FILE       PEM CA for client certificates (mutual TLS); a verified client
                             certificate may call the write RPCs
  --tls-client-auth=MODE     with --tls-client-ca: require (default; every connection needs a
                             client certificate) | optional (verified when presented; read RPCs
                             work without one)
  --auth-token-file=FILE     bearer tokens for the write RPCs (SubmitTrace, SubmitHardwareProfile,
                             ReportMeasurement): one "NAME ROLE TOKEN" per line, ROLE write (all
                             three) or report (ReportMeasurement only), '#' comments. With it or
                             --tls-client-ca, a write needs a token or a verified client
                             certificate (role write); reads stay open. Refusals are counted in
                             memplan_rpc_rejected_total
  --quarantine-step-ratio=R  a reported step time outside [predicted / R, predicted x R] is
                             stored quarantined, not applied to calibration (default 3; [1.1, 1000])
  --quarantine-burst=N       reports beyond N per minute from one client (token or certificate and
                             host) are quarantined (default 20; 0 = no limit). Measurements with a
                             peak above the plan's card are always quarantined
  --webhook=HOST:PORT        serve a Kubernetes validating admission webhook (AdmissionReview JSON,
                             POST /validate) over HTTPS with --tls-cert/--tls-key: pods annotated
                             memplan.dev/model and memplan.dev/gpu are denied when the job does
                             not fit that GPU (port 0 picks a free port, printed as "webhook on
                             HOST:PORT"; default off). Each connection has 10 s from accept for
                             its request; headers above 16 KiB get 431, bodies above 1 MiB 413
  --insecure                 allow plaintext gRPC on a non-loopback --listen address (refused
                             otherwise: anyone on the network could call it)
  --version                  the version, git commit and build type
  --help                     this text

Also served: grpc.health.v1.Health and server reflection (grpc.reflection.v1alpha).
)";
}

absl::StatusOr<DaemonOptions> ParseDaemonOptions(const std::vector<std::string>& args) {
  DaemonOptions options;
  FlagSet flags("see --help");
  flags.Switch("--help", &options.help)
      .Alias("-h", "--help")
      .Switch("--insecure", &options.insecure)
      .NonEmptyString("--listen", &options.listen_address)
      .String("--webhook", &options.webhook_address)
      .String("--metrics", &options.metrics_address)
      .NonEmptyString("--metrics-token-file", &options.metrics_token_file)
      .Int("--metrics-plan-series", &options.metrics_plan_series, 1, 100000)
      .NonEmptyString("--db", &options.db_path)
      .Choice("--db-check", &options.db_check,
              FlagSet::Choices<DbCheck>{
                  {"quick", DbCheck::kQuick}, {"full", DbCheck::kFull}, {"off", DbCheck::kOff}})
      .Double("--db-check-interval-hours", &options.db_check_interval_hours, 0, 8760)
      .Int("--db-max-plans", &options.db_max_plans, 0, 1000000000)
      .Int("--db-max-plan-age-days", &options.db_max_plan_age_days, 0, 36500)
      .Choice("--log-level", &options.log_level,
              FlagSet::Choices<LogLevel>{{"debug", LogLevel::kDebug},
                                         {"info", LogLevel::kInfo},
                                         {"warning", LogLevel::kWarning},
                                         {"error", LogLevel::kError}})
      .Int("--search-threads", &options.search_threads, 0, 1024)
      .Int("--max-queued-searches", &options.max_queued_searches, 0, 1 << 20)
      .Int("--max-rpc-threads", &options.max_rpc_threads, 1, 1024)
      .Int("--max-queued-rpcs", &options.max_queued_rpcs, 0, 1 << 20)
      .Int("--max-streams-per-connection", &options.max_streams_per_connection, 1, 1 << 16)
      .Double("--shutdown-grace-seconds", &options.shutdown_grace_seconds, 0, 3600)
      .NonEmptyString("--tls-cert", &options.tls_cert_file)
      .NonEmptyString("--tls-key", &options.tls_key_file)
      .NonEmptyString("--tls-client-ca", &options.tls_client_ca_file)
      .NonEmptyString("--auth-token-file", &options.auth_token_file)
      .Choice("--tls-client-auth", &options.client_cert_mode,
              FlagSet::Choices<ClientCertMode>{{"require", ClientCertMode::kRequire},
                                               {"optional", ClientCertMode::kOptional}})
      .Double("--quarantine-step-ratio", &options.quarantine_step_ratio, 1.1, 1000)
      .Int("--quarantine-burst", &options.quarantine_burst, 0, 1000000);
  if (absl::Status s = flags.Parse(args); !s.ok()) return s;
  const bool client_auth_given = flags.Given("--tls-client-auth");
  if (options.help) return options;
  if (options.tls_cert_file.empty() != options.tls_key_file.empty()) {
    return absl::InvalidArgumentError(
        "--tls-cert and --tls-key go together (the server certificate and its private key)");
  }
  if (client_auth_given && options.tls_client_ca_file.empty()) {
    return absl::InvalidArgumentError(
        "--tls-client-auth needs --tls-client-ca (the CA client certificates are checked against)");
  }
  if (!options.tls_client_ca_file.empty() && options.tls_cert_file.empty()) {
    return absl::InvalidArgumentError(
        "--tls-client-ca needs --tls-cert and --tls-key: client certificates are checked only "
        "over TLS");
  }
  if (!options.webhook_address.empty() && options.tls_cert_file.empty()) {
    return absl::InvalidArgumentError(
        "--webhook needs --tls-cert and --tls-key: Kubernetes calls admission webhooks over HTTPS");
  }
  if (options.insecure && !options.tls_cert_file.empty()) {
    return absl::InvalidArgumentError("--insecure contradicts --tls-cert: give one of them");
  }
  if (options.tls_cert_file.empty() && !options.insecure &&
      !IsLoopbackAddress(options.listen_address)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--listen=", options.listen_address,
        " is not a loopback address and TLS is off: every host that reaches the port could store "
        "traces and report measurements. Give --tls-cert and --tls-key (and --tls-client-ca for "
        "mutual TLS), or --insecure to serve plaintext anyway"));
  }
  return options;
}

}  // namespace memplan
