// WriteAuthorizer and the token file, without gRPC: roles, unknown tokens, client certificates,
// and the identities the planner records.
#include "planner/service/write_authorizer.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace memplan {
namespace {

using ::testing::HasSubstr;

constexpr char kTokens[] = R"(# name role token
agent-1  write   w-0123456789abcdef

ci-job	report	r-0123456789abcdef
)";

CallerCredentials WithHeader(const std::string& header) {
  CallerCredentials c;
  c.authorization = header;
  c.peer = "ipv4:10.0.0.7:41234";
  return c;
}

TEST(WriteAuthorizerTest, ParsesTheTokenFile) {
  auto tokens = ParseTokenFile(kTokens, "--auth-token-file");
  ASSERT_TRUE(tokens.ok()) << tokens.status();
  ASSERT_EQ(tokens->size(), 2u);
  EXPECT_EQ((*tokens)[0].name, "agent-1");
  EXPECT_EQ((*tokens)[0].role, WriteRole::kWrite);
  EXPECT_EQ((*tokens)[0].token, "w-0123456789abcdef");
  EXPECT_EQ((*tokens)[1].name, "ci-job");
  EXPECT_EQ((*tokens)[1].role, WriteRole::kReport);
}

TEST(WriteAuthorizerTest, TokenFileErrorsNameTheFlagLineAndAllowedValues) {
  auto error = [](const std::string& text) {
    return std::string(ParseTokenFile(text, "--auth-token-file").status().message());
  };
  EXPECT_THAT(error("a write\n"), HasSubstr("--auth-token-file line 1: 2 fields"));
  EXPECT_THAT(error("\na admin 0123456789abcdefg\n"),
              HasSubstr("line 2: role \"admin\" is not a role"));
  EXPECT_THAT(error("a admin 0123456789abcdefg\n"), HasSubstr("ROLE one of: write, report"));
  EXPECT_THAT(error("a write 0123456789abcde\n"), HasSubstr("has 15 characters; at least 16"));
  EXPECT_THAT(error("a write 0123456789abcdefg\na report 0123456789abcdefh\n"),
              HasSubstr("the name \"a\" appears twice"));
  EXPECT_THAT(error("a write 0123456789abcdefg\nb report 0123456789abcdefg\n"),
              HasSubstr("also another name's"));
  EXPECT_THAT(error("# nothing\n\n"), HasSubstr("--auth-token-file: no tokens"));
}

TEST(WriteAuthorizerTest, RolesDecideTheWriteRpcs) {
  WriteAuthorizerOptions options;
  options.tokens = *ParseTokenFile(kTokens, "--auth-token-file");
  const WriteAuthorizer authorizer(options);
  ASSERT_TRUE(authorizer.enabled());

  for (const char* method : {"SubmitTrace", "SubmitHardwareProfile", "ReportMeasurement"}) {
    auto writer = authorizer.AuthorizeWrite(method, WithHeader("Bearer w-0123456789abcdef"));
    ASSERT_TRUE(writer.ok()) << method << ": " << writer.status();
    EXPECT_EQ(*writer, "token:agent-1");
  }
  auto reporter =
      authorizer.AuthorizeWrite("ReportMeasurement", WithHeader("Bearer r-0123456789abcdef"));
  ASSERT_TRUE(reporter.ok()) << reporter.status();
  EXPECT_EQ(*reporter, "token:ci-job");
  for (const char* method : {"SubmitTrace", "SubmitHardwareProfile"}) {
    auto denied = authorizer.AuthorizeWrite(method, WithHeader("Bearer r-0123456789abcdef"));
    EXPECT_EQ(denied.status().code(), absl::StatusCode::kPermissionDenied) << method;
    EXPECT_THAT(denied.status().message(), HasSubstr("\"ci-job\" has role \"report\""));
  }

  // Unknown, truncated, extended or differently-schemed tokens, and none at all.
  for (const char* header :
       {"Bearer nope-0123456789abcdef", "Bearer w-0123456789abcde", "Bearer w-0123456789abcdefX",
        "Basic w-0123456789abcdef", "w-0123456789abcdef", "Bearer "}) {
    auto refused = authorizer.AuthorizeWrite("ReportMeasurement", WithHeader(header));
    EXPECT_EQ(refused.status().code(), absl::StatusCode::kUnauthenticated) << header;
  }
  CallerCredentials none;
  none.peer = "ipv4:10.0.0.7:41234";
  auto refused = authorizer.AuthorizeWrite("SubmitTrace", none);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kUnauthenticated);
  EXPECT_THAT(refused.status().message(),
              HasSubstr("SubmitTrace is a write RPC and needs credentials: a bearer token"));
  // A certificate does not count unless client certificates were configured.
  none.certificate_identity = "agent-1";
  EXPECT_EQ(authorizer.AuthorizeWrite("SubmitTrace", none).status().code(),
            absl::StatusCode::kUnauthenticated);
}

TEST(WriteAuthorizerTest, VerifiedClientCertificatesWrite) {
  WriteAuthorizerOptions options;
  options.client_certificates_write = true;
  const WriteAuthorizer authorizer(options);
  ASSERT_TRUE(authorizer.enabled());
  CallerCredentials with_cert;
  with_cert.certificate_identity = "agent-7";
  auto caller = authorizer.AuthorizeWrite("SubmitTrace", with_cert);
  ASSERT_TRUE(caller.ok()) << caller.status();
  EXPECT_EQ(*caller, "cert:agent-7");
  auto refused = authorizer.AuthorizeWrite("SubmitTrace", CallerCredentials());
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kUnauthenticated);
  EXPECT_THAT(refused.status().message(), HasSubstr("a client certificate signed by"));
}

TEST(WriteAuthorizerTest, OffMeansOpenWritesKeyedByPeerHost) {
  const WriteAuthorizer authorizer{WriteAuthorizerOptions()};
  EXPECT_FALSE(authorizer.enabled());
  CallerCredentials c;
  c.peer = "ipv6:[::1]:5123";
  auto caller = authorizer.AuthorizeWrite("ReportMeasurement", c);
  ASSERT_TRUE(caller.ok());
  EXPECT_EQ(*caller, "peer:ipv6:[::1]");
  EXPECT_EQ(PeerHost("ipv4:127.0.0.1:40312"), "ipv4:127.0.0.1");
  EXPECT_EQ(PeerHost("unix:/run/memplan.sock"), "unix:/run/memplan.sock");
}

}  // namespace
}  // namespace memplan
