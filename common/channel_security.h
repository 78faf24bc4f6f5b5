// How a client of the planner (the memplan CLI, the agent's PlannerClient) secures its channel:
// TLS (the planner's certificate verified against a CA), mutual TLS (plus a client certificate)
// and a bearer token for the write RPCs. Plain data and flag rules, gRPC-free so that Torch
// translation units may hold it; common/grpc_credentials.h turns it into gRPC credentials.
// Thread-compatible value types and pure functions.
#pragma once

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/flags.h"

namespace memplan {

struct ChannelSecurityOptions {
  std::string tls_ca_file;      // --tls-ca: PEM CA(s) the planner's certificate must chain to;
                                // empty: plaintext
  std::string tls_cert_file;    // --tls-cert: PEM client certificate (mutual TLS)
  std::string tls_key_file;     // --tls-key: its PEM private key
  std::string tls_server_name;  // --tls-server-name: name to verify instead of the target host
  std::string auth_token_file;  // --auth-token-file: file holding the bearer token
};

// Registers the flags above (each refuses an empty value) writing into `options`.
void AddChannelSecurityFlags(FlagSet* flags, ChannelSecurityOptions* options);

// Removes the flags above ("--flag=value" or "--flag value") from `args` into `options`, leaves
// every other argument in order, and checks the cross-flag rules. For commands whose flags
// several parsers share (the agent's commands).
absl::Status TakeChannelSecurityFlags(std::vector<std::string>* args,
                                      ChannelSecurityOptions* options);

// Whether any of the flags above was given.
bool HasChannelSecurity(const ChannelSecurityOptions& options);

// Cross-flag rules: --tls-cert and --tls-key come together, and they and --tls-server-name need
// --tls-ca. INVALID_ARGUMENT naming the flags.
absl::Status ValidateChannelSecurity(const ChannelSecurityOptions& options);

// Help lines for the flags, two-space indented, 80 columns.
std::string ChannelSecurityUsage();

// Reads a whole file named by `flag` (a certificate, a key, a token file). INVALID_ARGUMENT
// naming the flag and the path when it cannot be read or is empty.
absl::StatusOr<std::string> ReadFlagFile(absl::string_view flag, const std::string& path);

// Reads a bearer token: the file's first line, surrounding whitespace removed. INVALID_ARGUMENT
// naming the flag when it is empty or holds characters a gRPC header value cannot carry.
absl::StatusOr<std::string> ReadBearerTokenFile(absl::string_view flag, const std::string& path);

// Whether `token` may travel as an HTTP/2 header value: printable ASCII (0x21-0x7e), non-empty.
bool IsValidBearerToken(absl::string_view token);

}  // namespace memplan
