// Who may call the planner's write RPCs (SubmitTrace, SubmitHardwareProfile, ReportMeasurement):
// a bearer token from the token file, with a role, or a verified client certificate (mutual
// TLS). Read RPCs stay open. gRPC-free: the service shell extracts CallerCredentials from the
// call. Thread-safe (immutable after construction).
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace memplan {

// What a caller may write.
enum class WriteRole {
  kWrite,   // "write": every write RPC (agents that bench, profile and train; operators)
  kReport,  // "report": ReportMeasurement only (a job that reports what it measured)
};

struct AuthToken {
  std::string name;  // appears in logs and as the measurement's reported_by, never the token
  WriteRole role = WriteRole::kWrite;
  std::string token;
};

// The token file: one "NAME ROLE TOKEN" per line (ROLE: write | report); blank lines and lines
// starting with '#' are skipped. INVALID_ARGUMENT naming `flag`, the line and the allowed values
// for a malformed line, a duplicate name or token, a token shorter than 16 characters, or a file
// without tokens.
absl::StatusOr<std::vector<AuthToken>> ParseTokenFile(absl::string_view text,
                                                      absl::string_view flag);

struct WriteAuthorizerOptions {
  std::vector<AuthToken> tokens;
  // A client certificate verified against --tls-client-ca has the "write" role.
  bool client_certificates_write = false;
};

// What the transport knows about one call.
struct CallerCredentials {
  std::optional<std::string> authorization;  // the "authorization" header, when sent
  std::string certificate_identity;          // verified client certificate; empty: none
  std::string peer;                          // gRPC peer, e.g. "ipv4:127.0.0.1:40312"
};

class WriteAuthorizer {
 public:
  explicit WriteAuthorizer(WriteAuthorizerOptions options);

  // False when neither tokens nor client certificates are configured: writes are open (a
  // planner on loopback, the default).
  bool enabled() const { return enabled_; }

  // The caller's identity for `method` (a write RPC): "token:NAME", "cert:IDENTITY", or, when
  // authorization is off, "peer:HOST". UNAUTHENTICATED when no credential was sent or the token
  // is unknown; PERMISSION_DENIED when the token's role does not allow `method`.
  absl::StatusOr<std::string> AuthorizeWrite(absl::string_view method,
                                             const CallerCredentials& credentials) const;

 private:
  const std::vector<AuthToken> tokens_;
  const bool client_certificates_write_;
  const bool enabled_;
};

// "ipv4:10.1.2.3:40312" -> "ipv4:10.1.2.3", "ipv6:[::1]:5" -> "ipv6:[::1]": the peer without
// its ephemeral port, so that one client's connections count as one.
std::string PeerHost(absl::string_view peer);

}  // namespace memplan
