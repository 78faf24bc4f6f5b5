// Test helper: runs the real memplan-planner binary as a child process on a loopback port and
// tells the caller its address (parsed from the "listening on HOST:PORT" line, no sleeping).
// Not thread-safe.
#pragma once

#include <sys/types.h>

#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace memplan::testing {

class DaemonProcess {
 public:
  // Starts `binary --listen=127.0.0.1:0 --metrics=127.0.0.1:0|"" --db=db_path extra_args...`,
  // with stderr appended to log_path, and waits for its address lines.
  static absl::StatusOr<DaemonProcess> Start(const std::string& binary, const std::string& db_path,
                                             const std::string& log_path, bool serve_metrics,
                                             const std::vector<std::string>& extra_args = {});
  DaemonProcess(DaemonProcess&& other) noexcept;
  DaemonProcess& operator=(DaemonProcess&& other) noexcept;
  ~DaemonProcess();  // SIGKILLs and reaps a daemon still running

  const std::string& address() const { return address_; }  // "127.0.0.1:PORT"
  const std::string& metrics_address() const { return metrics_address_; }
  int metrics_port() const;
  pid_t pid() const { return pid_; }

  // Sends `signal` and waits for the process; returns its wait status (see WIFEXITED etc.).
  absl::StatusOr<int> SignalAndWait(int signal);

 private:
  DaemonProcess() = default;

  pid_t pid_ = -1;
  int stdout_fd_ = -1;
  std::string address_;
  std::string metrics_address_;
};

// Runs `binary args...` to completion; returns {wait status, stdout}.
absl::StatusOr<std::pair<int, std::string>> RunToCompletion(const std::string& binary,
                                                            const std::vector<std::string>& args);

// Starts `binary args...` with stdout and stderr appended to log_path; returns its pid.
absl::StatusOr<pid_t> StartProcess(const std::string& binary, const std::vector<std::string>& args,
                                   const std::string& log_path);

// A TCP port on 127.0.0.1 that was free a moment ago (for servers that cannot print theirs).
int FreeLoopbackPort();

// Sends SIGTERM to `pid` and reaps it (SIGKILL after `grace_seconds`).
void StopProcess(pid_t pid, double grace_seconds);

// GETs http://127.0.0.1:port/path over HTTP/1.0; the body, or an error unless 200.
absl::StatusOr<std::string> HttpGet(int port, const std::string& path);

}  // namespace memplan::testing
