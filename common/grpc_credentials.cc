#include "common/grpc_credentials.h"

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "grpcpp/grpcpp.h"
#include "grpcpp/security/credentials.h"

namespace memplan {

absl::StatusOr<ClientCredentials> LoadClientCredentials(const ChannelSecurityOptions& options) {
  RETURN_IF_ERROR(ValidateChannelSecurity(options));
  ClientCredentials credentials;
  if (!options.auth_token_file.empty()) {
    ASSIGN_OR_RETURN(credentials.bearer_token,
                     ReadBearerTokenFile("--auth-token-file", options.auth_token_file));
  }
  if (options.tls_ca_file.empty()) {
    credentials.channel = grpc::InsecureChannelCredentials();
    return credentials;
  }
  grpc::SslCredentialsOptions ssl;
  ASSIGN_OR_RETURN(ssl.pem_root_certs, ReadFlagFile("--tls-ca", options.tls_ca_file));
  if (!options.tls_cert_file.empty()) {
    ASSIGN_OR_RETURN(ssl.pem_cert_chain, ReadFlagFile("--tls-cert", options.tls_cert_file));
    ASSIGN_OR_RETURN(ssl.pem_private_key, ReadFlagFile("--tls-key", options.tls_key_file));
  }
  credentials.channel = grpc::SslCredentials(ssl);
  credentials.tls_server_name = options.tls_server_name;
  credentials.tls = true;
  return credentials;
}

void ApplyChannelArguments(const ClientCredentials& credentials, grpc::ChannelArguments* args) {
  if (!credentials.tls_server_name.empty()) {
    args->SetSslTargetNameOverride(credentials.tls_server_name);
  }
}

void AttachBearerToken(const ClientCredentials& credentials, grpc::ClientContext* context) {
  if (credentials.bearer_token.empty()) return;
  context->AddMetadata(kAuthorizationMetadataKey,
                       absl::StrCat(kBearerPrefix, credentials.bearer_token));
}

}  // namespace memplan
