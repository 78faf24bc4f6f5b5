// End to end, the Kubernetes validating admission webhook: the real memplan-planner with
// --webhook over HTTPS (certificates made by openssl in the test), real AdmissionReview JSON as
// the API server sends it, POSTed with curl. Issue 12's example: a Pod asking an RTX 4090 for a
// llama-3.1-8b full fine-tune is denied with the reason, the same Pod on an H100 is admitted.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <stdlib.h>
#include <sys/wait.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "daemon_process.h"
#include "nlohmann/json.hpp"
#include "test_pki.h"

#ifndef MEMPLAN_PLANNER_BINARY
#error "MEMPLAN_PLANNER_BINARY must name the memplan-planner executable"
#endif

namespace memplan {
namespace {

using ::memplan::testing::DaemonProcess;
using ::testing::HasSubstr;
using ::testing::StartsWith;
using Json = nlohmann::json;

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

// An AdmissionReview for the creation of a Pod with these annotations and node selector.
Json PodReview(const std::string& uid, const Json& annotations,
               const Json& node_selector = Json::object()) {
  Json pod = {
      {"apiVersion", "v1"},
      {"kind", "Pod"},
      {"metadata", {{"name", "finetune"}, {"namespace", "ml"}}},
      {"spec",
       {{"containers", Json::array({{{"name", "trainer"},
                                     {"image", "memplan-agent:latest"},
                                     {"resources", {{"limits", {{"nvidia.com/gpu", "1"}}}}}}})}}}};
  if (!annotations.empty()) pod["metadata"]["annotations"] = annotations;
  if (!node_selector.empty()) pod["spec"]["nodeSelector"] = node_selector;
  return {{"apiVersion", "admission.k8s.io/v1"},
          {"kind", "AdmissionReview"},
          {"request",
           {{"uid", uid},
            {"kind", {{"group", ""}, {"version", "v1"}, {"kind", "Pod"}}},
            {"resource", {{"group", ""}, {"version", "v1"}, {"resource", "pods"}}},
            {"namespace", "ml"},
            {"operation", "CREATE"},
            {"userInfo", {{"username", "alice"}}},
            {"object", pod},
            {"dryRun", false}}}};
}

class AdmissionWebhookE2ETest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string templ = ::testing::TempDir() + "/memplan-webhook-XXXXXX";
    ASSERT_NE(mkdtemp(templ.data()), nullptr);
    dir_ = templ;
    auto pki = testing::MakeTestPki(dir_);
    ASSERT_TRUE(pki.ok()) << pki.status();
    pki_ = *pki;
    port_ = testing::FreeLoopbackPort();
    ASSERT_GT(port_, 0);
    auto daemon = DaemonProcess::Start(
        MEMPLAN_PLANNER_BINARY, dir_ + "/planner.db", dir_ + "/planner.log",
        /*serve_metrics=*/false,
        {"--search-threads=2", "--tls-cert=" + pki_.server_cert, "--tls-key=" + pki_.server_key,
         absl::StrCat("--webhook=127.0.0.1:", port_)});
    ASSERT_TRUE(daemon.ok()) << daemon.status() << ReadFile(dir_ + "/planner.log");
    daemon_ = std::make_unique<DaemonProcess>(*std::move(daemon));
  }

  void TearDown() override {
    daemon_.reset();
    if (HasFailure()) {
      std::printf("files kept in %s\n", dir_.c_str());
    } else if (!dir_.empty()) {
      std::filesystem::remove_all(dir_);
    }
  }

  // POSTs `body` to https://127.0.0.1:PORT/path with curl, trusting the test CA; returns
  // {HTTP status, body}.
  std::pair<int, std::string> Post(const std::string& path, const std::string& body) {
    const std::string request_file = dir_ + "/request.json";
    std::ofstream(request_file) << body;
    auto run = testing::RunToCompletion(
        MEMPLAN_CURL_BINARY,
        {"-sS", "--max-time", "30", "--cacert", pki_.ca_cert, "-H",
         "Content-Type: application/json", "--data-binary", "@" + request_file, "-w",
         "\n%{http_code}", absl::StrCat("https://127.0.0.1:", port_, path)});
    EXPECT_TRUE(run.ok()) << run.status();
    if (!run.ok()) return {-1, ""};
    EXPECT_TRUE(WIFEXITED(run->first) && WEXITSTATUS(run->first) == 0) << run->second;
    const size_t last = run->second.rfind('\n');
    if (last == std::string::npos) return {-1, run->second};
    return {std::atoi(run->second.c_str() + last + 1), run->second.substr(0, last)};
  }

  // The AdmissionReview response of a review.
  Json Review(const Json& review) {
    auto [status, body] = Post("/validate", review.dump());
    EXPECT_EQ(status, 200) << body;
    Json answer = Json::parse(body, nullptr, /*allow_exceptions=*/false);
    EXPECT_FALSE(answer.is_discarded()) << body;
    if (answer.is_discarded()) return Json::object();
    EXPECT_EQ(answer.value("apiVersion", ""), "admission.k8s.io/v1");
    EXPECT_EQ(answer.value("kind", ""), "AdmissionReview");
    EXPECT_EQ(answer["response"].value("uid", ""), review["request"]["uid"]);
    return answer["response"];
  }

  std::string dir_;
  testing::TestPki pki_;
  int port_ = 0;
  std::unique_ptr<DaemonProcess> daemon_;
};

TEST_F(AdmissionWebhookE2ETest, DeniesAFullFineTuneOnAnRtx4090AndAdmitsItOnAnH100) {
  const Json job = {{"memplan.dev/model", "llama-3.1-8b"},
                    {"memplan.dev/batch", "1"},
                    {"memplan.dev/seq", "4096"}};
  Json on_4090 = job;
  on_4090["memplan.dev/gpu"] = "rtx-4090";
  const Json denied = Review(PodReview("uid-4090", on_4090));
  EXPECT_FALSE(denied.value("allowed", true));
  EXPECT_EQ(denied["status"].value("code", 0), 403);
  EXPECT_THAT(denied["status"].value("message", ""),
              StartsWith("memplan: llama-3.1-8b on rtx-4090: does not fit"));
  EXPECT_THAT(denied["status"].value("message", ""), HasSubstr("smallest card that fits"));
  EXPECT_THAT(denied["auditAnnotations"].value("memplan.dev/plan-id", ""), StartsWith("plan-"));

  // The same job on an H100 node (named by the node selector this time): admitted.
  const Json admitted = Review(PodReview("uid-h100", job, Json{{"memplan.dev/gpu", "h100-80gb"}}));
  EXPECT_TRUE(admitted.value("allowed", false)) << admitted.dump();
  EXPECT_FALSE(admitted.contains("status"));
  EXPECT_THAT(admitted["auditAnnotations"].value("memplan.dev/plan-id", ""), StartsWith("plan-"));
  ASSERT_TRUE(admitted.contains("warnings"));
  EXPECT_THAT(admitted["warnings"][0].get<std::string>(), HasSubstr("tokens/s per GPU"));

  // LoRA makes it fit the RTX 4090.
  Json lora = on_4090;
  lora["memplan.dev/lora-rank"] = "16";
  lora["memplan.dev/lora-targets"] = "q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj";
  EXPECT_TRUE(Review(PodReview("uid-lora", lora)).value("allowed", false));
}

TEST_F(AdmissionWebhookE2ETest, OtherPodsPassAndBadAnnotationsAreNamed) {
  // Not a memplan job: allowed, no plan made.
  const Json plain = Review(PodReview("uid-plain", Json::object()));
  EXPECT_TRUE(plain.value("allowed", false));
  EXPECT_FALSE(plain.contains("auditAnnotations"));

  struct Case {
    Json annotations;
    std::string message;
  };
  for (const Case& c : std::vector<Case>{
           {{{"memplan.dev/model", "llama-3.1-8b"}},
            "annotation memplan.dev/gpu (or nodeSelector memplan.dev/gpu) is missing"},
           {{{"memplan.dev/model", "llama-3.1-8b"},
             {"memplan.dev/gpu", "h100-80gb"},
             {"memplan.dev/batch", "zero"}},
            "annotation memplan.dev/batch = \"zero\": expected an integer in [1, 65536]"},
           {{{"memplan.dev/model", "llama-3.1-8b"},
             {"memplan.dev/gpu", "h100-80gb"},
             {"memplan.dev/dtype", "int4"}},
            "annotation memplan.dev/dtype = \"int4\": allowed: fp32, bf16, fp16"},
           {{{"memplan.dev/model", "llama-3.1-8b"}, {"memplan.dev/gpu", "tpu-v9"}},
            "hardware_preset \"tpu-v9\""},
           {{{"memplan.dev/model", "gpt-17"}, {"memplan.dev/gpu", "h100-80gb"}},
            "arch_preset \"gpt-17\""}}) {
    const Json answer = Review(PodReview("uid-bad", c.annotations));
    EXPECT_FALSE(answer.value("allowed", true)) << c.annotations.dump();
    EXPECT_THAT(answer["status"].value("message", ""), HasSubstr(c.message));
  }

  // Not an AdmissionReview, a wrong path: HTTP errors, and the webhook keeps serving.
  EXPECT_EQ(Post("/validate", "{\"kind\": \"Pod\"}").first, 400);
  EXPECT_EQ(Post("/mutate", PodReview("uid-x", Json::object()).dump()).first, 404);
  EXPECT_TRUE(Review(PodReview("uid-after", Json::object())).value("allowed", false));
}

TEST_F(AdmissionWebhookE2ETest, WebhookNeedsTls) {
  auto run = testing::RunToCompletion(
      MEMPLAN_PLANNER_BINARY,
      {"--listen=127.0.0.1:0", "--metrics=", "--db=" + dir_ + "/x.db", "--webhook=127.0.0.1:0"});
  ASSERT_TRUE(run.ok());
  EXPECT_TRUE(WIFEXITED(run->first) && WEXITSTATUS(run->first) == 2) << run->second;
  EXPECT_THAT(run->second, HasSubstr("--webhook needs --tls-cert and --tls-key"));
}

}  // namespace
}  // namespace memplan
