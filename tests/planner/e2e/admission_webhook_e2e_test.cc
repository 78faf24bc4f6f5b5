// End to end, the Kubernetes validating admission webhook: the real memplan-planner with
// --webhook over HTTPS (certificates made by openssl in the test), real AdmissionReview JSON as
// the API server sends it, POSTed with curl. Issue 12's example: a Pod asking an RTX 4090 for a
// llama-3.1-8b full fine-tune is denied with the reason, the same Pod on an H100 is admitted.
#include <arpa/inet.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <openssl/ssl.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "daemon_process.h"
#include "grpcpp/grpcpp.h"
#include "memplan/v1/planner.grpc.pb.h"
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

// A TCP connection to 127.0.0.1:port, optionally with TLS (the test CA is not checked: these
// clients probe the server's handling of connections, not its identity). Reads time out after
// 30 s so a server that never answers fails the test instead of hanging it.
class RawClient {
 public:
  static std::unique_ptr<RawClient> Connect(int port, bool tls) {
    auto client = std::unique_ptr<RawClient>(new RawClient());
    client->fd_ = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(static_cast<uint16_t>(port));
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (client->fd_ < 0 ||
        connect(client->fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
      return nullptr;
    }
    timeval timeout{30, 0};
    setsockopt(client->fd_, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof(timeout));
    if (!tls) return client;
    client->ctx_ = SSL_CTX_new(TLS_client_method());
    client->ssl_ = SSL_new(client->ctx_);
    SSL_set_fd(client->ssl_, client->fd_);
    if (SSL_connect(client->ssl_) != 1) return nullptr;
    return client;
  }
  ~RawClient() { Close(); }

  bool Send(const std::string& data) {
    if (ssl_ != nullptr) {
      return SSL_write(ssl_, data.data(), static_cast<int>(data.size())) ==
             static_cast<int>(data.size());
    }
    return send(fd_, data.data(), data.size(), MSG_NOSIGNAL) == static_cast<ssize_t>(data.size());
  }
  // Everything until the server closes (or 30 s pass).
  std::string ReadAll() {
    std::string out;
    char buffer[4096];
    while (true) {
      const int n = ssl_ != nullptr ? SSL_read(ssl_, buffer, sizeof(buffer))
                                    : static_cast<int>(recv(fd_, buffer, sizeof(buffer), 0));
      if (n <= 0) return out;
      out.append(buffer, static_cast<size_t>(n));
    }
  }
  // Closes without a TLS close_notify; `reset` sends a TCP RST instead of a FIN, so the server's
  // next write to this connection fails (EPIPE: the SIGPIPE path).
  void Close(bool reset = false) {
    if (fd_ >= 0 && reset) {
      linger l{1, 0};
      setsockopt(fd_, SOL_SOCKET, SO_LINGER, &l, sizeof(l));
    }
    if (ssl_ != nullptr) SSL_free(ssl_);
    if (ctx_ != nullptr) SSL_CTX_free(ctx_);
    if (fd_ >= 0) close(fd_);
    ssl_ = nullptr;
    ctx_ = nullptr;
    fd_ = -1;
  }

 private:
  RawClient() = default;
  int fd_ = -1;
  SSL_CTX* ctx_ = nullptr;
  SSL* ssl_ = nullptr;
};

// The HTTP status code of a raw answer ("HTTP/1.1 431 ..."), 0 when there is none.
int StatusOf(const std::string& answer) {
  if (answer.rfind("HTTP/1.1 ", 0) != 0 || answer.size() < 12) return 0;
  return std::atoi(answer.c_str() + 9);
}

class AdmissionWebhookE2ETest : public ::testing::Test {
 protected:
  void SetUp() override {
    // The probing clients write to connections the server may have closed.
    signal(SIGPIPE, SIG_IGN);
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
    EXPECT_EQ(answer["response"].value("uid", ""), review["request"]["uid"].get<std::string>());
    return answer["response"];
  }

  // Whether the daemon process is still running (not exited, not killed by a signal).
  bool DaemonAlive() {
    int status = 0;
    return waitpid(daemon_->pid(), &status, WNOHANG) == 0;
  }

  // Plans in the daemon's store, read over its gRPC port.
  int StoredPlans() {
    grpc::SslCredentialsOptions tls;
    tls.pem_root_certs = ReadFile(pki_.ca_cert);
    auto stub = v1::Planner::NewStub(
        grpc::CreateChannel(daemon_->address(), grpc::SslCredentials(tls)));
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
    v1::ListPlansRequest request;
    request.set_page_size(1000);
    v1::ListPlansResponse response;
    const grpc::Status status = stub->ListPlans(&context, request, &response);
    EXPECT_TRUE(status.ok()) << status.error_message();
    return response.plans_size();
  }

  // The request the daemon stored for a plan, read over its gRPC port.
  v1::PlanRequest StoredRequest(const std::string& plan_id) {
    grpc::SslCredentialsOptions tls;
    tls.pem_root_certs = ReadFile(pki_.ca_cert);
    auto stub = v1::Planner::NewStub(
        grpc::CreateChannel(daemon_->address(), grpc::SslCredentials(tls)));
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
    v1::GetPlanRequest request;
    request.set_plan_id(plan_id);
    v1::GetPlanResponse response;
    const grpc::Status status = stub->GetPlan(&context, request, &response);
    EXPECT_TRUE(status.ok()) << plan_id << ": " << status.error_message();
    return response.plan().request();
  }

  std::string dir_;
  testing::TestPki pki_;
  int port_ = 0;
  std::unique_ptr<DaemonProcess> daemon_;
};

// Issue 27, 1: a client that hung up killed the daemon with SIGPIPE (exit 141, no log line).
TEST_F(AdmissionWebhookE2ETest, ClientsThatHangUpDoNotKillTheDaemon) {
  const std::string review = PodReview("uid-hangup", Json{{"memplan.dev/model", "llama-3.1-8b"},
                                                          {"memplan.dev/gpu", "h100-80gb"}})
                                 .dump();
  const std::string request =
      absl::StrCat("POST /validate HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                   "Content-Length: ",
                   review.size(), "\r\n\r\n", review);
  for (int round = 0; round < 3; ++round) {
    // A TLS handshake, then gone.
    auto handshake_only = RawClient::Connect(port_, /*tls=*/true);
    ASSERT_NE(handshake_only, nullptr);
    handshake_only->Close(/*reset=*/round % 2 == 1);
    // Half a header, then gone.
    auto partial = RawClient::Connect(port_, /*tls=*/true);
    ASSERT_NE(partial, nullptr);
    ASSERT_TRUE(partial->Send("POST /validate HTTP/1.1\r\nHost: 12"));
    partial->Close(/*reset=*/round % 2 == 1);
    // A whole review, then gone before the answer: the server writes to a reset connection.
    auto whole = RawClient::Connect(port_, /*tls=*/true);
    ASSERT_NE(whole, nullptr);
    ASSERT_TRUE(whole->Send(request));
    whole->Close(/*reset=*/true);
    // A plaintext client on the TLS port.
    auto plaintext = RawClient::Connect(port_, /*tls=*/false);
    ASSERT_NE(plaintext, nullptr);
    ASSERT_TRUE(plaintext->Send(request));
    plaintext->Close(/*reset=*/true);
  }
  // Two planning reviews after them, one after the other: the second is searched after every
  // reset review's search has started, so their answers have been written to the closed
  // connections, and the daemon is still there to answer.
  for (const char* uid : {"uid-after-hangups-1", "uid-after-hangups-2"}) {
    EXPECT_TRUE(Review(PodReview(uid, Json{{"memplan.dev/model", "llama-3.1-8b"},
                                           {"memplan.dev/gpu", "h100-80gb"}}))
                    .value("allowed", false));
  }
  EXPECT_TRUE(DaemonAlive()) << ReadFile(dir_ + "/planner.log");
}

// Issue 27, 2: 100 000 nested arrays overflowed the stack (SIGSEGV) while the review was copied.
TEST_F(AdmissionWebhookE2ETest, DeeplyNestedJsonIsRefusedNotFollowed) {
  const int depth = 100000;
  const std::string body =
      absl::StrCat(R"({"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview",)",
                   R"("request":{"uid":"uid-deep","object":)", std::string(depth, '['),
                   std::string(depth, ']'), "}}");
  const auto [status, answer] = Post("/validate", body);
  EXPECT_EQ(status, 400);
  EXPECT_THAT(answer, HasSubstr("deeper than 64 levels"));
  // Brackets inside strings are text, not nesting.
  Json annotated = PodReview("uid-brackets", Json::object());
  annotated["request"]["object"]["metadata"]["labels"] = {{"note", std::string(1000, '[')}};
  EXPECT_TRUE(Review(annotated).value("allowed", false));
  EXPECT_TRUE(DaemonAlive()) << ReadFile(dir_ + "/planner.log");
}

// Issue 27, 2: a 20 KB header and a 1 MiB + 1 body got no answer at all.
TEST_F(AdmissionWebhookE2ETest, OversizedHeadersAndBodiesAreAnswered431And413) {
  auto big_header = RawClient::Connect(port_, /*tls=*/true);
  ASSERT_NE(big_header, nullptr);
  ASSERT_TRUE(big_header->Send(absl::StrCat("POST /validate HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Pad: ",
                                            std::string(20 << 10, 'a'), "\r\n\r\n")));
  const std::string header_answer = big_header->ReadAll();
  EXPECT_EQ(StatusOf(header_answer), 431) << header_answer.substr(0, 200);

  // The 413 comes from the Content-Length alone: the body is never read.
  auto big_body = RawClient::Connect(port_, /*tls=*/true);
  ASSERT_NE(big_body, nullptr);
  ASSERT_TRUE(big_body->Send(
      "POST /validate HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 1048577\r\n\r\n{"));
  const std::string body_answer = big_body->ReadAll();
  EXPECT_EQ(StatusOf(body_answer), 413) << body_answer.substr(0, 200);
  EXPECT_THAT(body_answer, HasSubstr("Content-Length = 1048577: allowed up to 1048576 bytes"));

  // Two requests on one connection: the first is answered, once.
  const std::string review = PodReview("uid-pipelined", Json::object()).dump();
  const std::string one = absl::StrCat("POST /validate HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: ",
                                       review.size(), "\r\n\r\n", review);
  auto pipelined = RawClient::Connect(port_, /*tls=*/true);
  ASSERT_NE(pipelined, nullptr);
  ASSERT_TRUE(pipelined->Send(one + one));
  const std::string pipelined_answer = pipelined->ReadAll();
  EXPECT_EQ(StatusOf(pipelined_answer), 200) << pipelined_answer.substr(0, 200);
  EXPECT_THAT(pipelined_answer, HasSubstr("uid-pipelined"));
}

// Issue 27, 5: 16 connections that sent part of a request and then waited blocked every review
// (the server served at most 16, each for as long as its client kept sending).
TEST_F(AdmissionWebhookE2ETest, IdleAndDrippingClientsDoNotBlockAReview) {
  std::vector<std::unique_ptr<RawClient>> drips;
  for (int i = 0; i < 20; ++i) {
    auto client = RawClient::Connect(port_, /*tls=*/i % 2 == 0);
    ASSERT_NE(client, nullptr) << i;
    if (i % 4 < 2) {
      ASSERT_TRUE(client->Send("POST /validate HTTP/1.1\r\nHost"));
    }
    drips.push_back(std::move(client));
  }
  // curl gives up after 30 s; the review needs well under a second once it is served.
  EXPECT_TRUE(Review(PodReview("uid-beside-drips", Json::object())).value("allowed", false));
  // A client that stopped sending gets 408 at the connection's deadline (10 s from accept).
  const std::string cut = drips[0]->ReadAll();
  EXPECT_EQ(StatusOf(cut), 408) << cut.substr(0, 200);
  // SIGTERM with connections still open: the daemon cuts them and exits cleanly.
  std::vector<std::unique_ptr<RawClient>> open;
  for (int i = 0; i < 8; ++i) open.push_back(RawClient::Connect(port_, /*tls=*/true));
  auto exit_status = daemon_->SignalAndWait(SIGTERM);
  ASSERT_TRUE(exit_status.ok()) << exit_status.status();
  EXPECT_TRUE(WIFEXITED(*exit_status) && WEXITSTATUS(*exit_status) == 0) << *exit_status;
}

// The manifest declares sideEffects: NoneOnDryRun; dry-run reviews stored plans all the same.
TEST_F(AdmissionWebhookE2ETest, DryRunReviewsStoreNothing) {
  const Json job = {{"memplan.dev/model", "llama-3.1-8b"}, {"memplan.dev/gpu", "h100-80gb"}};
  Json dry = PodReview("uid-dry", job);
  dry["request"]["dryRun"] = true;
  const Json dry_answer = Review(dry);
  EXPECT_TRUE(dry_answer.value("allowed", false)) << dry_answer.dump();
  EXPECT_FALSE(dry_answer.contains("auditAnnotations"));
  EXPECT_THAT(dry_answer["warnings"][0].get<std::string>(), HasSubstr("dry run, no plan stored"));
  EXPECT_EQ(StoredPlans(), 0);
  // A dry run that does not fit is still denied with the reason.
  Json dry_4090 = PodReview("uid-dry-4090", Json{{"memplan.dev/model", "llama-3.1-8b"},
                                                 {"memplan.dev/gpu", "rtx-4090"}});
  dry_4090["request"]["dryRun"] = true;
  EXPECT_FALSE(Review(dry_4090).value("allowed", true));
  EXPECT_EQ(StoredPlans(), 0);

  EXPECT_TRUE(Review(PodReview("uid-real", job)).value("allowed", false));
  EXPECT_EQ(StoredPlans(), 1);
}

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

TEST_F(AdmissionWebhookE2ETest, NodeAnnotationsOverrideThePresetsNode) {
  // Llama-3.1-70B on 8 H100s: the preset's 256 GiB node is too small for the offloaded chunks,
  // the 2 TiB node the Pod names is not.
  Json job = {{"memplan.dev/model", "llama-3.1-70b"},
              {"memplan.dev/gpu", "h100-80gb"},
              {"memplan.dev/world-size", "8"},
              {"memplan.dev/gpus-per-node", "8"}};
  const Json preset_node = Review(PodReview("uid-70b-preset", job));
  EXPECT_FALSE(preset_node.value("allowed", true));
  EXPECT_THAT(preset_node["status"].value("message", ""),
              HasSubstr("256.0 GiB shared by 8 local ranks"));
  job["memplan.dev/host-memory-gib"] = "2048";
  const Json big_node = Review(PodReview("uid-70b-2tib", job));
  EXPECT_TRUE(big_node.value("allowed", false)) << big_node.dump();

  job["memplan.dev/host-memory-gib"] = "0";
  EXPECT_THAT(Review(PodReview("uid-70b-0", job))["status"].value("message", ""),
              HasSubstr("annotation memplan.dev/host-memory-gib = \"0\": expected an integer in "
                        "[1, 65536]"));
  job.erase("memplan.dev/host-memory-gib");
  job["memplan.dev/gpus-per-node"] = "16";
  EXPECT_THAT(Review(PodReview("uid-70b-16", job))["status"].value("message", ""),
              HasSubstr("annotation memplan.dev/gpus-per-node = \"16\": expected an integer in "
                        "[1, 8]"));
}

TEST_F(AdmissionWebhookE2ETest, MethodAndOptimizerAnnotationsReachThePlanner) {
  const Json qlora = {{"memplan.dev/model", "llama-3.1-8b"},
                      {"memplan.dev/gpu", "rtx-4090"},
                      {"memplan.dev/method", "qlora"},
                      {"memplan.dev/lora-rank", "16"},
                      {"memplan.dev/lora-targets", "all"},
                      {"memplan.dev/optimizer", "adamw8bit"}};
  Json answer = Review(PodReview("uid-qlora", qlora));
  EXPECT_TRUE(answer.value("allowed", false)) << answer.dump();
  v1::PlanRequest stored =
      StoredRequest(answer["auditAnnotations"].value("memplan.dev/plan-id", ""));
  EXPECT_EQ(stored.training().kind(), v1::TrainingMethod::QLORA);
  EXPECT_EQ(stored.training().lora_rank(), 16);
  EXPECT_EQ(stored.training().lora_target_modules_size(), 7);
  EXPECT_EQ(stored.optimizer(), "adamw8bit");

  // A rank alone means LoRA; targets may carry spaces after the commas.
  const Json lora = {{"memplan.dev/model", "llama-3.1-8b"},
                     {"memplan.dev/gpu", "rtx-4090"},
                     {"memplan.dev/lora-rank", "8"},
                     {"memplan.dev/lora-targets", "q_proj, v_proj"}};
  answer = Review(PodReview("uid-lora", lora));
  EXPECT_TRUE(answer.value("allowed", false)) << answer.dump();
  stored = StoredRequest(answer["auditAnnotations"].value("memplan.dev/plan-id", ""));
  EXPECT_EQ(stored.training().kind(), v1::TrainingMethod::LORA);
  EXPECT_THAT(stored.training().lora_target_modules(),
              ::testing::ElementsAre("q_proj", "v_proj"));
  EXPECT_EQ(stored.optimizer(), "adamw");  // none given: the planner stores its default

  const Json full = {{"memplan.dev/model", "llama-3.2-1b"},
                     {"memplan.dev/gpu", "h100-80gb"},
                     {"memplan.dev/method", "full"},
                     {"memplan.dev/optimizer", "sgd"}};
  answer = Review(PodReview("uid-full", full));
  EXPECT_TRUE(answer.value("allowed", false)) << answer.dump();
  stored = StoredRequest(answer["auditAnnotations"].value("memplan.dev/plan-id", ""));
  EXPECT_EQ(stored.training().kind(), v1::TrainingMethod::FULL);
  EXPECT_EQ(stored.optimizer(), "sgd");
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
           {{{"memplan.dev/model", "llama-3.1-8b"},
             {"memplan.dev/gpu", "h100-80gb"},
             {"memplan.dev/method", "ia3"},
             {"memplan.dev/lora-rank", "8"}},
            "annotation memplan.dev/method = \"ia3\": allowed: full, lora, qlora"},
           {{{"memplan.dev/model", "llama-3.1-8b"},
             {"memplan.dev/gpu", "h100-80gb"},
             {"memplan.dev/method", "qlora"}},
            "annotation memplan.dev/method = \"qlora\": needs memplan.dev/lora-rank"},
           {{{"memplan.dev/model", "llama-3.1-8b"},
             {"memplan.dev/gpu", "h100-80gb"},
             {"memplan.dev/method", "full"},
             {"memplan.dev/lora-rank", "8"}},
            "annotation memplan.dev/lora-rank = \"8\": needs memplan.dev/method lora or qlora"},
           {{{"memplan.dev/model", "llama-3.1-8b"},
             {"memplan.dev/gpu", "h100-80gb"},
             {"memplan.dev/lora-rank", "8"}},
            "annotation memplan.dev/lora-rank = \"8\": needs memplan.dev/lora-targets (q_proj, "
            "k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj, or all)"},
           {{{"memplan.dev/model", "llama-3.1-8b"},
             {"memplan.dev/gpu", "h100-80gb"},
             {"memplan.dev/lora-rank", "8"},
             {"memplan.dev/lora-targets", "q_proj,qproj"}},
            "annotation memplan.dev/lora-targets = \"q_proj,qproj\": allowed: q_proj, k_proj"},
           {{{"memplan.dev/model", "llama-3.1-8b"},
             {"memplan.dev/gpu", "h100-80gb"},
             {"memplan.dev/optimizer", "adam"}},
            "annotation memplan.dev/optimizer = \"adam\": allowed: adamw, adamw_bf16, sgd, "
            "adamw8bit"},
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
