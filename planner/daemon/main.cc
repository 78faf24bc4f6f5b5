// memplan-planner: parses flags, starts the daemon, waits for SIGTERM/SIGINT, shuts down.
#include <pthread.h>
#include <signal.h>

#include <cstdio>
#include <string>
#include <vector>

#include "common/build_info.h"
#include "common/flags.h"
#include "common/log.h"
#include "planner/daemon/daemon_options.h"
#include "planner/daemon/planner_daemon.h"

int main(int argc, char** argv) {
  std::vector<std::string> args(argv + 1, argv + argc);
  if (memplan::VersionRequested(args)) {
    std::printf("%s\n", memplan::build_info::VersionLine("memplan-planner").c_str());
    return 0;
  }
  auto options = memplan::ParseDaemonOptions(args);
  if (!options.ok()) {
    std::fprintf(stderr, "memplan-planner: %s\n", std::string(options.status().message()).c_str());
    return 2;
  }
  if (options->help) {
    std::fputs(memplan::DaemonUsage().c_str(), stdout);
    return 0;
  }
  memplan::SetMinLogLevel(options->log_level);
  // A client that closes its connection mid-answer must cost an EPIPE, not the process.
  signal(SIGPIPE, SIG_IGN);

  // Block the stop signals before any thread exists so every thread inherits the mask and the
  // signals queue up for sigwait below instead of killing the process mid-write.
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGTERM);
  sigaddset(&stop_signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);

  auto daemon = memplan::PlannerDaemon::Start(*options);
  if (!daemon.ok()) {
    MEMPLAN_LOG(kError, "planner failed to start")
        .Field("error", std::string(daemon.status().message()));
    return 1;
  }
  // Machine-readable lines for scripts and tests (the port is only known after binding).
  std::printf("listening on %s\n", (*daemon)->listen_address().c_str());
  if (!(*daemon)->metrics_address().empty()) {
    std::printf("metrics on %s\n", (*daemon)->metrics_address().c_str());
  }
  if (!(*daemon)->webhook_address().empty()) {
    std::printf("webhook on %s\n", (*daemon)->webhook_address().c_str());
  }
  std::fflush(stdout);

  int signal_number = 0;
  sigwait(&stop_signals, &signal_number);
  MEMPLAN_LOG(kInfo, "stopping")
      .Field("signal", signal_number == SIGTERM ? "SIGTERM" : "SIGINT")
      .Field("grace_seconds", options->shutdown_grace_seconds);
  (*daemon)->Shutdown(options->shutdown_grace_seconds);
  daemon->reset();
  return 0;
}
