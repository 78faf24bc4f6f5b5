#include "test_pki.h"

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <tuple>

#include "absl/strings/str_cat.h"

namespace memplan::testing {
namespace {

// Runs a shell command; INTERNAL with its output when it fails.
absl::Status Shell(const std::string& command, const std::string& log_path) {
  const std::string full = absl::StrCat(command, " >>", log_path, " 2>&1");
  const int rc = std::system(full.c_str());
  if (rc == 0) return absl::OkStatus();
  std::ifstream log(log_path);
  std::string output((std::istreambuf_iterator<char>(log)), std::istreambuf_iterator<char>());
  return absl::InternalError(absl::StrCat("`", command, "` failed (", rc, "): ", output));
}

// A P-256 key and a certificate for `cn` signed by `ca` (or self-signed CA when ca is empty).
absl::Status MakeCert(const std::string& dir, const std::string& name, const std::string& cn,
                      const std::string& ca, const std::string& extensions) {
  const std::string log = dir + "/openssl.log";
  const std::string key = absl::StrCat(dir, "/", name, ".key");
  const std::string crt = absl::StrCat(dir, "/", name, ".crt");
  const std::string new_key =
      absl::StrCat("-newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -keyout ", key);
  if (ca.empty()) {
    return Shell(
        absl::StrCat("openssl req -x509 ", new_key, " -out ", crt, " -days 2 -subj /CN=", cn), log);
  }
  const std::string csr = absl::StrCat(dir, "/", name, ".csr");
  const std::string ext = absl::StrCat(dir, "/", name, ".ext");
  std::ofstream(ext) << extensions << "\n";
  if (absl::Status s =
          Shell(absl::StrCat("openssl req ", new_key, " -out ", csr, " -subj /CN=", cn), log);
      !s.ok()) {
    return s;
  }
  return Shell(
      absl::StrCat("openssl x509 -req -in ", csr, " -CA ", dir, "/", ca, ".crt -CAkey ", dir, "/",
                   ca, ".key -CAcreateserial -days 2 -out ", crt, " -extfile ", ext),
      log);
}

}  // namespace

absl::StatusOr<TestPki> MakeTestPki(const std::string& dir) {
  const std::string server_ext =
      "subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth";
  const std::string client_ext = "extendedKeyUsage=clientAuth";
  for (const auto& [name, cn, ca, ext] :
       {std::tuple<std::string, std::string, std::string, std::string>{"ca", "memplan-test-ca", "",
                                                                       ""},
        {"server", "memplan-planner", "ca", server_ext},
        {"client", "agent-1", "ca", client_ext},
        {"other-ca", "other-test-ca", "", ""},
        {"other-client", "intruder", "other-ca", client_ext}}) {
    if (absl::Status s = MakeCert(dir, name, cn, ca, ext); !s.ok()) return s;
  }
  TestPki pki;
  pki.ca_cert = dir + "/ca.crt";
  pki.server_cert = dir + "/server.crt";
  pki.server_key = dir + "/server.key";
  pki.client_cert = dir + "/client.crt";
  pki.client_key = dir + "/client.key";
  pki.other_ca_cert = dir + "/other-ca.crt";
  pki.other_client_cert = dir + "/other-client.crt";
  pki.other_client_key = dir + "/other-client.key";
  return pki;
}

}  // namespace memplan::testing
