#include "planner/cli/cli_args.h"

#include <cmath>
#include <map>
#include <set>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "common/flags.h"
#include "common/lora_shapes.h"
#include "common/request_flags.h"
#include "common/validate.h"

namespace memplan::cli {
namespace {

constexpr absl::string_view kCommandList =
    "plan, admit, trace submit|get, hardware submit|list|get, measure, calibration, plans "
    "list|get, presets, env";

// The measured figures of `measure`: sizes as ParseByteSize reads them, in the request's range.
void AddBytesFlag(FlagSet* flags, absl::string_view name, int64_t* out) {
  flags->Custom(name, [out](absl::string_view v) -> absl::Status {
    absl::StatusOr<int64_t> bytes = ParseByteSize(v);
    if (!bytes.ok()) return bytes.status();
    if (*bytes > kMaxMeasuredBytes) {
      return absl::InvalidArgumentError(
          absl::StrCat(*bytes, " is outside ", RangeText(0, kMaxMeasuredBytes)));
    }
    *out = *bytes;
    return absl::OkStatus();
  });
}

void AddPlanFlags(FlagSet* flags, PlanOptions* o) {
  flags->String("--arch", &o->arch_preset)
      .String("--arch-file", &o->arch_file)
      .String("--trace-id", &o->trace_id)
      .String("--gpu", &o->gpu_preset)
      .String("--hardware-id", &o->hardware_id)
      .Int(kBatchFlag, &o->micro_batch)
      .Int(kSeqFlag, &o->seq_len)
      .Int("--world-size", &o->world_size, 1, kMaxWorldSize)
      .Int(kGradAccumFlag, &o->grad_accum)
      .Switch("--grad-clipping", &o->grad_clipping)
      .Int("--images-per-sample", &o->images_per_sample, 1, kMaxImagesPerSample)
      .Switch("--vision-checkpoint", &o->vision_checkpoint)
      .Custom("--image-size", [o](absl::string_view v) -> absl::Status {
        // HEIGHTxWIDTH in pixels, each side in ValidateWorkload's [1, 65536].
        const std::vector<absl::string_view> sides = absl::StrSplit(v, absl::ByAnyChar("xX"));
        int64_t height = 0, width = 0;
        if (sides.size() != 2 || !absl::SimpleAtoi(sides[0], &height) ||
            !absl::SimpleAtoi(sides[1], &width) || height < 1 || width < 1 || height > 65536 ||
            width > 65536) {
          return absl::InvalidArgumentError(absl::StrCat(
              "\"", v, "\": expected HEIGHTxWIDTH in pixels, each in [1, 65536], e.g. 448x448"));
        }
        o->image_height = height;
        o->image_width = width;
        return absl::OkStatus();
      });
  AddNodeFlags(flags, &o->local_world_size, &o->host_memory_bytes);
  AddDTypeFlag(flags, "--dtype", &o->param_dtype);
  AddOptimizerFlag(flags, &o->optimizer);
  flags
      ->Custom(kLoraRankFlag.name,
               [o](absl::string_view v) -> absl::Status {
                 absl::StatusOr<int64_t> rank =
                     ParseIntValue(v, kLoraRankFlag.lo, kLoraRankFlag.hi);
                 if (!rank.ok()) return rank.status();
                 o->training.kind = o->qlora ? TrainingKind::kQlora : TrainingKind::kLora;
                 o->training.lora_rank = *rank;
                 return absl::OkStatus();
               })
      .CustomSwitch("--qlora", [o] {
        o->qlora = true;
        if (o->training.kind != TrainingKind::kFull) o->training.kind = TrainingKind::kQlora;
      });
  AddLoraTargetsFlag(flags, &o->training.lora_target_modules);
  // [OSFT plans] (planner/core/osft_plan.h): what `memplan-agent train --osft-rank-ratio` runs.
  flags->Custom("--osft-rank-ratio", [o](absl::string_view v) -> absl::Status {
    absl::StatusOr<double> ratio = ParseDoubleValue(v, DoubleRange{0, 1, true, true});
    if (!ratio.ok()) return ratio.status();
    o->training.kind = TrainingKind::kOsft;
    o->training.osft_rank_ratio = *ratio;
    return absl::OkStatus();
  });
  flags->List("--osft-targets", &o->training.osft_target_modules, kLoraModules, "all");
  flags->Double(kSafetyMarginFlag, &o->safety_margin)
      .Alias("--margin", kSafetyMarginFlag.name);  // --margin: the old spelling
  AddFixedKnobFlags(flags, &o->fixed);
  flags->Int("--max-alternatives", &o->max_alternatives, 1, kMaxAlternatives)
      .Switch("--skip-limits", &o->skip_limits);
}

void AddMeasureFlags(FlagSet* flags, Measurement* m) {
  flags->String("--plan-id", &m->plan_id);
  AddBytesFlag(flags, "--peak-allocated", &m->peak_allocated_bytes);
  AddBytesFlag(flags, "--peak-reserved", &m->peak_reserved_bytes);
  AddBytesFlag(flags, "--peak-device", &m->peak_device_bytes);
  AddBytesFlag(flags, "--load-peak", &m->load_peak_bytes);
  flags->Double("--step-seconds", &m->step_seconds, 0, kMaxStepSeconds)
      .Switch("--oom", &m->oom)
      .String("--note", &m->note);
}

void AddCalibrationFlags(FlagSet* flags, CalibrationOptions* c) {
  flags->String("--hardware", &c->hardware_name).String("--family", &c->model_family);
  AddDTypeFlag(flags, "--dtype", &c->param_dtype);
}

void AddPlansListFlags(FlagSet* flags, PlansListOptions* p) {
  flags->Int("--page-size", &p->page_size, 1, kMaxListPlansPageSize)
      .String("--page-token", &p->page_token)
      .Switch("--all", &p->all_pages);
}

void AddPresetsFlags(FlagSet* flags, PresetsFilter* f) {
  flags->CustomSwitch("--models", [f] { *f = PresetsFilter::kModels; })
      .CustomSwitch("--hardware", [f] { *f = PresetsFilter::kHardware; });
}

void AddGlobalFlags(FlagSet* flags, GlobalOptions* g) {
  flags
      ->Custom("--planner",
               [g](absl::string_view v) -> absl::Status {
                 if (v.empty()) return absl::InvalidArgumentError("expected HOST:PORT");
                 g->planner_address = std::string(v);
                 g->planner_given = true;
                 return absl::OkStatus();
               })
      .Custom("--db",
              [g](absl::string_view v) -> absl::Status {
                if (v.empty()) return absl::InvalidArgumentError("must not be empty");
                g->db_path = std::string(v);
                return absl::OkStatus();
              })
      .Switch("--json", &g->json)
      .Double("--timeout", &g->timeout_seconds, 0.001, 3600);
  AddChannelSecurityFlags(flags, &g->security);
}

bool IsHelp(absl::string_view arg) { return arg == "--help" || arg == "-h"; }

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
  if (first == "env") return CommandWords{Command::kEnv, "env", 0, ""};
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
    case Command::kEnv:
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
  // The node's GPUs are among the job's (a trace's world size is checked by the planner).
  if (o.local_world_size && (o.trace_id.empty() || o.world_size) &&
      *o.local_world_size > o.world_size.value_or(1)) {
    return FlagError(kGpusPerNodeFlag.name,
                     absl::StrCat(*o.local_world_size, " is more than --world-size ",
                                  o.world_size.value_or(1),
                                  " (the ranks of one node are among the job's ranks)"));
  }
  if (o.images_per_sample.has_value() != (o.image_height > 0)) {
    return FlagError(o.images_per_sample ? "--images-per-sample" : "--image-size",
                     "--images-per-sample N and --image-size HEIGHTxWIDTH go together");
  }
  if (o.vision_checkpoint && !o.images_per_sample.has_value()) {
    return FlagError("--vision-checkpoint",
                     "needs --images-per-sample (a vision-language model's tower)");
  }
  if (o.training.osft_rank_ratio > 0 && o.training.lora_rank > 0) {
    return FlagError("--osft-rank-ratio",
                     "and --lora-rank are exclusive (the agent does not run LoRA with OSFT)");
  }
  if (o.training.kind != TrainingKind::kOsft && !o.training.osft_target_modules.empty()) {
    return FlagError("--osft-targets", "needs --osft-rank-ratio");
  }
  if (o.training.kind == TrainingKind::kOsft) {
    if (!o.training.lora_target_modules.empty() || o.qlora) {
      return FlagError(o.qlora ? "--qlora" : "--lora-targets",
                       "does not apply to OSFT (--osft-targets chooses its projections)");
    }
    return absl::OkStatus();
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

// "NAME=HARDWARE[:GPUS]", HARDWARE a preset name or "profile/ID". Errors are the problem alone
// (the FlagSet names --pool).
absl::StatusOr<PoolOption> ParsePool(absl::string_view text) {
  const auto bad = [&](absl::string_view why) {
    return absl::InvalidArgumentError(
        absl::StrCat(Quote(text), ": ", why,
                     " (expected NAME=HARDWARE[:GPUS], HARDWARE a preset such as h100-80gb or "
                     "profile/ID)"));
  };
  const size_t eq = text.find('=');
  if (eq == absl::string_view::npos || eq == 0) return bad("no NAME=");
  PoolOption pool;
  pool.name = std::string(text.substr(0, eq));
  absl::string_view hardware = text.substr(eq + 1);
  if (const size_t colon = hardware.rfind(':'); colon != absl::string_view::npos) {
    absl::StatusOr<int64_t> gpus = ParseIntValue(hardware.substr(colon + 1), 1, kMaxPoolGpus);
    if (!gpus.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat(Quote(text), ": GPUS ", gpus.status().message()));
    }
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
  w.images_per_sample = o.images_per_sample.value_or(0);
  w.image_height = o.image_height;
  w.image_width = o.image_width;
  w.vision_checkpoint = o.vision_checkpoint;
  return w;
}

bool HasWorkloadFlags(const PlanOptions& o) {
  return o.micro_batch || o.seq_len || o.world_size || o.local_world_size || o.grad_accum ||
         o.grad_clipping || o.images_per_sample;
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
    return absl::InvalidArgumentError(
        absl::StrCat(Quote(text), " is not a size like 4096, 512MiB, 71.5GiB or 80GB"));
  }
  const double bytes = std::round(value * unit->second);
  if (bytes > static_cast<double>(kMaxGpuMemoryBytes) * 1024) {
    return absl::InvalidArgumentError(absl::StrCat(Quote(text), " is absurdly large"));
  }
  return static_cast<int64_t>(bytes);
}

absl::StatusOr<CliInvocation> ParseCommandLine(const std::vector<std::string>& args) {
  CliInvocation inv;
  FlagSet global_flags;
  AddGlobalFlags(&global_flags, &inv.global);

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
      const SplitArg flag = SplitFlag(arg);
      if (!global_flags.Has(flag.name)) break;
      if (global_flags.TakesValue(flag.name) && !flag.value) ++i;
      continue;
    }
    words.push_back(arg);
    if (words.size() == 2) break;
  }
  if (words.empty()) {
    inv.help_text = HelpText(Command::kNone);
    if (help) return inv;
    // No command at all still prints the overview, but as a usage error (exit 2).
    for (const std::string& arg : args) {
      if (IsFlag(arg) && !global_flags.Has(SplitFlag(arg).name)) {
        return absl::InvalidArgumentError(
            absl::StrCat("unknown flag ", SplitFlag(arg).name,
                         " before the command; commands: ", std::string(kCommandList)));
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

  // The command's flags, and the global ones again (they may follow the command too).
  FlagSet flags(absl::StrCat("see 'memplan ", resolved->name, " --help'"));
  switch (inv.command) {
    case Command::kPlan:
      AddPlanFlags(&flags, &inv.plan);
      break;
    case Command::kAdmit:
      AddPlanFlags(&flags, &inv.plan);
      flags.Custom("--pool", [&inv](absl::string_view v) -> absl::Status {
        absl::StatusOr<PoolOption> pool = ParsePool(v);
        if (!pool.ok()) return pool.status();
        inv.pools.push_back(*std::move(pool));
        return absl::OkStatus();
      });
      break;
    case Command::kMeasure:
      AddMeasureFlags(&flags, &inv.measure.measurement);
      break;
    case Command::kCalibration:
      AddCalibrationFlags(&flags, &inv.calibration);
      break;
    case Command::kPlansList:
      AddPlansListFlags(&flags, &inv.plans_list);
      break;
    case Command::kPresets:
      AddPresetsFlags(&flags, &inv.presets);
      break;
    default:
      break;
  }
  AddGlobalFlags(&flags, &inv.global);

  // Pass 2: every argument in order. Command words are skipped once.
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
    const std::string name = SplitFlag(arg).name;
    if (!flags.Has(name)) return flags.UnknownFlag(name);
    if (words_to_skip > 0 && !global_flags.Has(name)) {
      return FlagError(name, absl::StrCat("flags of '", resolved->name, "' go after the command"));
    }
    if (absl::Status s = flags.ApplyAt(args, &i); !s.ok()) return s;
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
  if (inv.global.db_path && !AnswersInProcess(inv) && inv.command != Command::kEnv) {
    return FlagError("--db", "is read by in-process answers only (plan, admit, presets and "
                             "hardware list, without --planner, --tls-ca or --auth-token-file) "
                             "and reported by env; a planner daemon reads its own database");
  }
  return inv;
}

bool AnswersInProcess(const CliInvocation& inv) {
  // TLS or a token asks for a connection: to the default address when --planner is not given.
  if (inv.global.planner_given || !inv.global.security.tls_ca_file.empty() ||
      !inv.global.security.auth_token_file.empty()) {
    return false;
  }
  switch (inv.command) {
    case Command::kPlan:
    case Command::kAdmit:
    case Command::kPresets:
    case Command::kHardwareList:
      return true;
    default:
      return false;
  }
}

}  // namespace memplan::cli
