// memplan-rpc-load: drives a running memplan-planner over loopback gRPC and prints figures.
//
//   plan mode (default): N client threads, each with its own connection, issue Plan RPCs
//   back-to-back for D seconds; prints RPCs/s, latency p50/p90/p99/max and errors by code.
//   measurements mode: makes one plan, then inserts M measurements for it through
//   ReportMeasurement from N clients; prints inserts/s and, with --daemon-pid, the daemon's
//   VmRSS / VmHWM from /proc/PID/status before and after.
// Exit status: 0 when every RPC succeeded, 1 when any failed, 2 on bad flags.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <limits>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/synchronization/mutex.h"
#include "common/build_info.h"
#include "common/flags.h"
#include "common/validate.h"
#include "grpcpp/grpcpp.h"
#include "memplan/v1/planner.grpc.pb.h"

namespace {

using Clock = std::chrono::steady_clock;

struct Options {
  std::string planner = "127.0.0.1:50051";
  std::string mode = "plan";
  int clients = 16;
  double duration_seconds = 10;
  double warmup_seconds = 1;
  double deadline_seconds = 30;
  std::string arch = "llama-3.1-8b";
  std::string gpu = "h100-80gb";
  int64_t batch = 1;
  int64_t seq = 4096;
  bool skip_limits = false;
  int64_t vary_batch = 1;  // requests cycle micro_batch over 1..vary_batch
  int64_t measurements = 100000;
  int daemon_pid = 0;
};

constexpr char kUsage[] = R"(Usage: memplan-rpc-load [flags]
  --planner HOST:PORT   planner address (default 127.0.0.1:50051)
  --mode plan|measurements
  --clients N           concurrent clients, each on its own connection (default 16, max 1024)
  --duration SECONDS    plan mode: measured time after warm-up (default 10, max 600)
  --warmup SECONDS      plan mode: unmeasured warm-up (default 1)
  --deadline SECONDS    per-RPC deadline (default 30; a queued call counts its wait)
  --arch PRESET --gpu PRESET --batch N --seq N --skip-limits   the Plan request
  --vary-batch N        cycle the micro-batch over 1..N so that requests differ (defeats any
                        response cache; default 1 = every request identical)
  --measurements N      measurements mode: how many to insert (default 100000, max 10000000)
  --daemon-pid PID      read VmRSS/VmHWM of this process from /proc
)";

bool ParseFlags(int argc, char** argv, Options* o) {
  const std::vector<std::string> args(argv + 1, argv + argc);
  if (memplan::VersionRequested(args)) {
    std::printf("%s\n", memplan::build_info::VersionLine("memplan-rpc-load").c_str());
    std::exit(0);
  }
  bool help = false;
  memplan::FlagSet flags("see --help");
  flags.Switch("--help", &help)
      .Alias("-h", "--help")
      .String("--planner", &o->planner)
      .Choice("--mode", &o->mode,
              memplan::FlagSet::Choices<std::string>{{"plan", "plan"},
                                                     {"measurements", "measurements"}})
      .Int("--clients", &o->clients, 1, 1024)
      .Double("--duration", &o->duration_seconds, memplan::DoubleRange{0, 600, true, false})
      .Double("--warmup", &o->warmup_seconds, 0, 60)
      .Double("--deadline", &o->deadline_seconds, memplan::DoubleRange{0, 600, true, false})
      .String("--arch", &o->arch)
      .String("--gpu", &o->gpu)
      .Int(memplan::IntFlagSpec{"--batch", 1, memplan::kMaxMicroBatch}, &o->batch)
      .Int(memplan::IntFlagSpec{"--seq", 1, memplan::kMaxSeqLen}, &o->seq)
      .Int("--vary-batch", &o->vary_batch, 1, 4096)
      .Switch("--skip-limits", &o->skip_limits)
      .Int("--measurements", &o->measurements, 1, 10000000)
      .Int("--daemon-pid", &o->daemon_pid, 1, std::numeric_limits<int>::max());
  const absl::Status parsed = flags.Parse(args);
  if (!parsed.ok()) {
    std::fprintf(stderr, "memplan-rpc-load: %s\n", std::string(parsed.message()).c_str());
    return false;
  }
  if (help) {
    std::fputs(kUsage, stdout);
    std::exit(0);
  }
  return true;
}

// One connection per client: a local subchannel pool stops gRPC from sharing one TCP
// connection between the channels, so the daemon sees N independent clients.
std::unique_ptr<memplan::v1::Planner::Stub> NewStub(const std::string& address) {
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  return memplan::v1::Planner::NewStub(
      grpc::CreateCustomChannel(address, grpc::InsecureChannelCredentials(), args));
}

memplan::v1::PlanRequest MakePlanRequest(const Options& o) {
  memplan::v1::PlanRequest request;
  request.set_arch_preset(o.arch);
  request.set_hardware_preset(o.gpu);
  request.mutable_workload()->set_micro_batch(o.batch);
  request.mutable_workload()->set_seq_len(o.seq);
  request.set_param_dtype(memplan::v1::DTYPE_BF16);
  request.set_optimizer("adamw");
  request.set_skip_limits(o.skip_limits);
  return request;
}

template <typename Fn>
grpc::Status Timed(double deadline_seconds, Fn fn, double* seconds) {
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() +
                       std::chrono::duration_cast<std::chrono::system_clock::duration>(
                           std::chrono::duration<double>(deadline_seconds)));
  const auto start = Clock::now();
  grpc::Status status = fn(&context);
  *seconds = std::chrono::duration<double>(Clock::now() - start).count();
  return status;
}

// What every client thread collects; merged after the run.
struct ClientResult {
  std::vector<double> latencies_seconds;
  std::map<int, int64_t> errors_by_code;
  std::string first_error;
};

double Percentile(std::vector<double>& sorted, double q) {
  if (sorted.empty()) return 0;
  const size_t index = static_cast<size_t>(std::ceil(q * static_cast<double>(sorted.size()))) - 1;
  return sorted[std::min(index, sorted.size() - 1)];
}

// Prints the merged results; returns the number of failed RPCs.
int64_t Report(const char* what, std::vector<ClientResult>& results, double elapsed_seconds) {
  std::vector<double> all;
  std::map<int, int64_t> errors;
  std::string first_error;
  for (ClientResult& r : results) {
    all.insert(all.end(), r.latencies_seconds.begin(), r.latencies_seconds.end());
    for (const auto& [code, n] : r.errors_by_code) errors[code] += n;
    if (first_error.empty()) first_error = r.first_error;
  }
  std::sort(all.begin(), all.end());
  int64_t failed = 0;
  for (const auto& [code, n] : errors) failed += n;
  std::printf("%s: %zu ok in %.2f s = %.1f RPCs/s\n", what, all.size(), elapsed_seconds,
              static_cast<double>(all.size()) / elapsed_seconds);
  std::printf("latency ms: p50 %.3f  p90 %.3f  p99 %.3f  max %.3f\n", Percentile(all, 0.50) * 1e3,
              Percentile(all, 0.90) * 1e3, Percentile(all, 0.99) * 1e3,
              all.empty() ? 0.0 : all.back() * 1e3);
  const auto refused = errors.find(grpc::StatusCode::RESOURCE_EXHAUSTED);
  std::printf("answered %zu, refused (RESOURCE_EXHAUSTED) %lld\n", all.size(),
              static_cast<long long>(refused == errors.end() ? 0 : refused->second));
  std::printf("errors: %lld", static_cast<long long>(failed));
  for (const auto& [code, n] : errors)
    std::printf("  code %d: %lld", code, static_cast<long long>(n));
  std::printf("\n");
  if (!first_error.empty()) std::printf("first error: %s\n", first_error.c_str());
  return failed;
}

void Record(const grpc::Status& status, double seconds, ClientResult* result) {
  if (status.ok()) {
    result->latencies_seconds.push_back(seconds);
    return;
  }
  ++result->errors_by_code[status.error_code()];
  if (result->first_error.empty()) {
    result->first_error = absl::StrCat(status.error_code(), ": ", status.error_message());
  }
}

std::string ProcStatusLine(int pid, const std::string& key) {
  std::ifstream in(absl::StrCat("/proc/", pid, "/status"));
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(key + ":", 0) == 0) {
      const size_t start = line.find_first_not_of(" \t", key.size() + 1);
      return start == std::string::npos ? "" : line.substr(start);
    }
  }
  return "?";
}

void PrintRss(int pid, const char* when) {
  if (pid <= 0) return;
  std::printf("daemon pid %d %s: VmRSS %s, VmHWM %s\n", pid, when,
              ProcStatusLine(pid, "VmRSS").c_str(), ProcStatusLine(pid, "VmHWM").c_str());
}

int RunPlanLoad(const Options& o) {
  std::vector<memplan::v1::PlanRequest> requests;
  for (int64_t b = 1; b <= o.vary_batch; ++b) {
    requests.push_back(MakePlanRequest(o));
    if (o.vary_batch > 1) requests.back().mutable_workload()->set_micro_batch(b);
  }
  std::vector<ClientResult> results(static_cast<size_t>(o.clients));
  std::vector<std::thread> threads;
  const auto start = Clock::now();
  const auto measure_from = start + std::chrono::duration_cast<Clock::duration>(
                                        std::chrono::duration<double>(o.warmup_seconds));
  const auto stop = measure_from + std::chrono::duration_cast<Clock::duration>(
                                       std::chrono::duration<double>(o.duration_seconds));
  for (int c = 0; c < o.clients; ++c) {
    threads.emplace_back([&, c] {
      auto stub = NewStub(o.planner);
      ClientResult& result = results[static_cast<size_t>(c)];
      size_t next_request = static_cast<size_t>(c) % requests.size();
      while (true) {
        const memplan::v1::PlanRequest& request = requests[next_request];
        next_request = (next_request + 1) % requests.size();
        const auto now = Clock::now();
        if (now >= stop) break;
        memplan::v1::PlanResponse response;
        double seconds = 0;
        const grpc::Status status = Timed(
            o.deadline_seconds,
            [&](grpc::ClientContext* ctx) { return stub->Plan(ctx, request, &response); },
            &seconds);
        // Calls that started in the warm-up only warm things up.
        if (now >= measure_from) Record(status, seconds, &result);
      }
    });
  }
  for (std::thread& t : threads) t.join();
  std::printf("plan load: %d clients, %s on %s, %s x %lld%s, warm-up %.1f s\n", o.clients,
              o.arch.c_str(), o.gpu.c_str(),
              o.vary_batch > 1 ? absl::StrCat("batch 1..", o.vary_batch).c_str()
                               : absl::StrCat("batch ", o.batch).c_str(),
              static_cast<long long>(o.seq), o.skip_limits ? ", skip_limits" : "",
              o.warmup_seconds);
  const int64_t failed = Report("Plan", results, o.duration_seconds);
  PrintRss(o.daemon_pid, "after the run");
  return failed == 0 ? 0 : 1;
}

int RunMeasurementLoad(const Options& o) {
  auto stub = NewStub(o.planner);
  memplan::v1::PlanResponse plan;
  {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
    grpc::Status status = stub->Plan(&ctx, MakePlanRequest(o), &plan);
    if (!status.ok()) {
      std::fprintf(stderr, "memplan-rpc-load: Plan failed: %d: %s\n", status.error_code(),
                   status.error_message().c_str());
      return 1;
    }
  }
  const int64_t predicted = plan.prediction().peak_bytes();
  std::printf("inserting %lld measurements for %s (predicted peak %lld bytes) from %d clients\n",
              static_cast<long long>(o.measurements), plan.plan_id().c_str(),
              static_cast<long long>(predicted), o.clients);
  PrintRss(o.daemon_pid, "before");
  std::atomic<int64_t> next{0};
  std::vector<ClientResult> results(static_cast<size_t>(o.clients));
  std::vector<std::thread> threads;
  const auto start = Clock::now();
  for (int c = 0; c < o.clients; ++c) {
    threads.emplace_back([&, c] {
      auto client = NewStub(o.planner);
      ClientResult& result = results[static_cast<size_t>(c)];
      for (int64_t i = next++; i < o.measurements; i = next++) {
        memplan::v1::ReportMeasurementRequest request;
        memplan::v1::Measurement* m = request.mutable_measurement();
        m->set_plan_id(plan.plan_id());
        // Measured peaks scattered within ±3 % of the prediction, like real reports.
        const double jitter = 1.0 + 0.03 * std::sin(static_cast<double>(i));
        m->set_peak_reserved_bytes(static_cast<int64_t>(static_cast<double>(predicted) * jitter));
        m->set_peak_allocated_bytes(m->peak_reserved_bytes() * 95 / 100);
        m->set_step_seconds(1.0);
        m->set_note(absl::StrCat("rpc-load ", i));
        memplan::v1::ReportMeasurementResponse response;
        double seconds = 0;
        const grpc::Status status = Timed(
            o.deadline_seconds,
            [&](grpc::ClientContext* ctx) {
              return client->ReportMeasurement(ctx, request, &response);
            },
            &seconds);
        Record(status, seconds, &result);
      }
    });
  }
  for (std::thread& t : threads) t.join();
  const double elapsed = std::chrono::duration<double>(Clock::now() - start).count();
  const int64_t failed = Report("ReportMeasurement", results, elapsed);
  PrintRss(o.daemon_pid, "after");
  return failed == 0 ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  Options options;
  if (!ParseFlags(argc, argv, &options)) return 2;
  return options.mode == "plan" ? RunPlanLoad(options) : RunMeasurementLoad(options);
}
