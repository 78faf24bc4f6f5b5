#include "daemon_process.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace memplan::testing {
namespace {

// Reads one '\n'-terminated line; false at end of file (the child exited or closed stdout).
bool ReadLine(int fd, std::string* line) {
  line->clear();
  char c = 0;
  while (true) {
    const ssize_t n = read(fd, &c, 1);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    if (c == '\n') return true;
    line->push_back(c);
  }
}

absl::StatusOr<pid_t> Spawn(const std::string& binary, const std::vector<std::string>& args,
                            int stdout_fd, int stderr_fd) {
  std::vector<std::string> argv_storage;
  argv_storage.push_back(binary);
  argv_storage.insert(argv_storage.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (std::string& a : argv_storage) argv.push_back(a.data());
  argv.push_back(nullptr);
  const pid_t pid = fork();
  if (pid < 0) return absl::InternalError(absl::StrCat("fork: ", std::strerror(errno)));
  if (pid == 0) {
    dup2(stdout_fd, STDOUT_FILENO);
    if (stderr_fd >= 0) dup2(stderr_fd, STDERR_FILENO);
    execv(binary.c_str(), argv.data());
    _exit(127);
  }
  return pid;
}

}  // namespace

absl::StatusOr<DaemonProcess> DaemonProcess::Start(const std::string& binary,
                                                   const std::string& db_path,
                                                   const std::string& log_path, bool serve_metrics,
                                                   const std::vector<std::string>& extra_args) {
  int pipe_fds[2];
  if (pipe2(pipe_fds, O_CLOEXEC) != 0) {
    return absl::InternalError(absl::StrCat("pipe: ", std::strerror(errno)));
  }
  const int log_fd = open(log_path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  std::vector<std::string> args = {
      "--listen=127.0.0.1:0",
      serve_metrics ? "--metrics=127.0.0.1:0" : "--metrics=", absl::StrCat("--db=", db_path)};
  args.insert(args.end(), extra_args.begin(), extra_args.end());
  auto pid = Spawn(binary, args, pipe_fds[1], log_fd);
  close(pipe_fds[1]);
  if (log_fd >= 0) close(log_fd);
  if (!pid.ok()) {
    close(pipe_fds[0]);
    return pid.status();
  }
  DaemonProcess daemon;
  daemon.pid_ = *pid;
  daemon.stdout_fd_ = pipe_fds[0];
  std::string line;
  while (daemon.address_.empty() || (serve_metrics && daemon.metrics_address_.empty())) {
    if (!ReadLine(daemon.stdout_fd_, &line)) {
      return absl::UnavailableError(
          absl::StrCat("memplan-planner exited before printing its addresses; see ", log_path));
    }
    if (absl::StartsWith(line, "listening on ")) daemon.address_ = line.substr(13);
    if (absl::StartsWith(line, "metrics on ")) daemon.metrics_address_ = line.substr(11);
  }
  return daemon;
}

DaemonProcess::DaemonProcess(DaemonProcess&& other) noexcept
    : pid_(std::exchange(other.pid_, -1)),
      stdout_fd_(std::exchange(other.stdout_fd_, -1)),
      address_(std::move(other.address_)),
      metrics_address_(std::move(other.metrics_address_)) {}

DaemonProcess& DaemonProcess::operator=(DaemonProcess&& other) noexcept {
  if (this != &other) {
    this->~DaemonProcess();
    pid_ = std::exchange(other.pid_, -1);
    stdout_fd_ = std::exchange(other.stdout_fd_, -1);
    address_ = std::move(other.address_);
    metrics_address_ = std::move(other.metrics_address_);
  }
  return *this;
}

DaemonProcess::~DaemonProcess() {
  if (pid_ > 0) {
    kill(pid_, SIGKILL);
    int status = 0;
    waitpid(pid_, &status, 0);
    pid_ = -1;
  }
  if (stdout_fd_ >= 0) {
    close(stdout_fd_);
    stdout_fd_ = -1;
  }
}

int DaemonProcess::metrics_port() const {
  int port = 0;
  const size_t colon = metrics_address_.rfind(':');
  if (colon == std::string::npos || !absl::SimpleAtoi(metrics_address_.substr(colon + 1), &port)) {
    return 0;
  }
  return port;
}

absl::StatusOr<int> DaemonProcess::SignalAndWait(int signal) {
  if (pid_ <= 0) return absl::FailedPreconditionError("the daemon is not running");
  if (kill(pid_, signal) != 0) {
    return absl::InternalError(absl::StrCat("kill: ", std::strerror(errno)));
  }
  int status = 0;
  while (waitpid(pid_, &status, 0) < 0) {
    if (errno != EINTR) return absl::InternalError(absl::StrCat("waitpid: ", std::strerror(errno)));
  }
  pid_ = -1;
  return status;
}

absl::StatusOr<std::pair<int, std::string>> RunToCompletion(const std::string& binary,
                                                            const std::vector<std::string>& args) {
  int pipe_fds[2];
  if (pipe2(pipe_fds, O_CLOEXEC) != 0) {
    return absl::InternalError(absl::StrCat("pipe: ", std::strerror(errno)));
  }
  auto pid = Spawn(binary, args, pipe_fds[1], pipe_fds[1]);
  close(pipe_fds[1]);
  if (!pid.ok()) {
    close(pipe_fds[0]);
    return pid.status();
  }
  std::string out;
  char buf[4096];
  ssize_t n = 0;
  while ((n = read(pipe_fds[0], buf, sizeof(buf))) != 0) {
    if (n < 0) {
      if (errno == EINTR) continue;
      break;
    }
    out.append(buf, static_cast<size_t>(n));
  }
  close(pipe_fds[0]);
  int status = 0;
  waitpid(*pid, &status, 0);
  return std::make_pair(status, out);
}

absl::StatusOr<pid_t> StartProcess(const std::string& binary, const std::vector<std::string>& args,
                                   const std::string& log_path) {
  const int log_fd = open(log_path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (log_fd < 0) {
    return absl::InternalError(absl::StrCat("open ", log_path, ": ", std::strerror(errno)));
  }
  auto pid = Spawn(binary, args, log_fd, log_fd);
  close(log_fd);
  return pid;
}

int FreeLoopbackPort() {
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t length = sizeof(addr);
  const bool ok = fd >= 0 && bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0 &&
                  getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &length) == 0;
  if (fd >= 0) close(fd);
  return ok ? ntohs(addr.sin_port) : 0;
}

void StopProcess(pid_t pid, double grace_seconds) {
  if (pid <= 0) return;
  kill(pid, SIGTERM);
  int status = 0;
  for (double waited = 0; waited < grace_seconds; waited += 0.05) {
    if (waitpid(pid, &status, WNOHANG) == pid) return;
    usleep(50'000);
  }
  kill(pid, SIGKILL);
  waitpid(pid, &status, 0);
}

absl::StatusOr<std::string> HttpGet(int port, const std::string& path) {
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return absl::InternalError(absl::StrCat("socket: ", std::strerror(errno)));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    close(fd);
    return absl::UnavailableError(absl::StrCat("connect: ", std::strerror(errno)));
  }
  const std::string request = absl::StrCat("GET ", path, " HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n");
  if (write(fd, request.data(), request.size()) != static_cast<ssize_t>(request.size())) {
    close(fd);
    return absl::InternalError("short write");
  }
  std::string response;
  char buf[8192];
  ssize_t n = 0;
  while ((n = read(fd, buf, sizeof(buf))) > 0) response.append(buf, static_cast<size_t>(n));
  close(fd);
  const size_t body = response.find("\r\n\r\n");
  if (!absl::StartsWith(response, "HTTP/1.") || response.find(" 200 ") > 12 ||
      body == std::string::npos) {
    return absl::InternalError(absl::StrCat("unexpected HTTP answer: ", response.substr(0, 80)));
  }
  return response.substr(body + 4);
}

}  // namespace memplan::testing
