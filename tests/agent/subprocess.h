// Multi-process tests: a free loopback port, a child process with its output in files and
// torchrun's variables set (the parent's own torchrun variables are left out), and reading files.
#pragma once

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <spawn.h>
#include <sys/socket.h>
#include <unistd.h>

#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/match.h"

extern char** environ;

namespace memplan::testing {

// A socket listening on 127.0.0.1 at a port the kernel picked (fd -1 and port 0 on failure);
// rank 0's store takes it over, so no other process can take the port between choosing and
// binding it.
struct LoopbackListener {
  int fd = -1;
  int port = 0;
};

inline LoopbackListener ListenOnLoopback() {
  LoopbackListener l;
  l.fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(addr);
  if (l.fd < 0 || bind(l.fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
      listen(l.fd, 64) != 0 || getsockname(l.fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    if (l.fd >= 0) close(l.fd);
    return LoopbackListener{};
  }
  l.port = ntohs(addr.sin_port);
  return l;
}

// A loopback port that was free a moment ago (rank 0's store binds it right after).
inline int FreeLoopbackPort() {
  const LoopbackListener l = ListenOnLoopback();
  if (l.fd >= 0) close(l.fd);
  return l.port;
}

struct Child {
  pid_t pid = -1;
  std::string out_path;
  std::string err_path;
};

// Starts argv[0] argv[1..] with stdout in base.out, stderr in base.err and `env` added to the
// parent's environment minus its torchrun variables.
inline Child Spawn(const std::vector<std::string>& args, const std::vector<std::string>& env,
                   const std::string& base) {
  Child c;
  c.out_path = base + ".out";
  c.err_path = base + ".err";
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, 1, c.out_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC,
                                   0644);
  posix_spawn_file_actions_addopen(&actions, 2, c.err_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC,
                                   0644);
  std::vector<std::string> argv_s = args;
  std::vector<char*> argv;
  for (std::string& a : argv_s) argv.push_back(a.data());
  argv.push_back(nullptr);
  std::vector<std::string> env_s;
  for (char** e = environ; *e != nullptr; ++e) {
    const std::string var = *e;
    bool torchrun = false;
    for (const char* name : {"RANK=", "WORLD_SIZE=", "MASTER_ADDR=", "MASTER_PORT=", "LOCAL_RANK=",
                             "LOCAL_WORLD_SIZE="}) {
      torchrun = torchrun || absl::StartsWith(var, name);
    }
    if (!torchrun) env_s.push_back(var);
  }
  env_s.insert(env_s.end(), env.begin(), env.end());
  std::vector<char*> envp;
  for (std::string& e : env_s) envp.push_back(e.data());
  envp.push_back(nullptr);
  if (posix_spawn(&c.pid, argv[0], &actions, nullptr, argv.data(), envp.data()) != 0) c.pid = -1;
  posix_spawn_file_actions_destroy(&actions);
  return c;
}

inline std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

}  // namespace memplan::testing
