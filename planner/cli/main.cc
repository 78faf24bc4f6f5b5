// memplan: command-line client of the memplan planner daemon (see planner/cli/README.md).
#include <iostream>
#include <string>
#include <vector>

#include "planner/cli/cli_runner.h"

int main(int argc, char** argv) {
  std::vector<std::string> args(argv + 1, argv + argc);
  return memplan::cli::RunCli(args, std::cout, std::cerr);
}
