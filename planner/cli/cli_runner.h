// Runs one `memplan` command line against a planner daemon over gRPC and prints the answer.
// Returns the process exit status: 0 success, 1 the planner returned an error or could not be
// reached, 2 bad usage or unreadable local input. Thread-compatible.
#pragma once

#include <ostream>
#include <string>
#include <vector>

namespace memplan::cli {

// `args` excludes the program name. Results go to `out`, diagnostics to `err`.
int RunCli(const std::vector<std::string>& args, std::ostream& out, std::ostream& err);

}  // namespace memplan::cli
