// Test helper: a throw-away PKI made with the openssl command line (Debian's openssl package):
// a CA with a server certificate for 127.0.0.1/localhost and a client certificate, and a second,
// unrelated CA with its own client certificate (for "wrong CA" cases). Not thread-safe.
#pragma once

#include <string>

#include "absl/status/statusor.h"

namespace memplan::testing {

struct TestPki {
  std::string ca_cert;      // the planner's CA (also signs the good client certificate)
  std::string server_cert;  // CN=memplan-planner, SAN IP:127.0.0.1, DNS:localhost
  std::string server_key;
  std::string client_cert;  // CN=agent-1, signed by ca_cert
  std::string client_key;
  std::string other_ca_cert;      // an unrelated CA
  std::string other_client_cert;  // CN=intruder, signed by other_ca_cert
  std::string other_client_key;
};

// Writes the files under `dir` (which must exist). INTERNAL with the command and its output
// when openssl fails or is missing.
absl::StatusOr<TestPki> MakeTestPki(const std::string& dir);

}  // namespace memplan::testing
