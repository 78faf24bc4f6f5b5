#include "planner/daemon/planner_daemon.h"

#include <chrono>
#include <utility>

#include "absl/memory/memory.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "common/channel_security.h"
#include "common/log.h"
#include "common/metrics_server.h"
#include "common/status.h"
#include "grpcpp/ext/proto_server_reflection_plugin.h"
#include "grpcpp/grpcpp.h"
#include "grpcpp/health_check_service_interface.h"
#include "grpcpp/security/server_credentials.h"
#include "planner/metrics/planner_metrics.h"
#include "planner/service/planner_stack.h"
#include "planner/service/write_authorizer.h"
#include "planner/store/integrity_monitor.h"
#include "planner/store/store.h"
#include "planner/webhook/admission_webhook.h"
#include "planner/webhook/https_server.h"
#include "prometheus/registry.h"

namespace memplan {
namespace {

constexpr char kPlannerServiceName[] = "memplan.v1.Planner";

// "host:port" -> "host:<port>"; the host part is kept as the operator wrote it.
std::string WithPort(const std::string& address, int port) {
  const size_t colon = address.rfind(':');
  const std::string host = colon == std::string::npos ? address : address.substr(0, colon);
  return absl::StrCat(host, ":", port);
}

// Plaintext, TLS, or mutual TLS, from the --tls-* flags. Reads the PEM files (errors name the
// flag); gRPC itself rejects a malformed certificate or a key that does not match it when the
// port is bound.
absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> ServerCredentials(
    const DaemonOptions& options) {
  if (options.tls_cert_file.empty()) return grpc::InsecureServerCredentials();
  grpc::SslServerCredentialsOptions ssl;
  ssl.client_certificate_request = GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE;
  grpc::SslServerCredentialsOptions::PemKeyCertPair pair;
  ASSIGN_OR_RETURN(pair.cert_chain, ReadFlagFile("--tls-cert", options.tls_cert_file));
  ASSIGN_OR_RETURN(pair.private_key, ReadFlagFile("--tls-key", options.tls_key_file));
  ssl.pem_key_cert_pairs.push_back(std::move(pair));
  if (!options.tls_client_ca_file.empty()) {
    ASSIGN_OR_RETURN(ssl.pem_root_certs,
                     ReadFlagFile("--tls-client-ca", options.tls_client_ca_file));
    ssl.client_certificate_request =
        options.client_cert_mode == ClientCertMode::kRequire
            ? GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY
            : GRPC_SSL_REQUEST_CLIENT_CERTIFICATE_AND_VERIFY;
  }
  return grpc::SslServerCredentials(ssl);
}

std::string TransportName(const DaemonOptions& options) {
  if (options.tls_cert_file.empty()) return "plaintext";
  if (options.tls_client_ca_file.empty()) return "tls";
  return options.client_cert_mode == ClientCertMode::kRequire ? "mtls" : "tls+optional-client-cert";
}

IntegrityCheck ToIntegrityCheck(DbCheck check) {
  switch (check) {
    case DbCheck::kOff:
      return IntegrityCheck::kOff;
    case DbCheck::kFull:
      return IntegrityCheck::kFull;
    case DbCheck::kQuick:
      break;
  }
  return IntegrityCheck::kQuick;
}

}  // namespace

PlannerDaemon::PlannerDaemon() = default;

PlannerDaemon::~PlannerDaemon() { Shutdown(0); }

absl::StatusOr<std::unique_ptr<PlannerDaemon>> PlannerDaemon::Start(const DaemonOptions& options) {
  auto daemon = absl::WrapUnique(new PlannerDaemon());
  // Unreadable certificate or token files fail the start before the database is touched.
  ASSIGN_OR_RETURN(std::shared_ptr<grpc::ServerCredentials> credentials,
                   ServerCredentials(options));
  WriteAuthorizerOptions authorizer_options;
  authorizer_options.client_certificates_write = !options.tls_client_ca_file.empty();
  if (!options.auth_token_file.empty()) {
    ASSIGN_OR_RETURN(const std::string text,
                     ReadFlagFile("--auth-token-file", options.auth_token_file));
    ASSIGN_OR_RETURN(authorizer_options.tokens, ParseTokenFile(text, "--auth-token-file"));
  }
  daemon->authorizer_ = std::make_unique<WriteAuthorizer>(std::move(authorizer_options));

  SqliteStoreOptions store_options;
  store_options.path = options.db_path;
  store_options.integrity_check = ToIntegrityCheck(options.db_check);
  store_options.plan_retention.max_plans = options.db_max_plans;
  store_options.plan_retention.max_age_seconds = int64_t{options.db_max_plan_age_days} * 86400;
  auto store = OpenSqliteStore(store_options);
  if (!store.ok()) {
    return absl::Status(
        store.status().code(),
        absl::StrCat("opening the database \"", options.db_path, "\": ", store.status().message()));
  }
  daemon->store_ = *std::move(store);

  daemon->registry_ = std::make_shared<prometheus::Registry>();
  PlannerMetrics::Options metrics_options;
  metrics_options.max_plan_series = options.metrics_plan_series;
  daemon->metrics_ = std::make_unique<PlannerMetrics>(daemon->registry_, metrics_options);
  if (!options.metrics_address.empty()) {
    MetricsServerOptions metrics_server_options;
    metrics_server_options.address = options.metrics_address;
    if (!options.metrics_token_file.empty()) {
      ASSIGN_OR_RETURN(const std::string text,
                       ReadFlagFile("--metrics-token-file", options.metrics_token_file));
      metrics_server_options.bearer_token =
          std::string(absl::StripAsciiWhitespace(text.substr(0, text.find('\n'))));
      if (metrics_server_options.bearer_token.empty()) {
        return absl::InvalidArgumentError(absl::StrCat(
            "--metrics-token-file = \"", options.metrics_token_file, "\": first line is empty"));
      }
    }
    if (!IsLoopbackAddress(options.metrics_address)) {
      MEMPLAN_LOG(kWarning, "/metrics listens beyond loopback; it names plan ids and hardware")
          .Field("metrics", options.metrics_address)
          .Field("auth", metrics_server_options.bearer_token.empty() ? "none" : "bearer token")
          .Field("fix", "--metrics=127.0.0.1:PORT or --metrics-token-file");
    }
    auto server = MetricsServer::Start(metrics_server_options, daemon->registry_);
    if (!server.ok()) {
      return absl::Status(server.status().code(),
                          absl::StrCat("starting the metrics endpoint on ", options.metrics_address,
                                       ": ", server.status().message()));
    }
    daemon->metrics_server_ = *std::move(server);
    daemon->metrics_address_ = WithPort(options.metrics_address, daemon->metrics_server_->port());
  }

  PlannerStackOptions stack_options;
  stack_options.search_threads = options.search_threads;
  stack_options.max_queued_searches = options.max_queued_searches;
  stack_options.core.measurement_checks.max_step_time_ratio = options.quarantine_step_ratio;
  stack_options.core.measurement_checks.burst_max_reports = options.quarantine_burst;
  stack_options.service.handler_threads = options.max_rpc_threads;
  stack_options.service.max_queued_calls = options.max_queued_rpcs;
  ASSIGN_OR_RETURN(daemon->stack_,
                   PlannerStack::Create(*daemon->store_, daemon->metrics_.get(),
                                        daemon->authorizer_.get(), stack_options));
  if (!options.webhook_address.empty()) {
    daemon->webhook_ = std::make_unique<AdmissionWebhook>(daemon->stack_->core());
    HttpsServerOptions https;
    https.address = options.webhook_address;
    https.cert_pem_file = options.tls_cert_file;
    https.key_pem_file = options.tls_key_file;
    AdmissionWebhook* webhook = daemon->webhook_.get();
    ASSIGN_OR_RETURN(
        daemon->webhook_server_,
        HttpsServer::Start(https, [webhook](const std::string& method, const std::string& path,
                                            const std::string& body) {
          return webhook->Handle(method, path, body);
        }));
    daemon->webhook_address_ = WithPort(options.webhook_address, daemon->webhook_server_->port());
    if (!IsLoopbackAddress(options.webhook_address)) {
      MEMPLAN_LOG(kWarning, "the admission webhook listens beyond loopback; anyone who reaches it "
                            "can make the planner search and store plans")
          .Field("webhook", options.webhook_address)
          .Field("fix", "restrict the port to the API server (NetworkPolicy or firewall)");
    }
  }
  // Both are process-wide switches that the builder reads; they must precede BuildAndStart.
  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort(options.listen_address, credentials, &port);
  daemon->stack_->AddTo(&builder);
  // Calls beyond the handler threads wait in the service's queue (callback API) rather than being
  // refused for want of a thread, as a sync server's thread quota did; a connection's excess
  // streams wait in its client.
  builder.AddChannelArgument(GRPC_ARG_MAX_CONCURRENT_STREAMS, options.max_streams_per_connection);
  daemon->server_ = builder.BuildAndStart();
  if (daemon->server_ == nullptr || port == 0) {
    daemon->server_.reset();
    return absl::UnavailableError(
        absl::StrCat("cannot listen on ", options.listen_address,
                     " (address in use, malformed, or not a local interface",
                     options.tls_cert_file.empty()
                         ? ")"
                         : "; or --tls-cert/--tls-key are not a PEM certificate and its key)"));
  }
  daemon->server_->GetHealthCheckService()->SetServingStatus(kPlannerServiceName, true);
  if (options.db_check != DbCheck::kOff && options.db_check_interval_hours > 0) {
    IntegrityMonitor::Options monitor_options;
    monitor_options.mode = store_options.integrity_check;
    monitor_options.interval_seconds = options.db_check_interval_hours * 3600;
    grpc::HealthCheckServiceInterface* health = daemon->server_->GetHealthCheckService();
    daemon->integrity_monitor_ = std::make_unique<IntegrityMonitor>(
        *daemon->store_, monitor_options, [health](const absl::Status& status) {
          if (!absl::IsDataLoss(status)) {  // busy or unreadable: try again next time
            MEMPLAN_LOG(kWarning, "scheduled database check did not run")
                .Field("error", status.ToString());
            return;
          }
          // Probes take the planner out of rotation; answers already given stand, new ones
          // would read a damaged file.
          MEMPLAN_LOG(kError, "scheduled database check failed; health is NOT_SERVING")
              .Field("error", status.message());
          health->SetServingStatus(false);
        });
  }
  if (!daemon->authorizer_->enabled() && !IsLoopbackAddress(options.listen_address)) {
    MEMPLAN_LOG(kWarning, "write RPCs are open to every client that reaches the port")
        .Field("listen", options.listen_address)
        .Field("fix", "--auth-token-file or --tls-client-ca");
  }
  daemon->listen_address_ = WithPort(options.listen_address, port);
  MEMPLAN_LOG(kInfo, "planner started")
      .Field("listen", daemon->listen_address_)
      .Field("metrics",
             daemon->metrics_address_.empty() ? std::string("disabled") : daemon->metrics_address_)
      .Field("transport", TransportName(options))
      .Field("write_auth", daemon->authorizer_->enabled() ? "on" : "off")
      .Field("webhook",
             daemon->webhook_address_.empty() ? std::string("off") : daemon->webhook_address_)
      .Field("db", options.db_path)
      .Field("search_threads", daemon->stack_->search_threads())
      .Field("rpc_threads", options.max_rpc_threads);
  return daemon;
}

void PlannerDaemon::Shutdown(double grace_seconds) {
  integrity_monitor_.reset();  // its callback uses server_'s health service
  if (server_ != nullptr) {
    // Load balancers and probes see NOT_SERVING while the in-flight calls finish.
    server_->GetHealthCheckService()->SetServingStatus(false);
    const auto deadline = std::chrono::system_clock::now() +
                          std::chrono::duration_cast<std::chrono::system_clock::duration>(
                              std::chrono::duration<double>(grace_seconds));
    server_->Shutdown(deadline);
    server_->Wait();
    server_.reset();
    MEMPLAN_LOG(kDebug, "grpc server stopped; in-flight RPCs finished or cancelled");
  }
  // The webhook's idle and partial connections are cut at once; a review already planning
  // finishes before the core goes.
  webhook_server_.reset();
  webhook_.reset();
  // Handlers have returned, so nothing waits on the executor any more; its destructor joins.
  stack_.reset();
  authorizer_.reset();
  metrics_server_.reset();
  metrics_.reset();
  registry_.reset();
  if (store_ != nullptr) {
    store_.reset();  // closes the database (checkpoints the WAL)
    MEMPLAN_LOG(kInfo, "planner stopped");
  }
}

}  // namespace memplan
