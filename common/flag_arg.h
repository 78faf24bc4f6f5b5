// One command-line argument split into a flag name and its inline value: "--name=value" gives
// ("--name", "value"); anything else is a name without an inline value (a following argument
// may still be its value). Left for the planner flags of `memplan-agent train`
// (TakePlannerFlags, agent/client/planner_flags.cc) until they move onto common/flags.h, whose
// SplitFlag is the same rule.
#pragma once

#include <optional>
#include <string>

namespace memplan {

struct FlagArg {
  std::string name;
  std::optional<std::string> value;
};

inline FlagArg SplitFlagArg(const std::string& arg) {
  const size_t eq = arg.find('=');
  if (arg.rfind("--", 0) == 0 && eq != std::string::npos) {
    return {arg.substr(0, eq), arg.substr(eq + 1)};
  }
  return {arg, std::nullopt};
}

}  // namespace memplan
