#include "planner/cli/env_report.h"

#include <map>
#include <set>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace memplan::cli {
namespace {

using ::testing::HasSubstr;
using ::testing::StartsWith;

// A system made of maps: files by path, programs by argv[0], executables by path.
struct FakeSystem {
  std::map<std::string, std::string> files;
  std::map<std::string, std::optional<std::string>> programs;
  std::set<std::string> executables;
  std::vector<std::vector<std::string>> ran;

  EnvProbes Probes() {
    EnvProbes p;
    p.read_file = [this](const std::string& path) -> std::optional<std::string> {
      auto it = files.find(path);
      if (it == files.end()) return std::nullopt;
      return it->second;
    };
    p.run = [this](const std::vector<std::string>& argv) -> std::optional<std::string> {
      ran.push_back(argv);
      auto it = programs.find(argv[0]);
      return it == programs.end() ? std::nullopt : it->second;
    };
    p.is_executable = [this](const std::string& path) { return executables.count(path) > 0; };
    p.path_env = "/opt/bin:/usr/bin";
    p.self_dir = "/opt/memplan/bin";
    p.kernel = "Linux 6.1.0 x86_64";
    return p;
  }
};

const EnvSection& Section(const EnvReport& report, const std::string& title) {
  for (const EnvSection& s : report.sections) {
    if (s.title == title) return s;
  }
  static const EnvSection kNone;
  ADD_FAILURE() << "no section " << title;
  return kNone;
}

std::string Row(const std::vector<EnvRow>& rows, const std::string& key) {
  for (const auto& [k, v] : rows) {
    if (k == key) return v;
  }
  return "<none>";
}

TEST(EnvReportTest, HostFromProcAndOsRelease) {
  FakeSystem sys;
  sys.files["/proc/cpuinfo"] =
      "processor\t: 0\nmodel name\t: AMD EPYC 9654 96-Core Processor\n\n"
      "processor\t: 1\nmodel name\t: AMD EPYC 9654 96-Core Processor\n";
  sys.files["/proc/meminfo"] = "MemTotal:       2113470464 kB\nMemFree: 1 kB\n";
  sys.files["/etc/os-release"] = "NAME=\"Debian GNU/Linux\"\nPRETTY_NAME=\"Debian GNU/Linux 12 "
                                 "(bookworm)\"\n";
  const EnvReport report = CollectEnvReport(sys.Probes());
  const EnvSection& host = Section(report, "Host");
  EXPECT_EQ(Row(host.rows, "cpu"), "AMD EPYC 9654 96-Core Processor");
  EXPECT_EQ(Row(host.rows, "cpus"), "2");
  EXPECT_EQ(Row(host.rows, "ram"), "2015.6 GiB");
  EXPECT_EQ(Row(host.rows, "os"), "Debian GNU/Linux 12 (bookworm)");
  EXPECT_EQ(Row(host.rows, "kernel"), "Linux 6.1.0 x86_64");
  EXPECT_THAT(report.version_line, StartsWith("memplan "));

  FakeSystem empty;  // nothing readable: the report still comes, saying so
  const EnvReport nothing = CollectEnvReport(empty.Probes());
  const EnvSection& unknown = Section(nothing, "Host");
  EXPECT_THAT(Row(unknown.rows, "cpu"), StartsWith("unknown"));
  EXPECT_THAT(Row(unknown.rows, "ram"), StartsWith("unknown"));
}

TEST(EnvReportTest, GpusFromNvidiaSmiWithTheirPresets) {
  FakeSystem sys;
  sys.executables.insert("/usr/bin/nvidia-smi");
  sys.programs["/usr/bin/nvidia-smi"] =
      "NVIDIA H200, 143771 MiB, 570.86.15\nNVIDIA A100-SXM4-40GB, 40960 MiB, 570.86.15\n";
  const EnvReport report = CollectEnvReport(sys.Probes());
  const EnvSection& gpus = Section(report, "GPUs");
  ASSERT_EQ(gpus.items.size(), 2u);
  EXPECT_EQ(Row(gpus.items[0], "name"), "NVIDIA H200");
  EXPECT_EQ(Row(gpus.items[0], "memory"), "143771 MiB");
  EXPECT_EQ(Row(gpus.items[0], "driver"), "570.86.15");
  EXPECT_EQ(Row(gpus.items[0], "preset"), "h200 (by name)");
  EXPECT_EQ(Row(gpus.items[1], "preset"), "a100-40gb (by model a100 and memory)");
  EXPECT_EQ(Row(gpus.rows, "status"), "2 found by /usr/bin/nvidia-smi");
  ASSERT_FALSE(sys.ran.empty());
  EXPECT_EQ(sys.ran[0], (std::vector<std::string>{"/usr/bin/nvidia-smi",
                                                  "--query-gpu=name,memory.total,driver_version",
                                                  "--format=csv,noheader"}));
  const std::string json = FormatEnvJson(report);
  EXPECT_THAT(json, HasSubstr("\"preset\": \"h200 (by name)\""));

  sys.programs["/usr/bin/nvidia-smi"] = std::nullopt;  // a driver that does not answer
  EXPECT_THAT(Row(Section(CollectEnvReport(sys.Probes()), "GPUs").rows, "status"),
              HasSubstr("no NVIDIA GPU found (/usr/bin/nvidia-smi failed)"));
  FakeSystem none;
  const EnvReport no_gpu = CollectEnvReport(none.Probes());
  EXPECT_EQ(Row(Section(no_gpu, "GPUs").rows, "status"),
            "no NVIDIA GPU found (nvidia-smi not on PATH)");
  EXPECT_THAT(FormatEnvJson(no_gpu), HasSubstr("\"devices\": []"));
}

TEST(EnvReportTest, TheAgentBesideMemplanWinsOverPath) {
  FakeSystem sys;
  sys.executables = {"/opt/memplan/bin/memplan-agent", "/usr/bin/memplan-agent"};
  sys.programs["/opt/memplan/bin/memplan-agent"] =
      "memplan-agent 0.1.0 (git abc, Release)\ntorch 2.11.0\ncuda_runtime 13.0\n";
  const EnvReport beside = CollectEnvReport(sys.Probes());
  const EnvSection& agent = Section(beside, "Agent");
  EXPECT_EQ(Row(agent.rows, "path"), "/opt/memplan/bin/memplan-agent");
  EXPECT_EQ(Row(agent.rows, "version"), "0.1.0 (git abc, Release)");
  EXPECT_EQ(Row(agent.rows, "torch"), "2.11.0");
  EXPECT_EQ(Row(agent.rows, "cuda_runtime"), "13.0");

  sys.executables.erase("/opt/memplan/bin/memplan-agent");
  const EnvReport from_path = CollectEnvReport(sys.Probes());
  const EnvSection& on_path = Section(from_path, "Agent");
  EXPECT_EQ(Row(on_path.rows, "path"), "/usr/bin/memplan-agent");
  EXPECT_EQ(Row(on_path.rows, "status"), "memplan-agent --version failed");
}

TEST(EnvReportTest, PlannerIsContactedOnlyWhenNamed) {
  FakeSystem sys;
  EnvProbes probes = sys.Probes();
  probes.db_path = "/nonexistent/memplan-planner.db";
  EXPECT_EQ(Row(Section(CollectEnvReport(probes), "Planner").rows, "daemon"),
            "not contacted (no --planner)");
  probes.planner_address = "10.0.0.1:50051";
  probes.contact_planner = [] {
    return std::string("answered ListPresets: 3 model and 2 hardware presets");
  };
  const EnvReport contacted = CollectEnvReport(probes);
  const EnvSection& planner = Section(contacted, "Planner");
  EXPECT_EQ(Row(planner.rows, "daemon"),
            "10.0.0.1:50051: answered ListPresets: 3 model and 2 hardware presets");
  EXPECT_THAT(Row(planner.rows, "database"), HasSubstr("does not exist"));
}

TEST(EnvReportTest, PresetMatching) {
  EXPECT_EQ(MatchGpuPreset("NVIDIA GeForce RTX 4090", 24564), "rtx-4090 (by name)");
  EXPECT_EQ(MatchGpuPreset("NVIDIA L40S", 46068), "l40s (by name)");
  EXPECT_EQ(MatchGpuPreset("NVIDIA H100 80GB HBM3", 81559),
            "h100-80gb (by model h100 and memory)");
  EXPECT_EQ(MatchGpuPreset("NVIDIA A100-SXM4-80GB", 81920),
            "a100-80gb (by model a100 and memory)");
  EXPECT_THAT(MatchGpuPreset("NVIDIA H800", 81559), StartsWith("h100-80gb (guessed from memory"));
  EXPECT_THAT(MatchGpuPreset("NVIDIA T4", 15360), StartsWith("none"));
}

TEST(EnvReportTest, FindOnPathTakesTheFirstExecutable) {
  const std::set<std::string> exe = {"/b/tool", "/c/tool"};
  auto is_exe = [&](const std::string& p) { return exe.count(p) > 0; };
  EXPECT_EQ(FindOnPath("tool", "/a:/b/:/c", is_exe), "/b/tool");
  EXPECT_EQ(FindOnPath("tool", "", is_exe), std::nullopt);
  EXPECT_EQ(FindOnPath("other", "/a:/b:/c", is_exe), std::nullopt);
}

TEST(EnvReportTest, TextHasTheVersionLineThenEachSection) {
  FakeSystem sys;
  const std::string text = FormatEnvText(CollectEnvReport(sys.Probes()));
  EXPECT_THAT(text, StartsWith("memplan "));
  for (const char* title : {"\nMemplan\n", "\nLibraries\n", "\nHost\n", "\nGPUs\n", "\nAgent\n",
                            "\nPlanner\n"}) {
    EXPECT_THAT(text, HasSubstr(title));
  }
  EXPECT_THAT(text, HasSubstr("  sqlite:    3."));
}

}  // namespace
}  // namespace memplan::cli
