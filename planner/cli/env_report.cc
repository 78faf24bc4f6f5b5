#include "planner/cli/env_report.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/utsname.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>

#include "absl/base/config.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "common/build_info.h"
#include "common/presets.h"
#include "google/protobuf/stubs/common.h"
#include "grpcpp/grpcpp.h"
#include "nlohmann/json.hpp"
#include "planner/store/store.h"

namespace memplan::cli {
namespace {

// A tool that does not answer within this is reported as not answering (a wedged driver can
// hang nvidia-smi; the agent loads LibTorch, which takes a few seconds at most).
constexpr int kRunTimeoutMs = 30'000;

std::optional<std::string> ReadWholeFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return std::nullopt;
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

bool IsExecutableFile(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode) && ::access(path.c_str(), X_OK) == 0;
}

// fork + execv with stdout on a pipe (stderr and stdin to /dev/null); killed past the timeout.
std::optional<std::string> RunProgram(const std::vector<std::string>& argv) {
  if (argv.empty()) return std::nullopt;
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) != 0) return std::nullopt;
  const pid_t pid = ::fork();
  if (pid < 0) {
    ::close(fds[0]);
    ::close(fds[1]);
    return std::nullopt;
  }
  if (pid == 0) {
    ::dup2(fds[1], STDOUT_FILENO);
    const int null_fd = ::open("/dev/null", O_RDWR);
    if (null_fd >= 0) {
      ::dup2(null_fd, STDIN_FILENO);
      ::dup2(null_fd, STDERR_FILENO);
    }
    std::vector<char*> args;
    for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    ::execv(args[0], args.data());
    ::_exit(127);
  }
  ::close(fds[1]);
  std::string output;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(kRunTimeoutMs);
  bool timed_out = false;
  char buffer[4096];
  while (true) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
                          deadline - std::chrono::steady_clock::now())
                          .count();
    if (left <= 0) {
      timed_out = true;
      break;
    }
    pollfd pfd{fds[0], POLLIN, 0};
    const int ready = ::poll(&pfd, 1, static_cast<int>(left));
    if (ready < 0 && errno == EINTR) continue;
    if (ready <= 0) {
      timed_out = ready == 0;
      break;
    }
    const ssize_t n = ::read(fds[0], buffer, sizeof(buffer));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    output.append(buffer, static_cast<size_t>(n));
  }
  ::close(fds[0]);
  if (timed_out) ::kill(pid, SIGKILL);
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  if (timed_out || !WIFEXITED(status) || WEXITSTATUS(status) != 0) return std::nullopt;
  return output;
}

std::string SelfDir() {
  char path[4096];
  const ssize_t n = ::readlink("/proc/self/exe", path, sizeof(path) - 1);
  if (n <= 0) return "";
  const std::string exe(path, static_cast<size_t>(n));
  const size_t slash = exe.rfind('/');
  return slash == std::string::npos ? "" : exe.substr(0, slash);
}

std::string KernelText() {
  struct utsname u;
  if (::uname(&u) != 0) return "";
  return absl::StrCat(u.sysname, " ", u.release, " ", u.machine);
}

// "3.21.12" from protobuf's 3021012.
std::string DottedVersion(int v) {
  return absl::StrCat(v / 1000000, ".", (v / 1000) % 1000, ".", v % 1000);
}

// The value of `key` in "key : value" lines (/proc/cpuinfo) or "KEY=value" lines (os-release).
std::optional<std::string> FindField(const std::string& text, absl::string_view key, char sep) {
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    const size_t at = line.find(sep);
    if (at == absl::string_view::npos) continue;
    if (absl::StripAsciiWhitespace(line.substr(0, at)) != key) continue;
    absl::string_view value = absl::StripAsciiWhitespace(line.substr(at + 1));
    if (value.size() >= 2 && value.front() == '"' && value.back() == '"') {
      value = value.substr(1, value.size() - 2);
    }
    return std::string(value);
  }
  return std::nullopt;
}

EnvSection MemplanSection() {
  return {"Memplan",
          {{"version", std::string(build_info::kVersion)},
           {"git_sha", std::string(build_info::kGitSha)},
           {"build_type", std::string(build_info::kBuildType)},
           {"compiler", std::string(build_info::kCompiler)}},
          {}};
}

EnvSection LibrariesSection() {
  EnvSection s{"Libraries", {}, {}};
  s.rows.push_back({"grpc", grpc::Version()});
  s.rows.push_back({"protobuf", DottedVersion(GOOGLE_PROTOBUF_VERSION)});
#ifdef ABSL_LTS_RELEASE_VERSION
  s.rows.push_back({"abseil", absl::StrCat("LTS ", ABSL_LTS_RELEASE_VERSION, ".",
                                           ABSL_LTS_RELEASE_PATCH_LEVEL)});
#else
  s.rows.push_back({"abseil", "not an LTS release (no ABSL_LTS_RELEASE_VERSION)"});
#endif
  s.rows.push_back({"sqlite", StoreVersionText()});
  return s;
}

EnvSection HostSection(const EnvProbes& probes) {
  EnvSection s{"Host", {}, {}};
  const std::optional<std::string> cpuinfo = probes.read_file("/proc/cpuinfo");
  std::string cpu = "unknown (/proc/cpuinfo unreadable)";
  int processors = 0;
  if (cpuinfo) {
    cpu = FindField(*cpuinfo, "model name", ':').value_or("unknown (no model name)");
    for (absl::string_view line : absl::StrSplit(*cpuinfo, '\n')) {
      if (absl::StartsWith(line, "processor")) ++processors;
    }
  }
  s.rows.push_back({"cpu", cpu});
  s.rows.push_back({"cpus", processors > 0 ? absl::StrCat(processors) : "unknown"});
  std::string ram = "unknown (/proc/meminfo unreadable)";
  if (const std::optional<std::string> meminfo = probes.read_file("/proc/meminfo")) {
    int64_t kib = 0;
    const std::string total = FindField(*meminfo, "MemTotal", ':').value_or("");
    if (absl::SimpleAtoi(absl::StripSuffix(total, " kB"), &kib) && kib > 0) {
      char gib[32];
      std::snprintf(gib, sizeof(gib), "%.1f GiB", static_cast<double>(kib) / (1 << 20));
      ram = gib;
    } else {
      ram = "unknown (no MemTotal)";
    }
  }
  s.rows.push_back({"ram", ram});
  std::string os = "unknown";
  if (const std::optional<std::string> release = probes.read_file("/etc/os-release")) {
    os = FindField(*release, "PRETTY_NAME", '=').value_or("unknown (no PRETTY_NAME)");
  }
  s.rows.push_back({"os", os});
  s.rows.push_back({"kernel", probes.kernel.empty() ? "unknown" : probes.kernel});
  return s;
}

EnvSection GpuSection(const EnvProbes& probes) {
  EnvSection s{"GPUs", {}, {}};
  const std::optional<std::string> smi = FindOnPath("nvidia-smi", probes.path_env,
                                                    probes.is_executable);
  if (!smi) {
    s.rows.push_back({"status", "no NVIDIA GPU found (nvidia-smi not on PATH)"});
    return s;
  }
  const std::optional<std::string> answer =
      probes.run({*smi, "--query-gpu=name,memory.total,driver_version", "--format=csv,noheader"});
  if (!answer) {
    s.rows.push_back({"status", absl::StrCat("no NVIDIA GPU found (", *smi, " failed)")});
    return s;
  }
  for (absl::string_view line : absl::StrSplit(*answer, '\n', absl::SkipWhitespace())) {
    std::vector<std::string> fields;
    for (absl::string_view f : absl::StrSplit(line, ',')) {
      fields.emplace_back(absl::StripAsciiWhitespace(f));
    }
    if (fields.size() < 3) continue;
    int64_t mib = 0;
    (void)absl::SimpleAtoi(absl::StripSuffix(fields[1], " MiB"), &mib);
    s.items.push_back({{"name", fields[0]},
                       {"memory", fields[1]},
                       {"driver", fields[2]},
                       {"preset", MatchGpuPreset(fields[0], mib)}});
  }
  s.rows.push_back(
      {"status", s.items.empty() ? absl::StrCat("no NVIDIA GPU found (", *smi, " listed none)")
                                 : absl::StrCat(s.items.size(), " found by ", *smi)});
  return s;
}

EnvSection AgentSection(const EnvProbes& probes) {
  EnvSection s{"Agent", {}, {}};
  std::optional<std::string> agent;
  const std::string beside = probes.self_dir + "/memplan-agent";
  if (!probes.self_dir.empty() && probes.is_executable(beside)) {
    agent = beside;
  } else {
    agent = FindOnPath("memplan-agent", probes.path_env, probes.is_executable);
  }
  if (!agent) {
    s.rows.push_back(
        {"status", "memplan-agent not found (neither beside memplan nor on PATH)"});
    return s;
  }
  s.rows.push_back({"path", *agent});
  const std::optional<std::string> version = probes.run({*agent, "--version"});
  if (!version) {
    s.rows.push_back({"status", "memplan-agent --version failed"});
    return s;
  }
  // "memplan-agent 0.1.0 (...)", then "torch 2.11.0", "cuda_runtime 13.0", ...: first word the key.
  for (absl::string_view line : absl::StrSplit(*version, '\n', absl::SkipWhitespace())) {
    line = absl::StripAsciiWhitespace(line);
    const size_t space = line.find(' ');
    if (space == absl::string_view::npos) continue;
    std::string key(line.substr(0, space));
    if (key == "memplan-agent") key = "version";
    s.rows.push_back({key, std::string(line.substr(space + 1))});
  }
  return s;
}

EnvSection PlannerSection(const EnvProbes& probes) {
  EnvSection s{"Planner", {}, {}};
  if (!probes.db_path.empty()) {
    struct stat st;
    const bool exists = ::stat(probes.db_path.c_str(), &st) == 0;
    s.rows.push_back({"database", exists ? absl::StrCat(probes.db_path, " (",
                                                         st.st_size, " bytes; in-process answers "
                                                                     "read it)")
                                         : absl::StrCat(probes.db_path,
                                                        " does not exist (in-process answers start "
                                                        "from no calibration)")});
  }
  if (probes.planner_address.empty() || !probes.contact_planner) {
    s.rows.push_back({"daemon", "not contacted (no --planner)"});
  } else {
    s.rows.push_back({"daemon", absl::StrCat(probes.planner_address, ": ",
                                             probes.contact_planner())});
  }
  return s;
}

}  // namespace

EnvProbes SystemEnvProbes() {
  EnvProbes probes;
  probes.read_file = ReadWholeFile;
  probes.run = RunProgram;
  probes.is_executable = IsExecutableFile;
  const char* path = std::getenv("PATH");
  probes.path_env = path == nullptr ? "" : path;
  probes.self_dir = SelfDir();
  probes.kernel = KernelText();
  return probes;
}

std::optional<std::string> FindOnPath(const std::string& name, const std::string& path_env,
                                      const std::function<bool(const std::string&)>& is_executable) {
  for (absl::string_view dir : absl::StrSplit(path_env, ':', absl::SkipEmpty())) {
    std::string candidate = absl::StrCat(absl::StripSuffix(dir, "/"), "/", name);
    if (is_executable(candidate)) return candidate;
  }
  return std::nullopt;
}

std::string MatchGpuPreset(const std::string& gpu_name, int64_t memory_mib) {
  // nvidia-smi's "NVIDIA GeForce RTX 4090" reads as the preset spelling "rtx-4090".
  std::string spelled = absl::AsciiStrToLower(gpu_name);
  for (absl::string_view vendor : {"nvidia ", "geforce ", "tesla ", "quadro "}) {
    absl::StrReplaceAll({{vendor, ""}}, &spelled);
  }
  spelled = absl::StrReplaceAll(absl::StripAsciiWhitespace(spelled), {{" ", "-"}});
  std::vector<std::string> names;
  for (const HardwareSpec& h : HardwarePresets()) names.push_back(h.name);
  const PresetNameMatch match = MatchPresetName(spelled, names);
  if (!match.name.empty()) return absl::StrCat(match.name, " (by name)");

  // A preset whose model ("h100" of "h100-80gb") is in the GPU's name, nearest in memory; else
  // the preset nearest in memory, when within 5 %.
  const double mib = static_cast<double>(memory_mib);
  const HardwareSpec* best = nullptr;
  std::string model;
  for (const HardwareSpec& h : HardwarePresets()) {
    const std::string token = h.name.substr(0, h.name.find('-'));
    if (!absl::StrContains(spelled, token)) continue;
    if (best == nullptr || std::abs(h.gpu_memory_bytes / 1048576.0 - mib) <
                               std::abs(best->gpu_memory_bytes / 1048576.0 - mib)) {
      best = &h;
      model = token;
    }
  }
  if (best != nullptr) return absl::StrCat(best->name, " (by model ", model, " and memory)");
  for (const HardwareSpec& h : HardwarePresets()) {
    if (best == nullptr || std::abs(h.gpu_memory_bytes / 1048576.0 - mib) <
                               std::abs(best->gpu_memory_bytes / 1048576.0 - mib)) {
      best = &h;
    }
  }
  if (best != nullptr && mib > 0 &&
      std::abs(best->gpu_memory_bytes / 1048576.0 - mib) <= 0.05 * mib) {
    return absl::StrCat(best->name, " (guessed from memory only: check its speed figures)");
  }
  return "none (no preset of this card; measure one with memplan-agent bench --planner and plan "
         "with --hardware-id)";
}

EnvReport CollectEnvReport(const EnvProbes& probes) {
  EnvReport report;
  report.version_line = build_info::VersionLine("memplan");
  report.sections = {MemplanSection(),   LibrariesSection(),  HostSection(probes),
                     GpuSection(probes), AgentSection(probes), PlannerSection(probes)};
  return report;
}

std::string FormatEnvText(const EnvReport& report) {
  std::string text = absl::StrCat(report.version_line, "\n");
  auto add_rows = [&text](const std::vector<EnvRow>& rows, absl::string_view indent) {
    size_t width = 0;
    for (const EnvRow& row : rows) width = std::max(width, row.first.size());
    for (const EnvRow& row : rows) {
      absl::StrAppend(&text, indent, row.first, ":", std::string(width + 2 - row.first.size(), ' '),
                      row.second, "\n");
    }
  };
  for (const EnvSection& section : report.sections) {
    absl::StrAppend(&text, "\n", section.title, "\n");
    add_rows(section.rows, "  ");
    for (size_t i = 0; i < section.items.size(); ++i) {
      absl::StrAppend(&text, "  [", i, "]\n");
      add_rows(section.items[i], "    ");
    }
  }
  return text;
}

std::string FormatEnvJson(const EnvReport& report) {
  nlohmann::ordered_json json;
  json["version_line"] = report.version_line;
  for (const EnvSection& section : report.sections) {
    nlohmann::ordered_json object = nlohmann::ordered_json::object();
    for (const EnvRow& row : section.rows) object[row.first] = row.second;
    if (!section.items.empty() || section.title == "GPUs") {
      nlohmann::ordered_json items = nlohmann::ordered_json::array();
      for (const std::vector<EnvRow>& item : section.items) {
        nlohmann::ordered_json entry = nlohmann::ordered_json::object();
        for (const EnvRow& row : item) entry[row.first] = row.second;
        items.push_back(std::move(entry));
      }
      object["devices"] = std::move(items);
    }
    json[absl::AsciiStrToLower(section.title)] = std::move(object);
  }
  return json.dump(2) + "\n";
}

}  // namespace memplan::cli
