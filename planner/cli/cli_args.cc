#include "planner/cli/cli_args.h"

#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <functional>
#include <limits>
#include <map>
#include <set>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "common/safety_margin.h"
#include "common/validate.h"

namespace memplan::cli {
namespace {

constexpr absl::string_view kCommandList =
    "plan, admit, trace submit|get, hardware submit|list|get, measure, calibration, plans "
    "list|get, presets";
constexpr absl::string_view kLoraModules =
    "q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj";

absl::Status FlagError(absl::string_view flag, absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat(std::string(flag), ": ", std::string(what)));
}

absl::StatusOr<int64_t> ParseInt(absl::string_view flag, absl::string_view text, int64_t min,
                                 int64_t max) {
  int64_t value = 0;
  if (!absl::SimpleAtoi(text, &value) || value < min || value > max) {
    return FlagError(flag, absl::StrCat("expected an integer in [", min, ", ", max, "], got '",
                                        std::string(text), "'"));
  }
  return value;
}

absl::StatusOr<double> ParseDouble(absl::string_view flag, absl::string_view text, double min,
                                   double max) {
  double value = 0;
  if (!absl::SimpleAtod(text, &value) || !std::isfinite(value) || value < min || value > max) {
    return FlagError(flag, absl::StrCat("expected a number in [", min, ", ", max, "], got '",
                                        std::string(text), "'"));
  }
  return value;
}

absl::StatusOr<DType> ParseDTypeFlag(absl::string_view flag, absl::string_view text) {
  std::optional<DType> dtype = ParseDType(std::string(absl::AsciiStrToLower(text)));
  if (!dtype) {
    return FlagError(
        flag, absl::StrCat("unknown dtype '", std::string(text), "'; allowed: fp32, bf16, fp16"));
  }
  return *dtype;
}

absl::StatusOr<std::vector<std::string>> ParseLoraTargets(absl::string_view flag,
                                                          absl::string_view text) {
  if (text == "all") {
    return std::vector<std::string>{"q_proj",    "k_proj",  "v_proj",   "o_proj",
                                    "gate_proj", "up_proj", "down_proj"};
  }
  std::vector<std::string> modules;
  for (absl::string_view part : absl::StrSplit(text, ',', absl::SkipWhitespace())) {
    std::string name(absl::StripAsciiWhitespace(part));
    if (name != "q_proj" && name != "k_proj" && name != "v_proj" && name != "o_proj" &&
        name != "gate_proj" && name != "up_proj" && name != "down_proj") {
      return FlagError(flag, absl::StrCat("unknown module '", name, "'; allowed: ",
                                          std::string(kLoraModules), " (or 'all')"));
    }
    modules.push_back(std::move(name));
  }
  if (modules.empty()) return FlagError(flag, "expected a comma-separated list of modules");
  return modules;
}

// One flag of a subcommand: `apply` receives the value (empty for a switch).
struct FlagSpec {
  bool takes_value = true;
  std::function<absl::Status(absl::string_view)> apply;
};
using FlagTable = std::map<std::string, FlagSpec, std::less<>>;

// Helpers that build table entries writing into a field.
FlagSpec StringFlag(std::string* out) {
  return {true, [out](absl::string_view v) {
            *out = std::string(v);
            return absl::OkStatus();
          }};
}
FlagSpec SwitchFlag(bool* out) {
  return {false, [out](absl::string_view) {
            *out = true;
            return absl::OkStatus();
          }};
}
template <typename T>
FlagSpec IntFlag(const std::string& name, T* out, int64_t min, int64_t max) {
  return {true, [name, out, min, max](absl::string_view v) -> absl::Status {
            auto value = ParseInt(name, v, min, max);
            if (!value.ok()) return value.status();
            *out = static_cast<T>(*value);
            return absl::OkStatus();
          }};
}
template <typename T>
FlagSpec OptionalIntFlag(const std::string& name, std::optional<T>* out, int64_t min, int64_t max) {
  return {true, [name, out, min, max](absl::string_view v) -> absl::Status {
            auto value = ParseInt(name, v, min, max);
            if (!value.ok()) return value.status();
            *out = static_cast<T>(*value);
            return absl::OkStatus();
          }};
}
// A value that is one of two words: *out = (value == yes).
FlagSpec ChoiceFlag(const std::string& name, std::optional<bool>* out, const std::string& yes,
                    const std::string& no) {
  return {true, [name, out, yes, no](absl::string_view v) -> absl::Status {
            if (v != yes && v != no) {
              return FlagError(name, absl::StrCat("expected ", yes, " or ", no, ", got '",
                                                  std::string(v), "'"));
            }
            *out = v == yes;
            return absl::OkStatus();
          }};
}
FlagSpec BytesFlag(const std::string& name, int64_t* out) {
  return {true, [name, out](absl::string_view v) -> absl::Status {
            auto value = ParseByteSize(v);
            if (!value.ok()) return FlagError(name, value.status().message());
            *out = *value;
            return absl::OkStatus();
          }};
}

FlagTable PlanFlags(PlanOptions& o) {
  FlagTable t;
  t["--arch"] = StringFlag(&o.arch_preset);
  t["--arch-file"] = StringFlag(&o.arch_file);
  t["--trace-id"] = StringFlag(&o.trace_id);
  t["--gpu"] = StringFlag(&o.gpu_preset);
  t["--hardware-id"] = StringFlag(&o.hardware_id);
  t["--batch"] = OptionalIntFlag("--batch", &o.micro_batch, 1, kMaxMicroBatch);
  t["--seq"] = OptionalIntFlag("--seq", &o.seq_len, 1, kMaxSeqLen);
  t["--world-size"] = OptionalIntFlag("--world-size", &o.world_size, 1, kMaxWorldSize);
  t["--local-world-size"] =
      OptionalIntFlag("--local-world-size", &o.local_world_size, 1, kMaxWorldSize);
  t["--grad-accum"] = OptionalIntFlag("--grad-accum", &o.grad_accum, 1, kMaxGradAccum);
  t["--grad-clipping"] = SwitchFlag(&o.grad_clipping);
  t["--dtype"] = {true, [&o](absl::string_view v) -> absl::Status {
                    auto dtype = ParseDTypeFlag("--dtype", v);
                    if (!dtype.ok()) return dtype.status();
                    o.param_dtype = *dtype;
                    return absl::OkStatus();
                  }};
  t["--optimizer"] = {true, [&o](absl::string_view v) -> absl::Status {
                        if (!ParseOptimizer(std::string(v))) {
                          return FlagError(
                              "--optimizer",
                              absl::StrCat("unknown optimizer '", std::string(v),
                                           "'; allowed: ", std::string(OptimizerAllowList())));
                        }
                        o.optimizer = std::string(v);
                        return absl::OkStatus();
                      }};
  t["--lora-rank"] = {true, [&o](absl::string_view v) -> absl::Status {
                        auto rank = ParseInt("--lora-rank", v, 1, kMaxHiddenSize);
                        if (!rank.ok()) return rank.status();
                        o.training.kind = o.qlora ? TrainingKind::kQlora : TrainingKind::kLora;
                        o.training.lora_rank = *rank;
                        return absl::OkStatus();
                      }};
  t["--qlora"] = {false, [&o](absl::string_view) {
                    o.qlora = true;
                    if (o.training.kind != TrainingKind::kFull) o.training.kind = TrainingKind::kQlora;
                    return absl::OkStatus();
                  }};
  t["--lora-targets"] = {true, [&o](absl::string_view v) -> absl::Status {
                           auto modules = ParseLoraTargets("--lora-targets", v);
                           if (!modules.ok()) return modules.status();
                           o.training.lora_target_modules = *std::move(modules);
                           return absl::OkStatus();
                         }};
  for (const char* flag : {"--safety-margin", "--margin"}) {  // --margin: the old spelling
    t[flag] = {true, [&o, flag](absl::string_view v) -> absl::Status {
                 auto margin = ParseSafetyMarginFlag(flag, v);
                 if (!margin.ok()) return margin.status();
                 o.safety_margin = *margin;
                 return absl::OkStatus();
               }};
  }
  t["--chunk-mib"] = {true, [&o](absl::string_view v) -> absl::Status {
                        auto mib = ParseInt("--chunk-mib", v, 1, 1 << 20);
                        if (!mib.ok()) return mib.status();
                        o.fixed.chunk_bytes = *mib << 20;
                        return absl::OkStatus();
                      }};
  t["--n-persist"] = OptionalIntFlag("--n-persist", &o.fixed.n_persist, 0, 1 << 20);
  t["--n-buffer"] = OptionalIntFlag("--n-buffer", &o.fixed.n_buffer, 0, 1 << 20);
  t["--n-swap"] = OptionalIntFlag("--n-swap", &o.fixed.n_swap, 0, kMaxLayers);
  t["--n-ckpt"] = OptionalIntFlag("--n-ckpt", &o.fixed.n_checkpoint, 0, kMaxLayers);
  t["--n-hs-offload"] = OptionalIntFlag("--n-hs-offload", &o.fixed.n_hs_offload, 0, kMaxLayers);
  t["--host-memory"] = {
      true, [&o](absl::string_view v) -> absl::Status {
        if (v == "pinned") {
          o.fixed.host_memory = HostMemoryKind::kPinned;
        } else if (v == "pageable") {
          o.fixed.host_memory = HostMemoryKind::kPageable;
        } else {
          return FlagError("--host-memory",
                           absl::StrCat("expected pinned or pageable, got '", std::string(v), "'"));
        }
        return absl::OkStatus();
      }};
  t["--persistent-state"] =
      ChoiceFlag("--persistent-state", &o.fixed.shard_persistent_state, "sharded", "replicated");
  t["--persistent-params"] =
      ChoiceFlag("--persistent-params", &o.fixed.shard_persistent_params, "sharded", "replicated");
  t["--max-alternatives"] = OptionalIntFlag("--max-alternatives", &o.max_alternatives, 1, 32);
  t["--skip-limits"] = SwitchFlag(&o.skip_limits);
  return t;
}

FlagTable MeasureFlags(Measurement& m) {
  FlagTable t;
  t["--plan-id"] = StringFlag(&m.plan_id);
  t["--peak-allocated"] = BytesFlag("--peak-allocated", &m.peak_allocated_bytes);
  t["--peak-reserved"] = BytesFlag("--peak-reserved", &m.peak_reserved_bytes);
  t["--peak-device"] = BytesFlag("--peak-device", &m.peak_device_bytes);
  t["--load-peak"] = BytesFlag("--load-peak", &m.load_peak_bytes);
  t["--step-seconds"] = {true, [&m](absl::string_view v) -> absl::Status {
                           auto seconds = ParseDouble("--step-seconds", v, 0, 1e6);
                           if (!seconds.ok()) return seconds.status();
                           m.step_seconds = *seconds;
                           return absl::OkStatus();
                         }};
  t["--oom"] = SwitchFlag(&m.oom);
  t["--note"] = StringFlag(&m.note);
  return t;
}

FlagTable CalibrationFlags(CalibrationOptions& c) {
  FlagTable t;
  t["--hardware"] = StringFlag(&c.hardware_name);
  t["--family"] = StringFlag(&c.model_family);
  t["--dtype"] = {true, [&c](absl::string_view v) -> absl::Status {
                    auto dtype = ParseDTypeFlag("--dtype", v);
                    if (!dtype.ok()) return dtype.status();
                    c.param_dtype = *dtype;
                    return absl::OkStatus();
                  }};
  return t;
}

FlagTable PlansListFlags(PlansListOptions& p) {
  FlagTable t;
  t["--page-size"] = IntFlag("--page-size", &p.page_size, 1, 1000);
  t["--page-token"] = StringFlag(&p.page_token);
  t["--all"] = SwitchFlag(&p.all_pages);
  return t;
}

FlagTable PresetsFlags(PresetsFilter& f) {
  FlagTable t;
  t["--models"] = {false, [&f](absl::string_view) {
                     f = PresetsFilter::kModels;
                     return absl::OkStatus();
                   }};
  t["--hardware"] = {false, [&f](absl::string_view) {
                       f = PresetsFilter::kHardware;
                       return absl::OkStatus();
                     }};
  return t;
}

FlagTable GlobalFlags(GlobalOptions& g) {
  FlagTable t;
  t["--planner"] = {true, [&g](absl::string_view v) -> absl::Status {
                      if (v.empty()) return FlagError("--planner", "expected HOST:PORT");
                      g.planner_address = std::string(v);
                      return absl::OkStatus();
                    }};
  t["--json"] = SwitchFlag(&g.json);
  t["--timeout"] = {true, [&g](absl::string_view v) -> absl::Status {
                      auto seconds = ParseDouble("--timeout", v, 0.001, 3600);
                      if (!seconds.ok()) return seconds.status();
                      g.timeout_seconds = *seconds;
                      return absl::OkStatus();
                    }};
  for (const std::string& name : ChannelSecurityFlagNames()) {
    t[name] = {true, [&g, name](absl::string_view v) -> absl::Status {
                 return SetChannelSecurityFlag(name, v, &g.security).status();
               }};
  }
  return t;
}

bool IsHelp(absl::string_view arg) { return arg == "--help" || arg == "-h"; }
bool IsFlag(absl::string_view arg) { return arg.size() > 1 && arg[0] == '-'; }

// Splits "--name=value" into name and value; `has_value` says whether '=' was present.
std::pair<std::string, std::optional<std::string>> SplitFlag(absl::string_view arg) {
  const size_t eq = arg.find('=');
  if (eq == absl::string_view::npos) return {std::string(arg), std::nullopt};
  return {std::string(arg.substr(0, eq)), std::string(arg.substr(eq + 1))};
}

// The command words and what follows them.
struct CommandWords {
  Command command = Command::kNone;
  std::string name;  // "plan", "trace submit", ... for messages
  // Positional arguments the command takes after its words (id or file).
  int positionals = 0;
  std::string positional_name;  // "PLAN_ID", "FILE", ...
};

absl::StatusOr<CommandWords> ResolveCommand(const std::vector<std::string>& words) {
  auto sub = [&](const std::string& group,
                 std::initializer_list<std::pair<const char*, CommandWords>> choices)
      -> absl::StatusOr<CommandWords> {
    std::vector<std::string> names;
    for (const auto& [word, resolved] : choices) names.push_back(word);
    const std::string allowed = absl::StrJoin(names, ", ");
    if (words.size() < 2) {
      return absl::InvalidArgumentError(absl::StrCat(group, ": expected a subcommand: ", allowed));
    }
    for (const auto& [word, resolved] : choices) {
      if (words[1] == word) return resolved;
    }
    return absl::InvalidArgumentError(
        absl::StrCat(group, ": unknown subcommand '", words[1], "'; expected one of: ", allowed));
  };
  const std::string& first = words[0];
  if (first == "plan") return CommandWords{Command::kPlan, "plan", 0, ""};
  if (first == "admit") return CommandWords{Command::kAdmit, "admit", 0, ""};
  if (first == "measure") return CommandWords{Command::kMeasure, "measure", 0, ""};
  if (first == "calibration") return CommandWords{Command::kCalibration, "calibration", 0, ""};
  if (first == "presets") return CommandWords{Command::kPresets, "presets", 0, ""};
  if (first == "trace") {
    return sub("trace", {{"submit", {Command::kTraceSubmit, "trace submit", 1, "FILE"}},
                         {"get", {Command::kTraceGet, "trace get", 1, "TRACE_ID"}}});
  }
  if (first == "hardware") {
    return sub("hardware", {{"submit", {Command::kHardwareSubmit, "hardware submit", 1, "FILE"}},
                            {"list", {Command::kHardwareList, "hardware list", 0, ""}},
                            {"get", {Command::kHardwareGet, "hardware get", 1, "PROFILE_ID"}}});
  }
  if (first == "plans") {
    return sub("plans", {{"list", {Command::kPlansList, "plans list", 0, ""}},
                         {"get", {Command::kPlansGet, "plans get", 1, "PLAN_ID"}}});
  }
  return absl::InvalidArgumentError(
      absl::StrCat("unknown command '", first, "'; commands: ", std::string(kCommandList)));
}

// How many leading words name the command ("plan" = 1, "trace get" = 2).
int CommandWordCount(Command command) {
  switch (command) {
    case Command::kNone:
      return 0;
    case Command::kPlan:
    case Command::kAdmit:
    case Command::kMeasure:
    case Command::kCalibration:
    case Command::kPresets:
      return 1;
    default:
      return 2;
  }
}

// Checks the cross-flag rules of `plan` that single flags cannot express.
// The rules `plan` and `admit` share: one model, workload with a trace, LoRA flags.
absl::Status CheckJob(const PlanOptions& o, absl::string_view command) {
  const int models = !o.arch_preset.empty() + !o.arch_file.empty() + !o.trace_id.empty();
  if (models != 1) {
    return absl::InvalidArgumentError(
        models == 0
            ? absl::StrCat(command,
                           ": the model is missing: give one of --arch PRESET, --arch-file "
                           "CONFIG_JSON or --trace-id ID")
            : absl::StrCat(command, ": --arch, --arch-file and --trace-id are mutually exclusive"));
  }
  // A profiled trace fixes batch and sequence length; a partial override cannot be completed
  // here (the trace's values are only known to the planner), so ask for both.
  if (!o.trace_id.empty() && HasWorkloadFlags(o) && !(o.micro_batch && o.seq_len)) {
    return FlagError(o.micro_batch ? "--seq" : "--batch",
                     "required with --trace-id when any workload flag is given (or give none "
                     "to use the trace's workload)");
  }
  if (o.training.kind == TrainingKind::kFull && !o.training.lora_target_modules.empty()) {
    return FlagError("--lora-targets", "needs --lora-rank");
  }
  if (o.qlora && o.training.kind == TrainingKind::kFull) {
    return FlagError("--qlora",
                     "needs --lora-rank and --lora-targets (QLoRA trains LoRA adapters on the 4-bit "
                     "base)");
  }
  if (o.training.kind != TrainingKind::kFull && o.training.lora_target_modules.empty()) {
    return FlagError("--lora-rank", "needs --lora-targets (e.g. q_proj,v_proj or all)");
  }
  return absl::OkStatus();
}

absl::Status CheckPlan(const PlanOptions& o) {
  if (absl::Status s = CheckJob(o, "plan"); !s.ok()) return s;
  const int hardware = !o.gpu_preset.empty() + !o.hardware_id.empty();
  if (hardware != 1) {
    return absl::InvalidArgumentError(
        hardware == 0 ? "plan: the hardware is missing: give --gpu PRESET or --hardware-id ID"
                      : "plan: --gpu and --hardware-id are mutually exclusive");
  }
  return absl::OkStatus();
}

absl::Status CheckAdmit(const CliInvocation& inv) {
  if (absl::Status s = CheckJob(inv.plan, "admit"); !s.ok()) return s;
  if (!inv.plan.gpu_preset.empty() || !inv.plan.hardware_id.empty()) {
    return absl::InvalidArgumentError(
        "admit: each --pool names its hardware; drop --gpu and --hardware-id");
  }
  if (inv.pools.empty()) {
    return FlagError("--pool", "give at least one NAME=HARDWARE[:GPUS]");
  }
  std::set<std::string> names;
  for (const PoolOption& pool : inv.pools) {
    if (!names.insert(pool.name).second) {
      return FlagError("--pool", absl::StrCat("the name '", pool.name, "' is used twice"));
    }
  }
  return absl::OkStatus();
}

// "NAME=HARDWARE[:GPUS]", HARDWARE a preset name or "profile/ID".
absl::StatusOr<PoolOption> ParsePool(absl::string_view text) {
  const auto bad = [&](absl::string_view why) {
    return FlagError("--pool", absl::StrCat("'", std::string(text), "': ", std::string(why),
                                            " (expected NAME=HARDWARE[:GPUS], HARDWARE a preset "
                                            "such as h100-80gb or profile/ID)"));
  };
  const size_t eq = text.find('=');
  if (eq == absl::string_view::npos || eq == 0) return bad("no NAME=");
  PoolOption pool;
  pool.name = std::string(text.substr(0, eq));
  absl::string_view hardware = text.substr(eq + 1);
  if (const size_t colon = hardware.rfind(':'); colon != absl::string_view::npos) {
    auto gpus = ParseInt("--pool GPUS", hardware.substr(colon + 1), 1, 1'000'000);
    if (!gpus.ok()) return gpus.status();
    pool.gpus = static_cast<int32_t>(*gpus);
    hardware = hardware.substr(0, colon);
  }
  if (hardware.empty()) return bad("no HARDWARE");
  if (absl::ConsumePrefix(&hardware, "profile/")) {
    if (hardware.empty()) return bad("no profile ID after profile/");
    pool.hardware_id = std::string(hardware);
  } else {
    pool.hardware_preset = std::string(hardware);
  }
  return pool;
}

absl::Status CheckMeasure(const Measurement& m) {
  if (m.plan_id.empty()) {
    return absl::InvalidArgumentError("measure: --plan-id is required");
  }
  if (m.peak_reserved_bytes == 0 && !m.oom) {
    return absl::InvalidArgumentError(
        "measure: --peak-reserved is required (the measured steady peak), unless --oom");
  }
  return absl::OkStatus();
}

}  // namespace

Workload PlanWorkload(const PlanOptions& o) {
  Workload w;
  w.micro_batch = o.micro_batch.value_or(kDefaultMicroBatch);
  w.seq_len = o.seq_len.value_or(kDefaultSeqLen);
  w.world_size = o.world_size.value_or(1);
  w.grad_accum = o.grad_accum.value_or(1);
  w.grad_clipping = o.grad_clipping;
  w.local_world_size = o.local_world_size.value_or(0);
  return w;
}

bool HasWorkloadFlags(const PlanOptions& o) {
  return o.micro_batch || o.seq_len || o.world_size || o.local_world_size || o.grad_accum ||
         o.grad_clipping;
}

absl::StatusOr<int64_t> ParseByteSize(absl::string_view text) {
  absl::string_view rest = absl::StripAsciiWhitespace(text);
  size_t digits = 0;
  while (digits < rest.size() &&
         (absl::ascii_isdigit(static_cast<unsigned char>(rest[digits])) || rest[digits] == '.')) {
    ++digits;
  }
  const absl::string_view number = rest.substr(0, digits);
  const std::string suffix = absl::AsciiStrToLower(absl::StripAsciiWhitespace(rest.substr(digits)));
  static const auto* const kUnits = new std::map<std::string, double>{
      {"", 1},         {"b", 1},      {"kib", 0x1p10}, {"mib", 0x1p20}, {"gib", 0x1p30},
      {"tib", 0x1p40}, {"kb", 1e3},   {"mb", 1e6},     {"gb", 1e9},     {"tb", 1e12},
      {"k", 0x1p10},   {"m", 0x1p20}, {"g", 0x1p30},   {"t", 0x1p40}};
  const auto unit = kUnits->find(suffix);
  double value = 0;
  if (number.empty() || unit == kUnits->end() || !absl::SimpleAtod(number, &value)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "expected a size like 4096, 512MiB, 71.5GiB or 80GB, got '", std::string(text), "'"));
  }
  const double bytes = std::round(value * unit->second);
  if (bytes > static_cast<double>(kMaxGpuMemoryBytes) * 1024) {
    return absl::InvalidArgumentError(
        absl::StrCat("size '", std::string(text), "' is absurdly large"));
  }
  return static_cast<int64_t>(bytes);
}

absl::StatusOr<CliInvocation> ParseCommandLine(const std::vector<std::string>& args) {
  CliInvocation inv;
  const FlagTable global_flags = GlobalFlags(inv.global);

  // Pass 1: find the command words, skipping global flags (and their values) wherever they are.
  // Command flags may only follow the command words, so a non-global flag ends the search.
  // --help anywhere wins over every other flag, valid or not.
  bool help = false;
  for (const std::string& arg : args) help |= IsHelp(arg);
  std::vector<std::string> words;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& arg = args[i];
    if (IsHelp(arg)) continue;
    if (IsFlag(arg)) {
      auto [name, value] = SplitFlag(arg);
      auto global = global_flags.find(name);
      if (global == global_flags.end()) break;
      if (global->second.takes_value && !value) ++i;
      continue;
    }
    words.push_back(arg);
    if (words.size() == 2) break;
  }
  if (words.empty()) {
    inv.help_text = HelpText(Command::kNone);
    if (help) return inv;
    // No command at all still prints the overview, but as a usage error (exit 2).
    bool has_flags = false;
    for (const std::string& arg : args) has_flags |= IsFlag(arg);
    if (!args.empty() && has_flags) {
      for (const std::string& arg : args) {
        if (IsFlag(arg) && !global_flags.contains(SplitFlag(arg).first)) {
          return absl::InvalidArgumentError(
              absl::StrCat("unknown flag '", SplitFlag(arg).first,
                           "' before the command; commands: ", std::string(kCommandList)));
        }
      }
    }
    return absl::InvalidArgumentError(
        absl::StrCat("no command given; commands: ", std::string(kCommandList)));
  }
  auto resolved = ResolveCommand(words);
  if (!resolved.ok()) {
    if (help) {
      // `memplan trace --help`: help for the group even without a subcommand word.
      const std::string& first = words[0];
      if (first == "trace") inv.help_text = HelpText(Command::kTraceSubmit);
      if (first == "hardware") inv.help_text = HelpText(Command::kHardwareList);
      if (first == "plans") inv.help_text = HelpText(Command::kPlansList);
      if (inv.help_text) return inv;
    }
    return resolved.status();
  }
  inv.command = resolved->command;
  if (help) {
    inv.help_text = HelpText(inv.command);
    return inv;
  }

  FlagTable flags;
  switch (inv.command) {
    case Command::kPlan:
      flags = PlanFlags(inv.plan);
      break;
    case Command::kAdmit:
      flags = PlanFlags(inv.plan);
      flags["--pool"] = {true, [&inv](absl::string_view v) -> absl::Status {
                           absl::StatusOr<PoolOption> pool = ParsePool(v);
                           if (!pool.ok()) return pool.status();
                           inv.pools.push_back(*std::move(pool));
                           return absl::OkStatus();
                         }};
      break;
    case Command::kMeasure:
      flags = MeasureFlags(inv.measure.measurement);
      break;
    case Command::kCalibration:
      flags = CalibrationFlags(inv.calibration);
      break;
    case Command::kPlansList:
      flags = PlansListFlags(inv.plans_list);
      break;
    case Command::kPresets:
      flags = PresetsFlags(inv.presets);
      break;
    default:
      break;
  }

  // Pass 2: every argument in order. Command words are skipped once; globals are re-applied.
  int words_to_skip = CommandWordCount(inv.command);
  std::vector<std::string> positionals;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& arg = args[i];
    if (!IsFlag(arg)) {
      if (words_to_skip > 0) {
        --words_to_skip;
      } else {
        positionals.push_back(arg);
      }
      continue;
    }
    auto [name, value] = SplitFlag(arg);
    const FlagSpec* spec = nullptr;
    if (auto it = flags.find(name); it != flags.end()) {
      spec = &it->second;
    } else if (auto g = global_flags.find(name); g != global_flags.end()) {
      spec = &g->second;
    } else {
      return absl::InvalidArgumentError(absl::StrCat(resolved->name, ": unknown flag '", name,
                                                     "'; see 'memplan ", resolved->name,
                                                     " --help'"));
    }
    if (words_to_skip > 0 && flags.contains(name)) {
      return absl::InvalidArgumentError(
          absl::StrCat(name, ": flags of '", resolved->name, "' go after the command"));
    }
    if (!spec->takes_value) {
      if (value) return FlagError(name, "takes no value");
      if (absl::Status s = spec->apply(""); !s.ok()) return s;
      continue;
    }
    if (!value) {
      if (i + 1 >= args.size()) return FlagError(name, "missing value");
      value = args[++i];
    }
    if (absl::Status s = spec->apply(*value); !s.ok()) return s;
  }

  if (static_cast<int>(positionals.size()) > resolved->positionals) {
    return absl::InvalidArgumentError(absl::StrCat(resolved->name, ": unexpected argument '",
                                                   positionals[resolved->positionals], "'"));
  }
  if (static_cast<int>(positionals.size()) < resolved->positionals) {
    return absl::InvalidArgumentError(
        absl::StrCat(resolved->name, ": missing ", resolved->positional_name));
  }
  switch (inv.command) {
    case Command::kTraceGet:
    case Command::kHardwareGet:
    case Command::kPlansGet:
      inv.id = positionals[0];
      break;
    case Command::kTraceSubmit:
    case Command::kHardwareSubmit:
      inv.file_path = positionals[0];
      break;
    case Command::kPlan:
      if (absl::Status s = CheckPlan(inv.plan); !s.ok()) return s;
      break;
    case Command::kAdmit:
      if (absl::Status s = CheckAdmit(inv); !s.ok()) return s;
      break;
    case Command::kMeasure:
      if (absl::Status s = CheckMeasure(inv.measure.measurement); !s.ok()) return s;
      break;
    default:
      break;
  }
  if (absl::Status s = ValidateChannelSecurity(inv.global.security); !s.ok()) return s;
  return inv;
}

}  // namespace memplan::cli
