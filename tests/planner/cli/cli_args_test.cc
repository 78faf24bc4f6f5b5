#include "planner/cli/cli_args.h"

#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace memplan::cli {
namespace {

using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

absl::StatusOr<CliInvocation> Parse(std::vector<std::string> args) {
  return ParseCommandLine(args);
}

// The error message of a command line that must fail with INVALID_ARGUMENT.
std::string ErrorOf(std::vector<std::string> args) {
  auto inv = Parse(std::move(args));
  if (inv.ok()) return "<parsed>";
  EXPECT_EQ(inv.status().code(), absl::StatusCode::kInvalidArgument);
  return std::string(inv.status().message());
}

TEST(CliArgsTest, PlanWithEveryFlag) {
  auto inv = Parse({"plan",
                    "--arch",
                    "llama-3.1-8b",
                    "--gpu=h100-80gb",
                    "--batch",
                    "2",
                    "--seq",
                    "8192",
                    "--world-size",
                    "4",
                    "--local-world-size",
                    "2",
                    "--grad-accum",
                    "8",
                    "--dtype",
                    "fp16",
                    "--optimizer",
                    "adamw_bf16",
                    "--lora-rank",
                    "16",
                    "--lora-targets",
                    "q_proj,v_proj",
                    "--margin",
                    "0.1",
                    "--chunk-mib",
                    "64",
                    "--n-persist",
                    "3",
                    "--n-buffer",
                    "2",
                    "--n-swap",
                    "0",
                    "--n-ckpt",
                    "12",
                    "--n-hs-offload",
                    "4",
                    "--host-memory",
                    "pageable",
                    "--max-alternatives",
                    "3",
                    "--skip-limits"});
  ASSERT_TRUE(inv.ok()) << inv.status();
  EXPECT_EQ(inv->command, Command::kPlan);
  const PlanOptions& p = inv->plan;
  EXPECT_EQ(p.arch_preset, "llama-3.1-8b");
  EXPECT_EQ(p.gpu_preset, "h100-80gb");
  EXPECT_EQ(p.micro_batch, 2);
  EXPECT_EQ(p.seq_len, 8192);
  EXPECT_EQ(p.world_size, 4);
  EXPECT_EQ(p.local_world_size, 2);
  EXPECT_EQ(PlanWorkload(p).local_world_size, 2);
  EXPECT_EQ(p.grad_accum, 8);
  EXPECT_EQ(p.param_dtype, DType::kFloat16);
  EXPECT_EQ(p.optimizer, "adamw_bf16");
  EXPECT_EQ(p.training.kind, TrainingKind::kLora);
  EXPECT_EQ(p.training.lora_rank, 16);
  EXPECT_THAT(p.training.lora_target_modules, ElementsAre("q_proj", "v_proj"));
  EXPECT_EQ(p.safety_margin, 0.1);
  EXPECT_EQ(p.fixed.chunk_bytes, int64_t{64} << 20);
  EXPECT_EQ(p.fixed.n_persist, 3);
  EXPECT_EQ(p.fixed.n_buffer, 2);
  EXPECT_EQ(p.fixed.n_swap, 0);  // an explicit 0 is a constraint, not "unset"
  EXPECT_EQ(p.fixed.n_checkpoint, 12);
  EXPECT_EQ(p.fixed.n_hs_offload, 4);
  EXPECT_EQ(p.fixed.host_memory, HostMemoryKind::kPageable);
  EXPECT_EQ(p.max_alternatives, 3);
  EXPECT_TRUE(p.skip_limits);
}

TEST(CliArgsTest, PlanDefaultsLeaveKnobsFreeAndGlobalsDefault) {
  auto inv = Parse({"plan", "--arch", "mistral-7b", "--gpu", "rtx-4090"});
  ASSERT_TRUE(inv.ok()) << inv.status();
  const PlanOptions& p = inv->plan;
  EXPECT_FALSE(HasWorkloadFlags(p));
  const Workload w = PlanWorkload(p);
  EXPECT_EQ(w.micro_batch, 1);
  EXPECT_EQ(w.seq_len, 4096);
  EXPECT_EQ(w.world_size, 1);
  EXPECT_EQ(w.grad_accum, 1);
  EXPECT_FALSE(p.param_dtype.has_value());
  EXPECT_EQ(p.optimizer, "adamw");
  EXPECT_EQ(p.training.kind, TrainingKind::kFull);
  EXPECT_FALSE(p.safety_margin.has_value());
  EXPECT_FALSE(p.fixed.chunk_bytes || p.fixed.n_persist || p.fixed.n_buffer || p.fixed.n_swap ||
               p.fixed.n_checkpoint || p.fixed.n_hs_offload || p.fixed.host_memory);
  EXPECT_EQ(inv->global.planner_address, "127.0.0.1:50051");
  EXPECT_FALSE(inv->global.json);
}

// Without --planner, plan, admit and presets answer in-process; --planner, TLS or a token ask
// for a connection; the other commands always need a daemon.
TEST(CliArgsTest, InProcessWithoutPlanner) {
  const auto in_process = [](std::vector<std::string> args) {
    auto inv = Parse(args);
    EXPECT_TRUE(inv.ok()) << inv.status();
    return inv.ok() && AnswersInProcess(*inv);
  };
  EXPECT_TRUE(in_process({"plan", "--arch", "llama-3.1-8b", "--gpu", "h100-80gb"}));
  EXPECT_TRUE(in_process({"presets"}));
  EXPECT_TRUE(in_process({"hardware", "list"}));
  EXPECT_TRUE(in_process({"admit", "--arch", "llama-3.1-8b", "--pool", "a=h100-80gb"}));
  EXPECT_FALSE(in_process({"--planner", "127.0.0.1:50051", "presets"}));
  EXPECT_FALSE(in_process({"presets", "--planner=h:1"}));
  EXPECT_FALSE(in_process({"--tls-ca", "ca.crt", "presets"}));
  EXPECT_FALSE(in_process({"--auth-token-file", "tok", "presets"}));
  EXPECT_FALSE(in_process({"plans", "list"}));
  EXPECT_FALSE(in_process({"measure", "--plan-id", "p", "--peak-reserved", "1GiB"}));

  auto db = Parse({"--db", "/var/lib/memplan/planner.db", "presets"});
  ASSERT_TRUE(db.ok()) << db.status();
  EXPECT_EQ(db->global.db_path, "/var/lib/memplan/planner.db");
  EXPECT_THAT(ErrorOf({"--db", "x.db", "--planner", "h:1", "presets"}),
              HasSubstr("--db: is read by in-process answers only"));
  EXPECT_THAT(ErrorOf({"--db", "x.db", "plans", "list"}),
              HasSubstr("--db: is read by in-process answers only"));
  EXPECT_THAT(ErrorOf({"presets", "--db="}), HasSubstr("--db: must not be empty"));
}

TEST(CliArgsTest, GlobalFlagsGoAnywhere) {
  auto before = Parse({"--planner", "10.0.0.5:7000", "--json", "plan", "--arch-file",
                       "/models/x/config.json", "--hardware-id", "hw-1"});
  ASSERT_TRUE(before.ok()) << before.status();
  EXPECT_EQ(before->global.planner_address, "10.0.0.5:7000");
  EXPECT_TRUE(before->global.json);
  EXPECT_EQ(before->plan.arch_file, "/models/x/config.json");
  EXPECT_EQ(before->plan.hardware_id, "hw-1");

  auto after = Parse({"plans", "get", "plan-0a1b", "--planner=h:1", "--timeout", "2.5"});
  ASSERT_TRUE(after.ok()) << after.status();
  EXPECT_EQ(after->command, Command::kPlansGet);
  EXPECT_EQ(after->id, "plan-0a1b");
  EXPECT_EQ(after->global.planner_address, "h:1");
  EXPECT_EQ(after->global.timeout_seconds, 2.5);
}

TEST(CliArgsTest, SecurityFlagsAreGlobal) {
  auto parsed = Parse({"--tls-ca", "ca.crt", "plans", "list", "--tls-cert=c.crt", "--tls-key",
                       "c.key", "--tls-server-name=planner.internal", "--auth-token-file", "tok"});
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(parsed->global.security.tls_ca_file, "ca.crt");
  EXPECT_EQ(parsed->global.security.tls_cert_file, "c.crt");
  EXPECT_EQ(parsed->global.security.tls_key_file, "c.key");
  EXPECT_EQ(parsed->global.security.tls_server_name, "planner.internal");
  EXPECT_EQ(parsed->global.security.auth_token_file, "tok");
  // A token alone is fine (plaintext on loopback); a client certificate needs the CA.
  EXPECT_TRUE(Parse({"--auth-token-file=tok", "presets"}).ok());
  EXPECT_THAT(ErrorOf({"--tls-cert=c.crt", "--tls-key=c.key", "presets"}),
              HasSubstr("need --tls-ca"));
  EXPECT_THAT(ErrorOf({"--tls-ca=ca.crt", "--tls-key=c.key", "presets"}),
              HasSubstr("--tls-cert and --tls-key go together"));
  EXPECT_THAT(ErrorOf({"presets", "--tls-ca="}), HasSubstr("--tls-ca: must not be empty"));
}

TEST(CliArgsTest, AdmitTakesTheJobAndPools) {
  auto parsed =
      Parse({"admit", "--arch", "llama-3.1-8b", "--batch", "2", "--world-size", "4", "--pool",
             "a=h100-80gb:8", "--pool=b=rtx-4090", "--pool", "lab=profile/hw-0a1b:2"});
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(parsed->command, Command::kAdmit);
  EXPECT_EQ(parsed->plan.arch_preset, "llama-3.1-8b");
  EXPECT_EQ(parsed->plan.world_size, 4);
  ASSERT_EQ(parsed->pools.size(), 3u);
  EXPECT_EQ(parsed->pools[0].name, "a");
  EXPECT_EQ(parsed->pools[0].hardware_preset, "h100-80gb");
  EXPECT_EQ(parsed->pools[0].gpus, 8);
  EXPECT_EQ(parsed->pools[1].hardware_preset, "rtx-4090");
  EXPECT_EQ(parsed->pools[1].gpus, 1);
  EXPECT_EQ(parsed->pools[2].hardware_id, "hw-0a1b");
  EXPECT_EQ(parsed->pools[2].gpus, 2);

  EXPECT_THAT(ErrorOf({"admit", "--arch", "llama-3.1-8b"}), HasSubstr("--pool: give at least"));
  EXPECT_THAT(ErrorOf({"admit", "--pool", "a=h100-80gb"}),
              HasSubstr("admit: the model is missing"));
  EXPECT_THAT(ErrorOf({"admit", "--arch", "x", "--gpu", "h100-80gb", "--pool", "a=h100-80gb"}),
              HasSubstr("drop --gpu and --hardware-id"));
  EXPECT_THAT(ErrorOf({"admit", "--arch", "x", "--pool", "h100-80gb"}),
              HasSubstr("expected NAME=HARDWARE[:GPUS]"));
  EXPECT_THAT(ErrorOf({"admit", "--arch", "x", "--pool", "a=h100-80gb:0"}),
              HasSubstr("--pool: \"a=h100-80gb:0\": GPUS 0 is outside [1, 1000000]"));
  EXPECT_THAT(ErrorOf({"admit", "--arch", "x", "--pool", "a=h100-80gb", "--pool", "a=l40s"}),
              HasSubstr("the name 'a' is used twice"));
  EXPECT_THAT(ErrorOf({"admit", "--arch", "x", "--pool", "a=profile/"}),
              HasSubstr("no profile ID"));
  auto help = Parse({"admit", "--help"});
  ASSERT_TRUE(help.ok());
  EXPECT_THAT(*help->help_text, HasSubstr("--pool NAME=HARDWARE[:GPUS]"));
}

TEST(CliArgsTest, EverySubcommandParses) {
  struct Case {
    std::vector<std::string> args;
    Command command;
  };
  const std::vector<Case> cases = {
      {{"trace", "submit", "trace.json"}, Command::kTraceSubmit},
      {{"trace", "get", "trace-1"}, Command::kTraceGet},
      {{"hardware", "submit", "-"}, Command::kHardwareSubmit},
      {{"hardware", "list"}, Command::kHardwareList},
      {{"hardware", "get", "hw-1"}, Command::kHardwareGet},
      {{"measure", "--plan-id", "p", "--peak-reserved", "70GiB"}, Command::kMeasure},
      {{"calibration"}, Command::kCalibration},
      {{"plans", "list"}, Command::kPlansList},
      {{"plans", "get", "p"}, Command::kPlansGet},
      {{"presets"}, Command::kPresets},
      {{"env"}, Command::kEnv},
      {{"--json", "env", "--db", "other.db"}, Command::kEnv},
  };
  for (const Case& c : cases) {
    auto inv = Parse(c.args);
    ASSERT_TRUE(inv.ok()) << c.args[0] << ": " << inv.status();
    EXPECT_EQ(inv->command, c.command) << c.args[0];
    EXPECT_FALSE(inv->help_text.has_value());
  }
  EXPECT_EQ(Parse({"trace", "submit", "-"})->file_path, "-");
  EXPECT_EQ(Parse({"hardware", "get", "hw-9"})->id, "hw-9");
  // env reports on the database --db names and asks a daemon only with --planner.
  auto env = Parse({"env", "--planner", "h:1", "--db", "x.db"});
  ASSERT_TRUE(env.ok()) << env.status();
  EXPECT_FALSE(AnswersInProcess(*env));
  EXPECT_EQ(env->global.db_path, "x.db");
  EXPECT_THAT(ErrorOf({"env", "--batch", "2"}), HasSubstr("unknown flag --batch"));
  auto help = Parse({"env", "--help"});
  ASSERT_TRUE(help.ok());
  EXPECT_THAT(*help->help_text, HasSubstr("Usage: memplan env"));
  EXPECT_THAT(HelpText(Command::kNone), HasSubstr("  env "));
}

TEST(CliArgsTest, MeasureParsesSizesAndSwitches) {
  auto inv = Parse({"measure", "--plan-id", "plan-1", "--peak-reserved", "71.5GiB",
                    "--peak-allocated", "68000000000", "--peak-device", "73GB", "--load-peak",
                    "512MiB", "--step-seconds", "1.25", "--note", "run 3"});
  ASSERT_TRUE(inv.ok()) << inv.status();
  const Measurement& m = inv->measure.measurement;
  EXPECT_EQ(m.plan_id, "plan-1");
  EXPECT_EQ(m.peak_reserved_bytes, static_cast<int64_t>(71.5 * (int64_t{1} << 30)));
  EXPECT_EQ(m.peak_allocated_bytes, 68'000'000'000);
  EXPECT_EQ(m.peak_device_bytes, 73'000'000'000);
  EXPECT_EQ(m.load_peak_bytes, int64_t{512} << 20);
  EXPECT_EQ(m.step_seconds, 1.25);
  EXPECT_FALSE(m.oom);
  EXPECT_EQ(m.note, "run 3");

  auto oom = Parse({"measure", "--plan-id", "plan-1", "--oom"});
  ASSERT_TRUE(oom.ok()) << oom.status();
  EXPECT_TRUE(oom->measure.measurement.oom);
}

TEST(CliArgsTest, CalibrationPlansAndPresetsFilters) {
  auto cal =
      Parse({"calibration", "--hardware", "h100-80gb", "--dtype", "BF16", "--family", "qwen3"});
  ASSERT_TRUE(cal.ok()) << cal.status();
  EXPECT_EQ(cal->calibration.hardware_name, "h100-80gb");
  EXPECT_EQ(cal->calibration.param_dtype, DType::kBFloat16);
  EXPECT_EQ(cal->calibration.model_family, "qwen3");

  auto list = Parse({"plans", "list", "--page-size", "20", "--page-token", "abc", "--all"});
  ASSERT_TRUE(list.ok()) << list.status();
  EXPECT_EQ(list->plans_list.page_size, 20);
  EXPECT_EQ(list->plans_list.page_token, "abc");
  EXPECT_TRUE(list->plans_list.all_pages);

  EXPECT_EQ(Parse({"presets"})->presets, PresetsFilter::kAll);
  EXPECT_EQ(Parse({"presets", "--models"})->presets, PresetsFilter::kModels);
  EXPECT_EQ(Parse({"presets", "--hardware"})->presets, PresetsFilter::kHardware);
}

TEST(CliArgsTest, LoraTargetsAllExpands) {
  auto inv =
      Parse({"plan", "--arch", "a", "--gpu", "g", "--lora-rank", "8", "--lora-targets", "all"});
  ASSERT_TRUE(inv.ok()) << inv.status();
  EXPECT_EQ(inv->plan.training.lora_target_modules.size(), 7u);
}

TEST(CliArgsTest, OsftRankRatioPlansAnOsftRun) {
  auto inv = Parse({"plan", "--arch", "a", "--gpu", "g", "--osft-rank-ratio", "0.5"});
  ASSERT_TRUE(inv.ok()) << inv.status();
  EXPECT_EQ(inv->plan.training.kind, TrainingKind::kOsft);
  EXPECT_EQ(inv->plan.training.osft_rank_ratio, 0.5);
  EXPECT_TRUE(inv->plan.training.osft_target_modules.empty());  // the planner's default: all
  inv = Parse({"plan", "--arch", "a", "--gpu", "g", "--osft-rank-ratio", "0.25", "--osft-targets",
               "q_proj,down_proj", "--n-ckpt", "4"});
  ASSERT_TRUE(inv.ok()) << inv.status();
  EXPECT_THAT(inv->plan.training.osft_target_modules, ElementsAre("q_proj", "down_proj"));
  EXPECT_EQ(inv->plan.fixed.n_checkpoint, 4);
  for (const char* ratio : {"0", "1", "1.5", "-0.5", "x"}) {
    EXPECT_THAT(ErrorOf({"plan", "--arch", "a", "--gpu", "g", "--osft-rank-ratio", ratio}),
                HasSubstr("--osft-rank-ratio"))
        << ratio;
  }
  EXPECT_THAT(ErrorOf({"plan", "--arch", "a", "--gpu", "g", "--osft-targets", "all"}),
              HasSubstr("--osft-targets: needs --osft-rank-ratio"));
  EXPECT_THAT(ErrorOf({"plan", "--arch", "a", "--gpu", "g", "--osft-rank-ratio", "0.5",
                       "--lora-rank", "8", "--lora-targets", "all"}),
              HasSubstr("exclusive"));
  EXPECT_THAT(ErrorOf({"plan", "--arch", "a", "--gpu", "g", "--osft-rank-ratio", "0.5",
                       "--osft-targets", "lm_head"}),
              HasSubstr("--osft-targets"));
  EXPECT_THAT(HelpText(Command::kPlan), HasSubstr("--osft-rank-ratio"));
  EXPECT_THAT(HelpText(Command::kPlan), HasSubstr("--osft-targets"));
}

TEST(CliArgsTest, QloraIsLoraOnAnNf4Base) {
  // Either order of --qlora and --lora-rank.
  for (const std::vector<std::string>& args :
       {std::vector<std::string>{"plan", "--arch", "a", "--gpu", "g", "--qlora", "--lora-rank",
                                 "16", "--lora-targets", "all"},
        std::vector<std::string>{"plan", "--arch", "a", "--gpu", "g", "--lora-rank", "16",
                                 "--lora-targets", "all", "--qlora"}}) {
    auto inv = Parse(args);
    ASSERT_TRUE(inv.ok()) << inv.status();
    EXPECT_EQ(inv->plan.training.kind, TrainingKind::kQlora);
    EXPECT_EQ(inv->plan.training.lora_rank, 16);
    EXPECT_EQ(inv->plan.training.lora_target_modules.size(), 7u);
  }
  EXPECT_THAT(ErrorOf({"plan", "--arch", "a", "--gpu", "g", "--qlora"}),
              HasSubstr("--qlora: needs --lora-rank and --lora-targets"));
  EXPECT_THAT(ErrorOf({"plan", "--arch", "a", "--gpu", "g", "--qlora", "--lora-rank", "8"}),
              HasSubstr("--lora-rank: needs --lora-targets"));
}

TEST(CliArgsTest, HelpOnEveryCommand) {
  const std::vector<std::vector<std::string>> lines = {
      {"--help"},
      {"-h"},
      {"plan", "--help"},
      {"plan", "--arch", "x", "-h"},
      {"trace", "--help"},
      {"trace", "get", "--help"},
      {"hardware", "-h"},
      {"measure", "--help"},
      {"calibration", "-h"},
      {"plans", "--help"},
      {"plans", "list", "-h"},
      {"presets", "--help"},
      // --help wins over flags that would otherwise be errors.
      {"plan", "--batch", "zero", "--help"},
  };
  for (const auto& line : lines) {
    auto inv = Parse(line);
    ASSERT_TRUE(inv.ok()) << line[0] << ": " << inv.status();
    ASSERT_TRUE(inv->help_text.has_value()) << line[0];
    EXPECT_THAT(*inv->help_text, HasSubstr("Usage:"));
    EXPECT_THAT(*inv->help_text, HasSubstr("--planner"));
  }
  EXPECT_THAT(*Parse({"plan", "--help"})->help_text, HasSubstr("--n-hs-offload"));
  EXPECT_THAT(*Parse({"measure", "--help"})->help_text, HasSubstr("--peak-reserved"));
  EXPECT_THAT(*Parse({"trace", "--help"})->help_text, HasSubstr("trace submit FILE"));
  EXPECT_THAT(*Parse({"--help"})->help_text, HasSubstr("plans list"));
}

TEST(CliArgsTest, HelpTextCoversEveryPlanFlag) {
  const std::string help = HelpText(Command::kPlan);
  for (const char* flag : {"--arch",
                           "--arch-file",
                           "--trace-id",
                           "--gpu",
                           "--hardware-id",
                           "--batch",
                           "--seq",
                           "--world-size",
                           "--grad-accum",
                           "--dtype",
                           "--optimizer",
                           "--lora-rank",
                           "--lora-targets",
                           "--qlora",
                           "--margin",
                           "--safety-margin",
                           "--chunk-mib",
                           "--n-persist",
                           "--n-buffer",
                           "--n-swap",
                           "--n-ckpt",
                           "--n-hs-offload",
                           "--host-memory",
                           "--max-alternatives",
                           "--skip-limits",
                           "--gpus-per-node",
                           "--local-world-size",
                           "--host-memory-gib",
                           "--images-per-sample",
                           "--image-size",
                           "--vision-checkpoint"}) {
    EXPECT_THAT(help, HasSubstr(flag));
  }
}

TEST(CliArgsTest, SafetyMarginTakesBothSpellings) {
  for (const char* flag : {"--safety-margin", "--margin"}) {
    auto inv = Parse({"plan", "--arch", "a", "--gpu", "g", flag, "0.5"});
    ASSERT_TRUE(inv.ok()) << flag << ": " << inv.status();
    EXPECT_EQ(inv->plan.safety_margin, 0.5) << flag;
  }
  auto zero = Parse({"plan", "--arch", "a", "--gpu", "g", "--safety-margin=0"});
  ASSERT_TRUE(zero.ok()) << zero.status();
  EXPECT_EQ(zero->plan.safety_margin, 0.0);  // sent as 0: the planner's default
}

TEST(CliArgsTest, NodeFlagsOverrideThePreset) {
  // --gpus-per-node is --local-world-size under the name the issue asked for: one flag, one range.
  for (const char* flag : {"--gpus-per-node", "--local-world-size"}) {
    auto inv = Parse({"plan", "--arch", "a", "--gpu", "g", "--world-size", "8", flag, "8",
                      "--host-memory-gib", "2048"});
    ASSERT_TRUE(inv.ok()) << flag << ": " << inv.status();
    EXPECT_EQ(inv->plan.local_world_size, 8) << flag;
    EXPECT_EQ(PlanWorkload(inv->plan).local_world_size, 8) << flag;
    EXPECT_EQ(inv->plan.host_memory_bytes, int64_t{2048} << 30) << flag;
  }
  auto fraction = Parse({"admit", "--arch", "a", "--host-memory-gib=1.5", "--pool", "p=g"});
  ASSERT_TRUE(fraction.ok()) << fraction.status();
  EXPECT_EQ(fraction->plan.host_memory_bytes, int64_t{3} << 29);
  auto unset = Parse({"plan", "--arch", "a", "--gpu", "g"});
  ASSERT_TRUE(unset.ok());
  EXPECT_FALSE(unset->plan.host_memory_bytes.has_value());
  EXPECT_FALSE(unset->plan.local_world_size.has_value());

  EXPECT_THAT(ErrorOf({"plan", "--arch", "a", "--gpu", "g", "--host-memory-gib", "0.5"}),
              HasSubstr("--host-memory-gib: 0.5 is outside [1, 65536]"));
  EXPECT_THAT(ErrorOf({"plan", "--arch", "a", "--gpu", "g", "--host-memory-gib", "70000"}),
              HasSubstr("--host-memory-gib: 70000 is outside [1, 65536]"));
  EXPECT_THAT(ErrorOf({"plan", "--arch", "a", "--gpu", "g", "--host-memory-gib", "2TiB"}),
              HasSubstr("--host-memory-gib: \"2TiB\" is not a number in [1, 65536]"));
  EXPECT_THAT(ErrorOf({"plan", "--arch", "a", "--gpu", "g", "--gpus-per-node", "0"}),
              HasSubstr("--gpus-per-node: 0 is outside [1, 65536]"));
  EXPECT_THAT(ErrorOf({"plan", "--arch", "a", "--gpu", "g", "--local-world-size", "0"}),
              HasSubstr("--local-world-size: 0 is outside [1, 65536]"));
  EXPECT_THAT(ErrorOf({"plan", "--arch", "a", "--gpu", "g", "--world-size", "4",
                       "--gpus-per-node", "8"}),
              HasSubstr("--gpus-per-node: 8 is more than --world-size 4"));
  EXPECT_THAT(ErrorOf({"plan", "--arch", "a", "--gpu", "g", "--gpus-per-node", "2"}),
              HasSubstr("--gpus-per-node: 2 is more than --world-size 1"));
}

TEST(CliArgsTest, BadValuesNameTheFlag) {
  EXPECT_THAT(ErrorOf({"plan", "--arch", "a", "--gpu", "g", "--batch", "zero"}),
              HasSubstr("--batch: \"zero\" is not an integer in [1, 65536]"));
  EXPECT_THAT(ErrorOf({"plan", "--arch", "a", "--gpu", "g", "--batch", "0"}), HasSubstr("--batch"));
  EXPECT_THAT(ErrorOf({"plan", "--arch", "a", "--gpu", "g", "--seq", "-5"}), HasSubstr("--seq"));
  EXPECT_THAT(ErrorOf({"plan", "--arch", "a", "--gpu", "g", "--dtype", "int8"}),
              HasSubstr("--dtype: \"int8\" is not one of fp32, bf16, fp16"));
  EXPECT_THAT(ErrorOf({"plan", "--arch", "a", "--gpu", "g", "--optimizer", "lion"}),
              HasSubstr("--optimizer: \"lion\" is not one of adamw"));
  // The range is common/safety_margin.h's; the old CLI-only floor of 0.001 is gone (0 reads as
  // the planner's default, as it does for memplan-agent --safety-margin).
  EXPECT_THAT(ErrorOf({"plan", "--arch", "a", "--gpu", "g", "--margin", "0.9"}),
              HasSubstr("--margin: 0.9 is outside [0, 0.5]"));
  EXPECT_THAT(ErrorOf({"plan", "--arch", "a", "--gpu", "g", "--safety-margin", "0.9"}),
              HasSubstr("--safety-margin: 0.9 is outside [0, 0.5]"));
  EXPECT_THAT(ErrorOf({"plan", "--arch", "a", "--gpu", "g", "--host-memory", "numa"}),
              HasSubstr("--host-memory: \"numa\" is not one of pinned, pageable"));
  EXPECT_THAT(ErrorOf({"plan", "--arch", "a", "--gpu", "g", "--lora-rank", "8", "--lora-targets",
                       "q_proj,mlp"}),
              HasSubstr("--lora-targets: \"mlp\" is not one of q_proj"));
  EXPECT_THAT(ErrorOf({"plan", "--arch", "a", "--gpu", "g", "--n-persist", "1.5"}),
              HasSubstr("--n-persist"));
  EXPECT_THAT(ErrorOf({"plan", "--arch", "a", "--gpu", "g", "--skip-limits=yes"}),
              HasSubstr("--skip-limits: takes no value"));
  EXPECT_THAT(ErrorOf({"plan", "--arch", "a", "--gpu"}), HasSubstr("--gpu: needs a value"));
  EXPECT_THAT(ErrorOf({"measure", "--plan-id", "p", "--peak-reserved", "lots"}),
              HasSubstr("--peak-reserved: \"lots\" is not a size"));
  EXPECT_THAT(ErrorOf({"plans", "list", "--page-size", "5000"}), HasSubstr("--page-size"));
  EXPECT_THAT(ErrorOf({"--timeout", "0", "presets"}), HasSubstr("--timeout"));
}

TEST(CliArgsTest, UnknownFlagsAndCommandsAreNamed) {
  EXPECT_THAT(ErrorOf({"plan", "--arch", "a", "--gpu", "g", "--bacth", "2"}),
              HasSubstr("unknown flag --bacth; see 'memplan plan --help'"));
  EXPECT_THAT(ErrorOf({"presets", "--arch", "a"}),
              HasSubstr("unknown flag --arch; see 'memplan presets --help'"));
  EXPECT_THAT(ErrorOf({"frobnicate"}), HasSubstr("unknown command 'frobnicate'"));
  EXPECT_THAT(ErrorOf({"trace"}), HasSubstr("trace: expected a subcommand: submit, get"));
  EXPECT_THAT(ErrorOf({"plans", "delete", "x"}), HasSubstr("plans: unknown subcommand 'delete'"));
  EXPECT_THAT(ErrorOf({"--arch", "a", "plan"}),
              HasSubstr("unknown flag --arch before the command"));
  EXPECT_THAT(ErrorOf({}), HasSubstr("no command given"));
}

TEST(CliArgsTest, CrossFlagRules) {
  EXPECT_THAT(ErrorOf({"plan", "--gpu", "g"}), HasSubstr("the model is missing"));
  EXPECT_THAT(ErrorOf({"plan", "--arch", "a", "--arch-file", "f", "--gpu", "g"}),
              HasSubstr("mutually exclusive"));
  EXPECT_THAT(ErrorOf({"plan", "--arch", "a"}), HasSubstr("the hardware is missing"));
  EXPECT_THAT(ErrorOf({"plan", "--arch", "a", "--gpu", "g", "--hardware-id", "h"}),
              HasSubstr("--gpu and --hardware-id are mutually exclusive"));
  EXPECT_THAT(ErrorOf({"plan", "--arch", "a", "--gpu", "g", "--lora-targets", "all"}),
              HasSubstr("--lora-targets: needs --lora-rank"));
  EXPECT_THAT(ErrorOf({"plan", "--arch", "a", "--gpu", "g", "--lora-rank", "8"}),
              HasSubstr("--lora-rank: needs --lora-targets"));
  EXPECT_THAT(ErrorOf({"measure", "--peak-reserved", "1GiB"}), HasSubstr("--plan-id is required"));
  // A trace fixes its workload: none or both of --batch/--seq.
  EXPECT_TRUE(Parse({"plan", "--trace-id", "t", "--gpu", "g"}).ok());
  EXPECT_TRUE(
      Parse({"plan", "--trace-id", "t", "--gpu", "g", "--batch", "2", "--seq", "512"}).ok());
  EXPECT_THAT(ErrorOf({"plan", "--trace-id", "t", "--gpu", "g", "--batch", "2"}),
              HasSubstr("--seq: required with --trace-id"));
  EXPECT_THAT(ErrorOf({"plan", "--trace-id", "t", "--gpu", "g", "--world-size", "2"}),
              HasSubstr("--batch: required with --trace-id"));
  EXPECT_THAT(ErrorOf({"measure", "--plan-id", "p"}), HasSubstr("--peak-reserved is required"));
  EXPECT_THAT(ErrorOf({"trace", "get"}), HasSubstr("trace get: missing TRACE_ID"));
  EXPECT_THAT(ErrorOf({"plans", "get", "a", "b"}), HasSubstr("unexpected argument 'b'"));
  EXPECT_THAT(ErrorOf({"presets", "extra"}), HasSubstr("presets: unexpected argument 'extra'"));
}

// A vision-language model's images: both flags or neither, the size as HEIGHTxWIDTH in pixels.
TEST(CliArgsTest, ImagesOfAVisionLanguageWorkload) {
  auto inv = Parse({"plan", "--arch-file", "f", "--gpu", "g", "--images-per-sample", "2",
                    "--image-size", "448x336"});
  ASSERT_TRUE(inv.ok()) << inv.status();
  EXPECT_EQ(inv->plan.images_per_sample, 2);
  const Workload w = PlanWorkload(inv->plan);
  EXPECT_EQ(w.images_per_sample, 2);
  EXPECT_EQ(w.image_height, 448);
  EXPECT_EQ(w.image_width, 336);
  EXPECT_TRUE(HasWorkloadFlags(inv->plan));
  // Without them the workload is text only (the planner refuses it for a vision-language model).
  auto text = Parse({"plan", "--arch-file", "f", "--gpu", "g"});
  ASSERT_TRUE(text.ok()) << text.status();
  EXPECT_EQ(PlanWorkload(text->plan).images_per_sample, 0);
  EXPECT_EQ(PlanWorkload(text->plan).image_height, 0);

  EXPECT_THAT(ErrorOf({"plan", "--arch", "a", "--gpu", "g", "--images-per-sample", "1"}),
              HasSubstr("--images-per-sample: --images-per-sample N and --image-size"));
  EXPECT_THAT(ErrorOf({"plan", "--arch", "a", "--gpu", "g", "--image-size", "448x448"}),
              HasSubstr("--image-size: --images-per-sample N and --image-size"));
  EXPECT_THAT(ErrorOf({"plan", "--arch", "a", "--gpu", "g", "--images-per-sample", "0",
                       "--image-size", "448x448"}),
              HasSubstr("--images-per-sample"));
  for (const char* size : {"448", "448x", "0x448", "448x70000", "axb", "448x448x3"}) {
    EXPECT_THAT(ErrorOf({"plan", "--arch", "a", "--gpu", "g", "--images-per-sample", "1",
                         "--image-size", size}),
                AllOf(HasSubstr("--image-size"), HasSubstr("[1, 65536]")))
        << size;
  }
  // --vision-checkpoint: the tower's blocks recomputed; only with images.
  EXPECT_FALSE(w.vision_checkpoint);
  auto ckpt = Parse({"plan", "--arch-file", "f", "--gpu", "g", "--images-per-sample", "1",
                     "--image-size", "448x448", "--vision-checkpoint"});
  ASSERT_TRUE(ckpt.ok()) << ckpt.status();
  EXPECT_TRUE(PlanWorkload(ckpt->plan).vision_checkpoint);
  EXPECT_THAT(ErrorOf({"plan", "--arch", "a", "--gpu", "g", "--vision-checkpoint"}),
              HasSubstr("--vision-checkpoint: needs --images-per-sample"));
}

TEST(ParseByteSizeTest, UnitsAndErrors) {
  EXPECT_EQ(*ParseByteSize("4096"), 4096);
  EXPECT_EQ(*ParseByteSize("1KiB"), 1024);
  EXPECT_EQ(*ParseByteSize("512MiB"), int64_t{512} << 20);
  EXPECT_EQ(*ParseByteSize("80GiB"), int64_t{80} << 30);
  EXPECT_EQ(*ParseByteSize("80gib"), int64_t{80} << 30);
  EXPECT_EQ(*ParseByteSize("80G"), int64_t{80} << 30);
  EXPECT_EQ(*ParseByteSize("80GB"), 80'000'000'000);
  EXPECT_EQ(*ParseByteSize("1.5TB"), 1'500'000'000'000);
  EXPECT_EQ(*ParseByteSize("0.5 KiB"), 512);
  EXPECT_EQ(*ParseByteSize("2TiB"), int64_t{2} << 40);
  for (const char* bad : {"", "GiB", "-1GiB", "1.2.3", "12 parsecs", "1e9", "99999999999TiB"}) {
    EXPECT_FALSE(ParseByteSize(bad).ok()) << bad;
  }
}

}  // namespace
}  // namespace memplan::cli
