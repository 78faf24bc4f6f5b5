#include "common/flags.h"

#include <algorithm>
#include <cassert>
#include <cmath>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/validate.h"

namespace memplan {

absl::Status FlagError(absl::string_view flag, absl::string_view problem) {
  return absl::InvalidArgumentError(absl::StrCat(flag, ": ", problem));
}

std::string RangeText(int64_t lo, int64_t hi) { return absl::StrCat("[", lo, ", ", hi, "]"); }

std::string RangeText(const DoubleRange& range) {
  return absl::StrCat(range.lo_open ? "(" : "[", range.lo, ", ", range.hi,
                      range.hi_open ? ")" : "]");
}

std::string NotOneOf(absl::string_view text, absl::string_view allowed) {
  return absl::StrCat(Quote(text), " is not one of ", allowed);
}

absl::StatusOr<int64_t> ParseIntValue(absl::string_view text, int64_t lo, int64_t hi) {
  int64_t value = 0;
  if (!absl::SimpleAtoi(text, &value)) {
    return absl::InvalidArgumentError(
        absl::StrCat(Quote(text), " is not an integer in ", RangeText(lo, hi)));
  }
  if (value < lo || value > hi) {
    return absl::InvalidArgumentError(absl::StrCat(value, " is outside ", RangeText(lo, hi)));
  }
  return value;
}

absl::StatusOr<double> ParseDoubleValue(absl::string_view text, const DoubleRange& range) {
  double value = 0;
  if (!absl::SimpleAtod(text, &value) || !std::isfinite(value)) {
    return absl::InvalidArgumentError(
        absl::StrCat(Quote(text), " is not a number in ", RangeText(range)));
  }
  const bool above_lo = range.lo_open ? value > range.lo : value >= range.lo;
  const bool below_hi = range.hi_open ? value < range.hi : value <= range.hi;
  if (!above_lo || !below_hi) {
    return absl::InvalidArgumentError(absl::StrCat(value, " is outside ", RangeText(range)));
  }
  return value;
}

absl::StatusOr<double> ParseDoubleValue(absl::string_view text, double lo, double hi) {
  return ParseDoubleValue(text, DoubleRange{lo, hi});
}

absl::StatusOr<int64_t> ParseIntFlag(absl::string_view flag, absl::string_view text, int64_t lo,
                                     int64_t hi) {
  absl::StatusOr<int64_t> value = ParseIntValue(text, lo, hi);
  if (!value.ok()) return FlagError(flag, value.status().message());
  return value;
}

absl::StatusOr<double> ParseDoubleFlag(absl::string_view flag, absl::string_view text,
                                       const DoubleRange& range) {
  absl::StatusOr<double> value = ParseDoubleValue(text, range);
  if (!value.ok()) return FlagError(flag, value.status().message());
  return value;
}

SplitArg SplitFlag(absl::string_view arg) {
  const size_t eq = arg.find('=');
  if (absl::StartsWith(arg, "--") && eq != absl::string_view::npos) {
    return {std::string(arg.substr(0, eq)), std::string(arg.substr(eq + 1))};
  }
  return {std::string(arg), std::nullopt};
}

bool IsFlag(absl::string_view arg) { return arg.size() > 1 && arg[0] == '-'; }

bool VersionRequested(const std::vector<std::string>& args) {
  return std::find(args.begin(), args.end(), "--version") != args.end();
}

FlagSet& FlagSet::Add(absl::string_view name, bool takes_value, Setter set) {
  const bool fresh = !Has(name);
  assert(fresh && "flag registered twice");
  if (fresh) flags_.emplace(std::string(name), Flag{takes_value, std::move(set), false});
  return *this;
}

FlagSet& FlagSet::String(absl::string_view name, std::string* out) {
  return Add(name, true, [out](absl::string_view v) {
    *out = std::string(v);
    return absl::OkStatus();
  });
}

FlagSet& FlagSet::String(absl::string_view name, std::optional<std::string>* out) {
  return Add(name, true, [out](absl::string_view v) {
    *out = std::string(v);
    return absl::OkStatus();
  });
}

FlagSet& FlagSet::NonEmptyString(absl::string_view name, std::string* out) {
  return Add(name, true, [out](absl::string_view v) -> absl::Status {
    if (v.empty()) return absl::InvalidArgumentError("must not be empty");
    *out = std::string(v);
    return absl::OkStatus();
  });
}

FlagSet& FlagSet::Switch(absl::string_view name, bool* out) {
  return Add(name, false, [out](absl::string_view) {
    *out = true;
    return absl::OkStatus();
  });
}

FlagSet& FlagSet::List(absl::string_view name, std::vector<std::string>* out,
                       absl::Span<const char* const> allowed, absl::string_view all_word) {
  std::vector<std::string> names(allowed.begin(), allowed.end());
  std::string allowed_text = absl::StrJoin(names, ", ");
  if (!all_word.empty()) absl::StrAppend(&allowed_text, " (or ", all_word, ")");
  return Add(name, true,
             [out, names = std::move(names), allowed_text,
              all = std::string(all_word)](absl::string_view v) -> absl::Status {
               if (!all.empty() && absl::StripAsciiWhitespace(v) == all) {
                 *out = names;
                 return absl::OkStatus();
               }
               std::vector<std::string> items;
               for (absl::string_view part : absl::StrSplit(v, ',', absl::SkipWhitespace())) {
                 std::string item(absl::StripAsciiWhitespace(part));
                 bool known = false;
                 for (const std::string& n : names) known |= n == item;
                 if (!known) return absl::InvalidArgumentError(NotOneOf(item, allowed_text));
                 items.push_back(std::move(item));
               }
               if (items.empty()) {
                 return absl::InvalidArgumentError(
                     absl::StrCat("expected a comma-separated list of ", allowed_text));
               }
               *out = std::move(items);
               return absl::OkStatus();
             });
}

FlagSet& FlagSet::Custom(absl::string_view name, Setter set) {
  return Add(name, true, std::move(set));
}

FlagSet& FlagSet::CustomSwitch(absl::string_view name, std::function<void()> set) {
  return Add(name, false, [set = std::move(set)](absl::string_view) {
    set();
    return absl::OkStatus();
  });
}

FlagSet& FlagSet::Alias(absl::string_view alias, absl::string_view name) {
  const bool ok = !Has(alias) && flags_.contains(name);
  assert(ok && "alias of an unknown flag, or a name registered twice");
  if (ok) aliases_.emplace(std::string(alias), std::string(name));
  return *this;
}

FlagSet::Flag* FlagSet::Find(absl::string_view name) {
  if (auto a = aliases_.find(name); a != aliases_.end()) name = a->second;
  auto it = flags_.find(name);
  return it == flags_.end() ? nullptr : &it->second;
}

const FlagSet::Flag* FlagSet::Find(absl::string_view name) const {
  if (auto a = aliases_.find(name); a != aliases_.end()) name = a->second;
  auto it = flags_.find(name);
  return it == flags_.end() ? nullptr : &it->second;
}

bool FlagSet::Has(absl::string_view name) const { return Find(name) != nullptr; }

bool FlagSet::TakesValue(absl::string_view name) const {
  const Flag* flag = Find(name);
  return flag != nullptr && flag->takes_value;
}

bool FlagSet::Given(absl::string_view name) const {
  const Flag* flag = Find(name);
  return flag != nullptr && flag->given;
}

std::vector<std::string> FlagSet::Names() const {
  std::vector<std::string> names;
  for (const auto& [name, flag] : flags_) names.push_back(name);
  for (const auto& [alias, name] : aliases_) names.push_back(alias);
  std::sort(names.begin(), names.end());
  return names;
}

absl::Status FlagSet::UnknownFlag(absl::string_view name) const {
  return absl::InvalidArgumentError(
      absl::StrCat("unknown flag ", name, hint_.empty() ? "" : "; ", hint_));
}

absl::Status FlagSet::UnexpectedArgument(absl::string_view arg) const {
  return absl::InvalidArgumentError(
      absl::StrCat("unexpected argument ", Quote(arg), hint_.empty() ? "" : "; ", hint_));
}

absl::Status FlagSet::Apply(absl::string_view name, std::optional<std::string> value,
                            const std::vector<std::string>& args, size_t* i) {
  Flag* flag = Find(name);
  if (flag == nullptr) return UnknownFlag(name);
  if (!flag->takes_value) {
    if (value.has_value()) return FlagError(name, "takes no value");
  } else if (!value.has_value()) {
    if (*i + 1 >= args.size()) return FlagError(name, "needs a value");
    value = args[++*i];
  }
  flag->given = true;
  if (absl::Status s = flag->set(value.value_or("")); !s.ok()) {
    return FlagError(name, s.message());
  }
  return absl::OkStatus();
}

absl::Status FlagSet::ApplyAt(const std::vector<std::string>& args, size_t* i) {
  SplitArg arg = SplitFlag(args[*i]);
  return Apply(arg.name, std::move(arg.value), args, i);
}

absl::Status FlagSet::Parse(const std::vector<std::string>& args,
                            std::vector<std::string>* positionals) {
  for (size_t i = 0; i < args.size(); ++i) {
    if (!IsFlag(args[i])) {
      if (positionals == nullptr) return UnexpectedArgument(args[i]);
      positionals->push_back(args[i]);
      continue;
    }
    if (absl::Status s = ApplyAt(args, &i); !s.ok()) return s;
  }
  return absl::OkStatus();
}

absl::Status FlagSet::Take(std::vector<std::string>* args) {
  std::vector<std::string> rest;
  for (size_t i = 0; i < args->size(); ++i) {
    const std::string& arg = (*args)[i];
    if (!IsFlag(arg) || !Has(SplitFlag(arg).name)) {
      rest.push_back(arg);
      continue;
    }
    if (absl::Status s = ApplyAt(*args, &i); !s.ok()) return s;
  }
  *args = std::move(rest);
  return absl::OkStatus();
}

}  // namespace memplan
