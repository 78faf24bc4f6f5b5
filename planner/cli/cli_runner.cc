#include "planner/cli/cli_runner.h"

#include <chrono>
#include <fstream>
#include <iostream>
#include <iterator>
#include <memory>
#include <optional>
#include <sstream>
#include <utility>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "common/build_info.h"
#include "common/flags.h"
#include "common/grpc_credentials.h"
#include "common/hf_config.h"
#include "common/presets.h"
#include "common/proto_convert.h"
#include "google/protobuf/util/json_util.h"
#include "grpcpp/grpcpp.h"
#include "memplan/v1/planner.grpc.pb.h"
#include "planner/cli/cli_args.h"
#include "planner/cli/env_report.h"
#include "planner/cli/formatters.h"
#include "planner/cli/in_process_planner.h"

namespace memplan::cli {
namespace {

constexpr int kExitOk = 0;
constexpr int kExitRpcError = 1;
constexpr int kExitUsage = 2;

const char* CodeName(grpc::StatusCode code) {
  switch (code) {
    case grpc::StatusCode::OK:
      return "OK";
    case grpc::StatusCode::CANCELLED:
      return "CANCELLED";
    case grpc::StatusCode::UNKNOWN:
      return "UNKNOWN";
    case grpc::StatusCode::INVALID_ARGUMENT:
      return "INVALID_ARGUMENT";
    case grpc::StatusCode::DEADLINE_EXCEEDED:
      return "DEADLINE_EXCEEDED";
    case grpc::StatusCode::NOT_FOUND:
      return "NOT_FOUND";
    case grpc::StatusCode::ALREADY_EXISTS:
      return "ALREADY_EXISTS";
    case grpc::StatusCode::PERMISSION_DENIED:
      return "PERMISSION_DENIED";
    case grpc::StatusCode::RESOURCE_EXHAUSTED:
      return "RESOURCE_EXHAUSTED";
    case grpc::StatusCode::FAILED_PRECONDITION:
      return "FAILED_PRECONDITION";
    case grpc::StatusCode::ABORTED:
      return "ABORTED";
    case grpc::StatusCode::OUT_OF_RANGE:
      return "OUT_OF_RANGE";
    case grpc::StatusCode::UNIMPLEMENTED:
      return "UNIMPLEMENTED";
    case grpc::StatusCode::INTERNAL:
      return "INTERNAL";
    case grpc::StatusCode::UNAVAILABLE:
      return "UNAVAILABLE";
    case grpc::StatusCode::DATA_LOSS:
      return "DATA_LOSS";
    case grpc::StatusCode::UNAUTHENTICATED:
      return "UNAUTHENTICATED";
    default:
      return "UNKNOWN";
  }
}

// Everything one command needs: where to print and how to reach the planner.
class Session {
 public:
  // `channel` reaches the daemon at global.planner_address, or the in-process planner.
  Session(const GlobalOptions& global, ClientCredentials credentials,
          std::shared_ptr<grpc::Channel> channel, std::ostream& out, std::ostream& err)
      : global_(global),
        credentials_(std::move(credentials)),
        out_(out),
        err_(err),
        channel_(std::move(channel)),
        stub_(v1::Planner::NewStub(channel_)) {}

  // Calls one unary RPC; on failure prints the code and message and returns false.
  template <typename Request, typename Response, typename Method>
  bool Call(const char* name, Method method, const Request& request, Response* response) {
    grpc::ClientContext context;
    context.set_deadline(
        std::chrono::system_clock::now() +
        std::chrono::microseconds(static_cast<int64_t>(global_.timeout_seconds * 1e6)));
    AttachBearerToken(credentials_, &context);
    const grpc::Status status = ((*stub_).*method)(&context, request, response);
    if (status.ok()) return true;
    // A refused or dead connection also reads UNAVAILABLE; the channel state tells it apart from
    // a planner that answered UNAVAILABLE itself.
    const bool unreachable = (status.error_code() == grpc::StatusCode::UNAVAILABLE ||
                              status.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED) &&
                             channel_->GetState(/*try_to_connect=*/false) != GRPC_CHANNEL_READY;
    if (unreachable) {
      err_ << "memplan: cannot reach the planner at " << global_.planner_address << " ("
           << CodeName(status.error_code()) << ": " << status.error_message() << ")\n"
           << "  Is memplan-planner running there? Start it (scripts/demo.sh shows how) or pass "
              "--planner HOST:PORT.\n";
      if (!global_.planner_given) {
        err_ << "  This command needs a running planner: it reads or writes what the planner "
                "stores (traces, hardware profiles, plans, measurements, calibration). Without "
                "--planner only plan, admit and presets answer, in-process.\n";
      }
      // A TLS mismatch also looks like an unreachable planner.
      err_ << (credentials_.tls
                   ? "  With TLS: does --tls-ca sign the planner's certificate, and does the "
                     "planner require a client certificate (--tls-cert/--tls-key)?\n"
                   : "  If the planner serves TLS, pass --tls-ca (and --tls-cert/--tls-key for "
                     "mutual TLS).\n");
    } else {
      err_ << "memplan: " << name << " failed: " << CodeName(status.error_code()) << ": "
           << status.error_message() << "\n";
    }
    return false;
  }

  // Prints `message` as proto JSON (with --json) or via `table`.
  template <typename Message, typename Table>
  int Print(const Message& message, Table table) {
    if (!global_.json) {
      out_ << table(message);
      return kExitOk;
    }
    google::protobuf::util::JsonPrintOptions options;
    options.add_whitespace = true;
    options.always_print_primitive_fields = true;
    options.preserve_proto_field_names = true;
    std::string json;
    const auto status = google::protobuf::util::MessageToJsonString(message, &json, options);
    if (!status.ok()) {
      err_ << "memplan: cannot render JSON: " << status.ToString() << "\n";
      return kExitRpcError;
    }
    out_ << json;
    if (json.empty() || json.back() != '\n') out_ << "\n";
    return kExitOk;
  }

  int UsageError(const std::string& message) {
    err_ << "memplan: " << message << "\n";
    return kExitUsage;
  }

  v1::Planner::Stub& stub() { return *stub_; }
  std::ostream& out() { return out_; }

 private:
  const GlobalOptions& global_;
  const ClientCredentials credentials_;
  std::ostream& out_;
  std::ostream& err_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::Planner::Stub> stub_;
};

absl::StatusOr<std::string> ReadInput(const std::string& path) {
  if (path == "-") {
    return std::string(std::istreambuf_iterator<char>(std::cin), std::istreambuf_iterator<char>());
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat(path, ": cannot open"));
  std::stringstream buffer;
  buffer << in.rdbuf();
  return buffer.str();
}

// Reads a proto-JSON file into `message`; a usage-class error names the file.
template <typename Message>
absl::Status ReadJsonMessage(const std::string& path, Message* message) {
  absl::StatusOr<std::string> text = ReadInput(path);
  if (!text.ok()) return text.status();
  google::protobuf::util::JsonParseOptions options;
  options.ignore_unknown_fields = false;
  const auto status = google::protobuf::util::JsonStringToMessage(*text, message, options);
  if (!status.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat(path == "-" ? "stdin" : path, ": not a ", message->GetTypeName(),
                     " in proto JSON: ", status.message().as_string()));
  }
  return absl::OkStatus();
}

// Builds the PlanRequest; errors are the user's (an unreadable --arch-file).
absl::StatusOr<v1::PlanRequest> BuildPlanRequest(const PlanOptions& o) {
  v1::PlanRequest request;
  if (!o.arch_preset.empty()) request.set_arch_preset(o.arch_preset);
  if (!o.trace_id.empty()) request.set_trace_id(o.trace_id);
  if (!o.arch_file.empty()) {
    absl::StatusOr<ModelSpec> spec = LoadHfConfigFile(o.arch_file);
    if (!spec.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("--arch-file ", o.arch_file, ": ", std::string(spec.status().message())));
    }
    *request.mutable_arch() = ToProto(*spec);
  }
  if (!o.gpu_preset.empty()) request.set_hardware_preset(o.gpu_preset);
  if (!o.hardware_id.empty()) request.set_hardware_profile_id(o.hardware_id);
  // With --trace-id, fields the user did not give stay unset so the planner takes the trace's.
  const bool from_trace = !o.trace_id.empty();
  if (!from_trace || HasWorkloadFlags(o)) *request.mutable_workload() = ToProto(PlanWorkload(o));
  if (!from_trace || o.training.kind != TrainingKind::kFull) {
    *request.mutable_training() = ToProto(o.training);
  }
  if (o.param_dtype) {
    request.set_param_dtype(ToProto(*o.param_dtype));
  } else if (!from_trace) {
    request.set_param_dtype(ToProto(kDefaultDType));
  }
  request.set_optimizer(o.optimizer);
  *request.mutable_fixed() = ToProto(o.fixed);
  if (o.safety_margin) request.set_safety_margin(*o.safety_margin);
  if (o.host_memory_bytes) request.set_host_memory_bytes(*o.host_memory_bytes);
  if (o.max_alternatives) request.set_max_alternatives(*o.max_alternatives);
  request.set_skip_limits(o.skip_limits);
  return request;
}

int RunAdmit(Session& s, const CliInvocation& inv) {
  absl::StatusOr<v1::PlanRequest> job = BuildPlanRequest(inv.plan);
  if (!job.ok()) return s.UsageError(std::string(job.status().message()));
  v1::AdmitRequest request;
  *request.mutable_job() = *std::move(job);
  for (const PoolOption& option : inv.pools) {
    v1::NodePool& pool = *request.add_pools();
    pool.set_name(option.name);
    if (!option.hardware_id.empty()) {
      pool.set_hardware_profile_id(option.hardware_id);
    } else {
      pool.set_hardware_preset(option.hardware_preset);
    }
    pool.set_gpus(option.gpus);
  }
  v1::AdmitResponse response;
  if (!s.Call("Admit", &v1::Planner::Stub::Admit, request, &response)) return kExitRpcError;
  return s.Print(response, [](const v1::AdmitResponse& r) { return FormatAdmit(r); });
}

int RunPlan(Session& s, const PlanOptions& options) {
  absl::StatusOr<v1::PlanRequest> request = BuildPlanRequest(options);
  if (!request.ok()) return s.UsageError(std::string(request.status().message()));
  v1::PlanResponse response;
  if (!s.Call("Plan", &v1::Planner::Stub::Plan, *request, &response)) return kExitRpcError;
  // A vision-language model's tower, from the spec the request names (a trace's is the trace's).
  std::optional<ModelSpec> model;
  if (request->has_arch()) model = ModelSpecFromProto(request->arch());
  if (!options.arch_preset.empty()) model = FindModelPreset(options.arch_preset);
  return s.Print(response, [&](const v1::PlanResponse& r) {
    std::string text = FormatPlanResponse(r);
    if (model && r.prediction().peak_bytes() > 0) {
      absl::StrAppend(&text, FormatVisionTower(*model, PlanWorkload(options),
                                               options.param_dtype.value_or(kDefaultDType),
                                               options.training.kind == TrainingKind::kFull, r));
    }
    return text;
  });
}

int RunTraceSubmit(Session& s, const std::string& path) {
  v1::SubmitTraceRequest request;
  if (absl::Status st = ReadJsonMessage(path, request.mutable_trace()); !st.ok()) {
    return s.UsageError(std::string(st.message()));
  }
  v1::SubmitTraceResponse response;
  if (!s.Call("SubmitTrace", &v1::Planner::Stub::SubmitTrace, request, &response)) {
    return kExitRpcError;
  }
  return s.Print(response, [](const v1::SubmitTraceResponse& r) {
    return absl::StrCat("Stored trace ", r.trace_id(), "\nUse it with: memplan plan --trace-id ",
                        r.trace_id(), " --gpu ...\n");
  });
}

int RunTraceGet(Session& s, const std::string& id) {
  v1::GetTraceRequest request;
  request.set_trace_id(id);
  v1::GetTraceResponse response;
  if (!s.Call("GetTrace", &v1::Planner::Stub::GetTrace, request, &response)) return kExitRpcError;
  return s.Print(response, [](const v1::GetTraceResponse& r) { return FormatTrace(r.trace()); });
}

int RunHardwareSubmit(Session& s, const std::string& path) {
  v1::SubmitHardwareProfileRequest request;
  if (absl::Status st = ReadJsonMessage(path, request.mutable_profile()); !st.ok()) {
    return s.UsageError(std::string(st.message()));
  }
  v1::SubmitHardwareProfileResponse response;
  if (!s.Call("SubmitHardwareProfile", &v1::Planner::Stub::SubmitHardwareProfile, request,
              &response)) {
    return kExitRpcError;
  }
  return s.Print(response, [](const v1::SubmitHardwareProfileResponse& r) {
    return absl::StrCat("Stored hardware profile ", r.profile_id(),
                        "\nUse it with: memplan plan --hardware-id ", r.profile_id(), " ...\n");
  });
}

int RunHardwareGet(Session& s, const std::string& id) {
  v1::GetHardwareProfileRequest request;
  request.set_profile_id(id);
  v1::GetHardwareProfileResponse response;
  if (!s.Call("GetHardwareProfile", &v1::Planner::Stub::GetHardwareProfile, request, &response)) {
    return kExitRpcError;
  }
  return s.Print(response, [](const v1::GetHardwareProfileResponse& r) {
    return FormatHardwareProfile(r.profile());
  });
}

int RunPresets(Session& s, PresetsFilter filter) {
  v1::ListPresetsResponse response;
  if (!s.Call("ListPresets", &v1::Planner::Stub::ListPresets, v1::ListPresetsRequest(),
              &response)) {
    return kExitRpcError;
  }
  if (filter == PresetsFilter::kModels) response.clear_hardware();
  if (filter == PresetsFilter::kHardware) response.clear_models();
  return s.Print(response, [filter](const v1::ListPresetsResponse& r) {
    return FormatPresets(r, filter != PresetsFilter::kHardware, filter != PresetsFilter::kModels);
  });
}

int RunMeasure(Session& s, const MeasureOptions& options) {
  v1::ReportMeasurementRequest request;
  *request.mutable_measurement() = ToProto(options.measurement);
  v1::ReportMeasurementResponse response;
  if (!s.Call("ReportMeasurement", &v1::Planner::Stub::ReportMeasurement, request, &response)) {
    return kExitRpcError;
  }
  return s.Print(response,
                 [](const v1::ReportMeasurementResponse& r) { return FormatMeasurementReply(r); });
}

int RunCalibration(Session& s, const CalibrationOptions& options) {
  v1::GetCalibrationRequest request;
  request.set_hardware_name(options.hardware_name);
  if (options.param_dtype) request.set_param_dtype(ToProto(*options.param_dtype));
  request.set_model_family(options.model_family);
  v1::GetCalibrationResponse response;
  if (!s.Call("GetCalibration", &v1::Planner::Stub::GetCalibration, request, &response)) {
    return kExitRpcError;
  }
  return s.Print(response,
                 [](const v1::GetCalibrationResponse& r) { return FormatCalibrations(r); });
}

int RunPlansList(Session& s, const PlansListOptions& options) {
  v1::ListPlansRequest request;
  request.set_page_size(options.page_size);
  request.set_page_token(options.page_token);
  v1::ListPlansResponse all;
  // --all follows the tokens; the bound stops a server that never ends its pages.
  for (int page = 0; page < 100000; ++page) {
    v1::ListPlansResponse response;
    if (!s.Call("ListPlans", &v1::Planner::Stub::ListPlans, request, &response)) {
      return kExitRpcError;
    }
    for (v1::StoredPlan& plan : *response.mutable_plans()) *all.add_plans() = std::move(plan);
    all.set_next_page_token(response.next_page_token());
    if (!options.all_pages || response.next_page_token().empty()) break;
    request.set_page_token(response.next_page_token());
  }
  return s.Print(all, [](const v1::ListPlansResponse& r) {
    std::string text = FormatPlansList(r);
    if (!r.next_page_token().empty()) {
      absl::StrAppend(&text, "More: memplan plans list --page-token ", r.next_page_token(), "\n");
    }
    return text;
  });
}

int RunPlansGet(Session& s, const std::string& id) {
  v1::GetPlanRequest request;
  request.set_plan_id(id);
  v1::GetPlanResponse response;
  if (!s.Call("GetPlan", &v1::Planner::Stub::GetPlan, request, &response)) return kExitRpcError;
  return s.Print(response, [](const v1::GetPlanResponse& r) { return FormatStoredPlan(r.plan()); });
}

// `memplan env`: the report never fails; the daemon is asked only with --planner.
int RunEnv(const CliInvocation& inv, const ClientCredentials& credentials, std::ostream& out) {
  EnvProbes probes = SystemEnvProbes();
  probes.db_path = inv.global.db_path.value_or(kDefaultPlannerDb);
  if (inv.global.planner_given) {
    probes.planner_address = inv.global.planner_address;
    probes.contact_planner = [&inv, &credentials]() -> std::string {
      grpc::ChannelArguments channel_args;
      ApplyChannelArguments(credentials, &channel_args);
      auto stub = v1::Planner::NewStub(grpc::CreateCustomChannel(
          inv.global.planner_address, credentials.channel, channel_args));
      grpc::ClientContext context;
      context.set_deadline(
          std::chrono::system_clock::now() +
          std::chrono::microseconds(static_cast<int64_t>(inv.global.timeout_seconds * 1e6)));
      AttachBearerToken(credentials, &context);
      v1::ListPresetsResponse presets;
      const grpc::Status status = stub->ListPresets(&context, v1::ListPresetsRequest(), &presets);
      if (!status.ok()) {
        return absl::StrCat("no answer to ListPresets (", CodeName(status.error_code()), ": ",
                            status.error_message(), ")");
      }
      return absl::StrCat("answered ListPresets: ", presets.models_size(), " model and ",
                          presets.hardware_size(), " hardware presets");
    };
  }
  const EnvReport report = CollectEnvReport(probes);
  out << (inv.global.json ? FormatEnvJson(report) : FormatEnvText(report));
  return kExitOk;
}

}  // namespace

int RunCli(const std::vector<std::string>& args, std::ostream& out, std::ostream& err) {
  if (args.empty()) {
    err << HelpText(Command::kNone);
    return kExitUsage;
  }
  if (VersionRequested(args)) {
    out << build_info::VersionLine("memplan") << "\n";
    return kExitOk;
  }
  absl::StatusOr<CliInvocation> parsed = ParseCommandLine(args);
  if (!parsed.ok()) {
    err << "memplan: " << parsed.status().message() << "\n"
        << "Run 'memplan --help' (or 'memplan COMMAND --help') for usage.\n";
    return kExitUsage;
  }
  const CliInvocation& inv = *parsed;
  if (inv.help_text) {
    out << *inv.help_text;
    return kExitOk;
  }
  absl::StatusOr<ClientCredentials> credentials = LoadClientCredentials(inv.global.security);
  if (!credentials.ok()) {
    err << "memplan: " << credentials.status().message() << "\n";
    return kExitUsage;
  }
  if (inv.command == Command::kEnv) return RunEnv(inv, *credentials, out);
  std::unique_ptr<InProcessPlanner> in_process;
  std::shared_ptr<grpc::Channel> channel;
  if (AnswersInProcess(inv)) {
    InProcessPlannerOptions options;
    if (inv.global.db_path) {
      options.db_path = *inv.global.db_path;
      options.db_required = true;
    }
    absl::StatusOr<std::unique_ptr<InProcessPlanner>> started = InProcessPlanner::Start(options);
    if (!started.ok()) {
      err << "memplan: " << started.status().message() << "\n";
      return absl::IsNotFound(started.status()) ? kExitUsage : kExitRpcError;
    }
    in_process = *std::move(started);
    channel = in_process->channel();
    if (inv.command == Command::kPlan || inv.command == Command::kAdmit) {
      // stderr, so the answer on stdout reads exactly as the daemon's.
      err << "memplan: answered in-process (no --planner); calibration "
          << (in_process->db_path().empty()
                  ? std::string("none (no ") + kDefaultPlannerDb + ")"
                  : "from " + in_process->db_path() + ", read only")
          << "; the plan is not stored\n";
    }
  } else {
    grpc::ChannelArguments channel_args;
    ApplyChannelArguments(*credentials, &channel_args);
    channel = grpc::CreateCustomChannel(inv.global.planner_address, credentials->channel,
                                        channel_args);
  }
  Session session(inv.global, *std::move(credentials), std::move(channel), out, err);
  switch (inv.command) {
    case Command::kPlan:
      return RunPlan(session, inv.plan);
    case Command::kAdmit:
      return RunAdmit(session, inv);
    case Command::kTraceSubmit:
      return RunTraceSubmit(session, inv.file_path);
    case Command::kTraceGet:
      return RunTraceGet(session, inv.id);
    case Command::kHardwareSubmit:
      return RunHardwareSubmit(session, inv.file_path);
    case Command::kHardwareList:
      return RunPresets(session, PresetsFilter::kHardware);
    case Command::kHardwareGet:
      return RunHardwareGet(session, inv.id);
    case Command::kMeasure:
      return RunMeasure(session, inv.measure);
    case Command::kCalibration:
      return RunCalibration(session, inv.calibration);
    case Command::kPlansList:
      return RunPlansList(session, inv.plans_list);
    case Command::kPlansGet:
      return RunPlansGet(session, inv.id);
    case Command::kPresets:
      return RunPresets(session, inv.presets);
    case Command::kEnv:  // answered above
    case Command::kNone:
      break;
  }
  out << HelpText(Command::kNone);
  return kExitOk;
}

}  // namespace memplan::cli
