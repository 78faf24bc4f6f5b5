#include "common/channel_security.h"

#include <fstream>
#include <iterator>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"

namespace memplan {

void AddChannelSecurityFlags(FlagSet* flags, ChannelSecurityOptions* options) {
  flags->NonEmptyString("--tls-ca", &options->tls_ca_file)
      .NonEmptyString("--tls-cert", &options->tls_cert_file)
      .NonEmptyString("--tls-key", &options->tls_key_file)
      .NonEmptyString("--tls-server-name", &options->tls_server_name)
      .NonEmptyString("--auth-token-file", &options->auth_token_file);
}

absl::Status TakeChannelSecurityFlags(std::vector<std::string>* args,
                                      ChannelSecurityOptions* options) {
  FlagSet flags;
  AddChannelSecurityFlags(&flags, options);
  if (absl::Status s = flags.Take(args); !s.ok()) return s;
  return ValidateChannelSecurity(*options);
}

bool HasChannelSecurity(const ChannelSecurityOptions& options) {
  return !options.tls_ca_file.empty() || !options.tls_cert_file.empty() ||
         !options.tls_key_file.empty() || !options.tls_server_name.empty() ||
         !options.auth_token_file.empty();
}

absl::Status ValidateChannelSecurity(const ChannelSecurityOptions& options) {
  if (options.tls_cert_file.empty() != options.tls_key_file.empty()) {
    return absl::InvalidArgumentError(
        "--tls-cert and --tls-key go together (the client certificate and its private key)");
  }
  if (options.tls_ca_file.empty() &&
      (!options.tls_cert_file.empty() || !options.tls_server_name.empty())) {
    return absl::InvalidArgumentError(
        "--tls-cert/--tls-key and --tls-server-name need --tls-ca (the CA that signed the "
        "planner's certificate): without it the channel is plaintext");
  }
  return absl::OkStatus();
}

std::string ChannelSecurityUsage() {
  return R"(  --tls-ca FILE           PEM CA the planner's certificate must chain to; turns TLS on
                          (default: plaintext, for a planner on loopback)
  --tls-cert FILE         PEM client certificate for mutual TLS (with --tls-key, --tls-ca)
  --tls-key FILE          PEM private key of --tls-cert
  --tls-server-name NAME  name the planner's certificate must carry (default: the host in
                          the planner address)
  --auth-token-file FILE  bearer token (first line of FILE) sent with every call; the
                          planner's write RPCs need a token or a client certificate
)";
}

absl::StatusOr<std::string> ReadFlagFile(absl::string_view flag, const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return absl::InvalidArgumentError(absl::StrCat(flag, " = \"", path, "\": cannot open"));
  }
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (in.bad()) {
    return absl::InvalidArgumentError(absl::StrCat(flag, " = \"", path, "\": read failed"));
  }
  if (text.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(flag, " = \"", path, "\": the file is empty"));
  }
  return text;
}

bool IsValidBearerToken(absl::string_view token) {
  if (token.empty()) return false;
  for (const char c : token) {
    if (c < 0x21 || c > 0x7e) return false;
  }
  return true;
}

absl::StatusOr<std::string> ReadBearerTokenFile(absl::string_view flag, const std::string& path) {
  absl::StatusOr<std::string> text = ReadFlagFile(flag, path);
  if (!text.ok()) return text.status();
  absl::string_view line = *text;
  line = line.substr(0, line.find('\n'));
  line = absl::StripAsciiWhitespace(line);
  if (!IsValidBearerToken(line)) {
    return absl::InvalidArgumentError(
        absl::StrCat(flag, " = \"", path,
                     "\": the first line must be the token: printable ASCII without spaces"));
  }
  return std::string(line);
}

}  // namespace memplan
