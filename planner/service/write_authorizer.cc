#include "planner/service/write_authorizer.h"

#include <set>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace memplan {
namespace {

constexpr size_t kMinTokenLength = 16;
constexpr absl::string_view kBearer = "Bearer ";

// Compares in time that depends on the lengths only, so a caller cannot find a token's prefix
// by timing refusals.
bool ConstantTimeEquals(absl::string_view a, absl::string_view b) {
  if (a.size() != b.size()) return false;
  unsigned char diff = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    diff |= static_cast<unsigned char>(a[i]) ^ static_cast<unsigned char>(b[i]);
  }
  return diff == 0;
}

bool RoleAllows(WriteRole role, absl::string_view method) {
  switch (role) {
    case WriteRole::kWrite:
      return true;
    case WriteRole::kReport:
      return method == "ReportMeasurement";
  }
  return false;
}

}  // namespace

absl::StatusOr<std::vector<AuthToken>> ParseTokenFile(absl::string_view text,
                                                      absl::string_view flag) {
  std::vector<AuthToken> tokens;
  std::set<std::string> names;
  std::set<std::string> secrets;
  int line_number = 0;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    ++line_number;
    line = absl::StripAsciiWhitespace(line);
    if (line.empty() || line.front() == '#') continue;
    const std::vector<absl::string_view> fields =
        absl::StrSplit(line, absl::ByAnyChar(" \t"), absl::SkipEmpty());
    auto error = [&](absl::string_view why) {
      return absl::InvalidArgumentError(absl::StrCat(flag, " line ", line_number, ": ", why,
                                                     " (expected \"NAME ROLE TOKEN\", ROLE one "
                                                     "of: write, report)"));
    };
    if (fields.size() != 3) return error(absl::StrCat(fields.size(), " fields"));
    AuthToken token;
    token.name = std::string(fields[0]);
    if (fields[1] == "write") {
      token.role = WriteRole::kWrite;
    } else if (fields[1] == "report") {
      token.role = WriteRole::kReport;
    } else {
      return error(absl::StrCat("role \"", fields[1], "\" is not a role"));
    }
    token.token = std::string(fields[2]);
    if (token.token.size() < kMinTokenLength) {
      return error(absl::StrCat("the token of \"", token.name, "\" has ", token.token.size(),
                                " characters; at least ", kMinTokenLength, " are needed"));
    }
    if (!names.insert(token.name).second) {
      return error(absl::StrCat("the name \"", token.name, "\" appears twice"));
    }
    if (!secrets.insert(token.token).second) {
      return error(absl::StrCat("the token of \"", token.name, "\" is also another name's"));
    }
    tokens.push_back(std::move(token));
  }
  if (tokens.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(flag,
                     ": no tokens (one \"NAME ROLE TOKEN\" per line, ROLE one of: write, "
                     "report)"));
  }
  return tokens;
}

WriteAuthorizer::WriteAuthorizer(WriteAuthorizerOptions options)
    : tokens_(std::move(options.tokens)),
      client_certificates_write_(options.client_certificates_write),
      enabled_(!tokens_.empty() || client_certificates_write_) {}

absl::StatusOr<std::string> WriteAuthorizer::AuthorizeWrite(
    absl::string_view method, const CallerCredentials& credentials) const {
  if (!enabled_) return absl::StrCat("peer:", PeerHost(credentials.peer));
  if (credentials.authorization.has_value()) {
    absl::string_view value = *credentials.authorization;
    if (!absl::StartsWith(value, kBearer)) {
      return absl::UnauthenticatedError(
          absl::StrCat(method,
                       " needs \"authorization: Bearer TOKEN\"; the header has another "
                       "scheme"));
    }
    value.remove_prefix(kBearer.size());
    const AuthToken* match = nullptr;
    for (const AuthToken& token : tokens_) {
      if (ConstantTimeEquals(value, token.token)) match = &token;
    }
    if (match == nullptr) {
      return absl::UnauthenticatedError(
          absl::StrCat(method, ": the bearer token is not in the planner's --auth-token-file"));
    }
    if (!RoleAllows(match->role, method)) {
      return absl::PermissionDeniedError(
          absl::StrCat(method, ": token \"", match->name,
                       "\" has role \"report\", which allows "
                       "ReportMeasurement only; give it role \"write\""));
    }
    return absl::StrCat("token:", match->name);
  }
  if (client_certificates_write_ && !credentials.certificate_identity.empty()) {
    return absl::StrCat("cert:", credentials.certificate_identity);
  }
  return absl::UnauthenticatedError(absl::StrCat(
      method, " is a write RPC and needs credentials: ",
      client_certificates_write_
          ? (tokens_.empty() ? "a client certificate signed by the planner's --tls-client-ca"
                             : "a bearer token (--auth-token-file) or a client certificate "
                               "signed by the planner's --tls-client-ca")
          : "a bearer token (--auth-token-file)"));
}

std::string PeerHost(absl::string_view peer) {
  const size_t colon = peer.rfind(':');
  const size_t scheme = peer.find(':');
  if (colon == absl::string_view::npos || colon == scheme) return std::string(peer);
  return std::string(peer.substr(0, colon));
}

}  // namespace memplan
