// Command-line configuration of memplan-planner: the flags, their defaults and --help text.
// Only main() reads argv; everything else receives a DaemonOptions. Thread-compatible value type.
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/log.h"

namespace memplan {

// Whether a TLS client must present a certificate signed by --tls-client-ca.
enum class ClientCertMode {
  kRequire,   // every connection (mutual TLS)
  kOptional,  // verified when presented; read RPCs work without one
};

// How the database file is checked (PRAGMA quick_check / integrity_check; planner/store).
enum class DbCheck { kOff, kQuick, kFull };

struct DaemonOptions {
  std::string listen_address = "127.0.0.1:50051";  // port 0: any free port (printed)
  std::string metrics_address = "127.0.0.1:9464";  // empty: no /metrics endpoint
  std::string metrics_token_file;  // non-empty: /metrics needs "Bearer <first line>"
  std::string db_path = "./memplan-planner.db";
  DbCheck db_check = DbCheck::kQuick;  // at start (a failure refuses to start) and on a schedule
  double db_check_interval_hours = 24;  // 0: at start only
  int db_max_plans = 100000;            // plans kept (those with measurements always); 0: no cap
  int db_max_plan_age_days = 30;        // 0: no limit
  LogLevel log_level = LogLevel::kInfo;
  int search_threads = 0;  // 0: one per CPU (at most 16)
  int max_queued_searches = 256;
  int max_rpc_threads = 16;    // threads that run RPC handlers (planner/service)
  int max_queued_rpcs = 1024;  // calls waiting for a handler thread before RESOURCE_EXHAUSTED
  int max_streams_per_connection = 64;  // HTTP/2 concurrent streams; more wait in the client
  double shutdown_grace_seconds = 10;  // how long SIGTERM waits for in-flight RPCs
  // Transport security. TLS when tls_cert_file is set; client certificates are checked against
  // tls_client_ca_file when set. Plaintext off loopback needs `insecure`.
  std::string tls_cert_file;
  std::string tls_key_file;
  std::string tls_client_ca_file;
  ClientCertMode client_cert_mode = ClientCertMode::kRequire;
  bool insecure = false;
  // Write authorization: bearer tokens ("NAME ROLE TOKEN" lines). With it, or with
  // tls_client_ca_file, the write RPCs need a token or a verified client certificate.
  std::string auth_token_file;
  // Kubernetes validating admission webhook over HTTPS (POST /validate); empty: off. Uses
  // tls_cert_file / tls_key_file.
  std::string webhook_address;
  int metrics_plan_series = 256;  // plans that keep their per-plan_id metric series
  // Measurement sanity checks (planner/service/measurement_checks.h).
  double quarantine_step_ratio = 3;  // step time outside [predicted / R, predicted x R]
  int quarantine_burst = 20;         // reports per client per minute beyond which; 0: off
  bool help = false;
};

// Whether a gRPC listen address stays on this host: 127.0.0.0/8, ::1, localhost, unix sockets.
bool IsLoopbackAddress(const std::string& address);

// Accepts "--flag=value" and "--flag value". INVALID_ARGUMENT naming the flag for an unknown
// flag, a missing value, a value out of range, and for plaintext on a non-loopback --listen
// without --insecure.
absl::StatusOr<DaemonOptions> ParseDaemonOptions(const std::vector<std::string>& args);

// Usage text for --help.
std::string DaemonUsage();

}  // namespace memplan
