// ChannelSecurityOptions (common/channel_security.h) made into gRPC client credentials: the one
// place where the memplan CLI and the agent's PlannerClient build a secure channel and attach
// the bearer token. Target memplan::common_grpc (links gRPC; never linked into Torch targets).
// Thread-safe after construction (read-only).
#pragma once

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "common/channel_security.h"

namespace grpc {
class ChannelArguments;
class ChannelCredentials;
class ClientContext;
}  // namespace grpc

namespace memplan {

// The metadata key and value prefix of the bearer token ("authorization: Bearer TOKEN").
inline constexpr char kAuthorizationMetadataKey[] = "authorization";
inline constexpr char kBearerPrefix[] = "Bearer ";

struct ClientCredentials {
  std::shared_ptr<grpc::ChannelCredentials> channel;  // TLS / mTLS, or insecure
  std::string tls_server_name;                        // empty: the target's host
  std::string bearer_token;                           // empty: none
  bool tls = false;
};

// Reads the certificate, key and token files now (INVALID_ARGUMENT naming the flag when one
// cannot be read) so that a typo fails before the first call, not inside it.
absl::StatusOr<ClientCredentials> LoadClientCredentials(const ChannelSecurityOptions& options);

// Channel arguments the credentials need (the TLS server-name override).
void ApplyChannelArguments(const ClientCredentials& credentials, grpc::ChannelArguments* args);

// Adds "authorization: Bearer TOKEN" to a call when a token is set.
void AttachBearerToken(const ClientCredentials& credentials, grpc::ClientContext* context);

}  // namespace memplan
