// `memplan env`: what a bug report needs to know about this installation (versions of memplan and
// the libraries it links, the host, its NVIDIA GPUs and the hardware presets they map to, the
// agent beside it, the planner database and daemon), as text or JSON. Every probe that touches
// the system goes through EnvProbes, so tests can substitute them; nothing here fails: a probe
// that finds nothing says so in the report. Thread-compatible.
#pragma once

#include <functional>
#include <optional>
#include <ostream>
#include <string>
#include <utility>
#include <vector>

namespace memplan::cli {

// One "key: value" line; `key` is also the JSON member name.
using EnvRow = std::pair<std::string, std::string>;

struct EnvSection {
  std::string title;  // "Libraries"; its JSON member is the title in lower case
  std::vector<EnvRow> rows;
  // A section of several like things (the GPUs): one row list each, a JSON array.
  std::vector<std::vector<EnvRow>> items;
};

struct EnvReport {
  std::string version_line;  // exactly `memplan --version`'s line
  std::vector<EnvSection> sections;
};

// The system as the report reads it.
struct EnvProbes {
  // A file's contents; nullopt when it cannot be read.
  std::function<std::optional<std::string>(const std::string& path)> read_file;
  // Runs an executable (argv[0] an absolute path) and returns its stdout; nullopt when it could
  // not run or exited non-zero.
  std::function<std::optional<std::string>(const std::vector<std::string>& argv)> run;
  // Whether `path` is an executable file.
  std::function<bool(const std::string& path)> is_executable;
  std::string path_env;  // $PATH
  std::string self_dir;  // the directory of the running memplan binary
  // "Linux 6.1.0-18-amd64 x86_64" (uname); empty when unknown.
  std::string kernel;
  // The planner part: the database an in-process answer reads, and the daemon's answer (empty
  // when no --planner was given).
  std::string db_path;
  std::string planner_address;
  std::function<std::string()> contact_planner;
};

// The probes of this process: /proc, $PATH, fork/exec, uname, /proc/self/exe.
EnvProbes SystemEnvProbes();

EnvReport CollectEnvReport(const EnvProbes& probes);

// The text report: the version line, then one block per section.
std::string FormatEnvText(const EnvReport& report);
// The same as one JSON object: {"version_line": ..., "<section>": {...} or [...], ...}.
std::string FormatEnvJson(const EnvReport& report);

// Helpers, exposed for tests.
// The first executable named `name` in the ':'-separated `path_env`.
std::optional<std::string> FindOnPath(const std::string& name, const std::string& path_env,
                                      const std::function<bool(const std::string&)>& is_executable);
// The hardware preset an `nvidia-smi` GPU (its name and memory in MiB) maps to, and how:
// "h200 (by name)", "h100-80gb (by model h100 and memory)", "a100-80gb (guessed from memory
// only)", or a sentence saying none does.
std::string MatchGpuPreset(const std::string& gpu_name, int64_t memory_mib);

}  // namespace memplan::cli
