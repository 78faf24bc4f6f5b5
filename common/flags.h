// The one command-line flag parser of every memplan binary: a FlagSet of typed flags (integers and
// numbers with a range, switches, strings, choices from an allow-list, comma lists, custom values),
// "--name=value" and "--name value", aliases, and one error format. Thread-compatible: a FlagSet
// writes into the variables its flags were registered with.
//
// [Flag errors] Every error is INVALID_ARGUMENT and reads "<flag>: <problem>", <flag> as typed:
//   --batch: 100000 is outside [1, 65536]      --batch: "two" is not an integer in [1, 65536]
//   --lr: "fast" is not a number in [0, 1000]  --optimizer: "adamx" is not one of adamw, sgd
//   --seq: needs a value                       --plain: takes no value
//   --db: must not be empty                    --lora-targets: "qkv" is not one of q_proj, ...
// and for arguments that are no flag of the set: `unknown flag --bacth` and
// `unexpected argument "x"`, each followed by the set's hint ("; see --help").
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"

namespace memplan {

// "<flag>: <problem>" as INVALID_ARGUMENT.
absl::Status FlagError(absl::string_view flag, absl::string_view problem);

// The problems of [Flag errors] without the flag, for values that a FlagSet does not parse itself
// (an environment variable, a part of a flag's value): INVALID_ARGUMENT whose message is the
// problem alone, e.g. `"two" is not an integer in [1, 256]` or `0 is outside [1, 256]`. Surrounding
// whitespace is skipped (absl::SimpleAtoi's rule).
absl::StatusOr<int64_t> ParseIntValue(absl::string_view text, int64_t lo, int64_t hi);
// A finite number in the range; an open end (lo_open / hi_open) excludes the bound itself and is
// written "(" or ")".
struct DoubleRange {
  double lo = 0;
  double hi = 0;
  bool lo_open = false;
  bool hi_open = false;
};
absl::StatusOr<double> ParseDoubleValue(absl::string_view text, const DoubleRange& range);
absl::StatusOr<double> ParseDoubleValue(absl::string_view text, double lo, double hi);
// "[1, 256]", "[0, 1)".
std::string RangeText(int64_t lo, int64_t hi);
std::string RangeText(const DoubleRange& range);
// `"<text>" is not one of <allowed>` (the text quoted as common/validate.h's Quote does).
std::string NotOneOf(absl::string_view text, absl::string_view allowed);

// ParseIntValue / ParseDoubleValue with the flag in front of the problem (FlagError).
absl::StatusOr<int64_t> ParseIntFlag(absl::string_view flag, absl::string_view text, int64_t lo,
                                     int64_t hi);
absl::StatusOr<double> ParseDoubleFlag(absl::string_view flag, absl::string_view text,
                                       const DoubleRange& range);

// A flag's name and allowed range, declared once for flags that several binaries take
// (common/request_flags.h).
struct IntFlagSpec {
  absl::string_view name;
  int64_t lo;
  int64_t hi;
};
struct DoubleFlagSpec {
  absl::string_view name;
  DoubleRange range;
};

// One argument split into a flag name and its inline value: "--name=value" gives ("--name",
// "value"); anything else is a name without an inline value.
struct SplitArg {
  std::string name;
  std::optional<std::string> value;
};
SplitArg SplitFlag(absl::string_view arg);
// Whether an argument is a flag: starts with '-' and is longer than "-" (which names stdin).
bool IsFlag(absl::string_view arg);
// Whether `--version` is among `args`. Every binary checks this before parsing, so --version wins
// over every other flag (as --help does) and never reads as a flag that wants a value.
bool VersionRequested(const std::vector<std::string>& args);

class FlagSet {
 public:
  // Takes a flag's value; on refusal returns INVALID_ARGUMENT with the problem alone (the FlagSet
  // puts the flag's name in front).
  using Setter = std::function<absl::Status(absl::string_view value)>;
  // A choice's names and values, in the order the error lists them.
  template <typename V>
  using Choices = std::vector<std::pair<std::string, V>>;

  FlagSet() = default;
  explicit FlagSet(std::string hint) : hint_(std::move(hint)) {}

  // Registration. Names carry their dashes ("--seq", "-h"); registering a name twice is a
  // programming error (the second registration is ignored in release builds, asserts in debug).
  // `out` may be a plain variable or a std::optional of one; it is written only when the flag is
  // given.
  FlagSet& String(absl::string_view name, std::string* out);
  FlagSet& String(absl::string_view name, std::optional<std::string>* out);
  FlagSet& NonEmptyString(absl::string_view name, std::string* out);  // "must not be empty"
  FlagSet& Switch(absl::string_view name, bool* out);                 // no value; sets true
  template <typename T>
  FlagSet& Int(absl::string_view name, T* out, int64_t lo, int64_t hi);
  template <typename T>
  FlagSet& Int(const IntFlagSpec& spec, T* out) {
    return Int(spec.name, out, spec.lo, spec.hi);
  }
  template <typename T>
  FlagSet& Double(absl::string_view name, T* out, const DoubleRange& range);
  template <typename T>
  FlagSet& Double(absl::string_view name, T* out, double lo, double hi) {
    return Double(name, out, DoubleRange{lo, hi});
  }
  template <typename T>
  FlagSet& Double(const DoubleFlagSpec& spec, T* out) {
    return Double(spec.name, out, spec.range);
  }
  // One of `choices` by exact name.
  template <typename T, typename V>
  FlagSet& Choice(absl::string_view name, T* out, Choices<V> choices);
  // A value `parse` reads (nullopt: refused with NotOneOf(value, allowed)); for choices with
  // several spellings.
  template <typename T, typename V>
  FlagSet& Choice(absl::string_view name, T* out,
                  std::function<std::optional<V>(absl::string_view)> parse, std::string allowed);
  // A comma-separated list of `allowed` names (whitespace around each ignored, at least one), or
  // `all_word` (when not empty) for all of them in `allowed` order.
  FlagSet& List(absl::string_view name, std::vector<std::string>* out,
                absl::Span<const char* const> allowed, absl::string_view all_word = "");
  FlagSet& Custom(absl::string_view name, Setter set);
  FlagSet& CustomSwitch(absl::string_view name, std::function<void()> set);
  // `alias` means `name` (registered before); errors name the spelling given.
  FlagSet& Alias(absl::string_view alias, absl::string_view name);

  // Parses `args` in order (program name excluded). Non-flag arguments go to *positionals, or
  // are refused when positionals is null. A value flag takes the next argument whatever it is.
  absl::Status Parse(const std::vector<std::string>& args,
                     std::vector<std::string>* positionals = nullptr);
  // Removes this set's flags (and their values) from *args into their variables, leaving every
  // other argument in order: for commands whose flags several parsers share.
  absl::Status Take(std::vector<std::string>* args);
  // One step of a parser with its own argument grammar (the memplan CLI's command words):
  // applies the flag at (*args)[*i], taking its value from the next argument when it has no
  // "=value" (and advancing *i past it). Unknown flags are refused.
  absl::Status ApplyAt(const std::vector<std::string>& args, size_t* i);

  bool Has(absl::string_view name) const;         // registered (as a name or an alias)
  bool TakesValue(absl::string_view name) const;  // false for switches and unknown names
  bool Given(absl::string_view name) const;       // given to Parse/Take/ApplyAt (any spelling)
  std::vector<std::string> Names() const;         // registered names and aliases, sorted

  absl::Status UnknownFlag(absl::string_view name) const;
  absl::Status UnexpectedArgument(absl::string_view arg) const;

 private:
  struct Flag {
    bool takes_value = true;
    Setter set;
    bool given = false;
  };
  FlagSet& Add(absl::string_view name, bool takes_value, Setter set);
  Flag* Find(absl::string_view name);
  const Flag* Find(absl::string_view name) const;
  absl::Status Apply(absl::string_view name, std::optional<std::string> value,
                     const std::vector<std::string>& args, size_t* i);

  template <typename T>
  struct Target {
    using Value = T;
    static void Set(T* out, Value v) { *out = std::move(v); }
  };
  template <typename T>
  struct Target<std::optional<T>> {
    using Value = T;
    static void Set(std::optional<T>* out, Value v) { *out = std::move(v); }
  };

  std::string hint_;
  std::map<std::string, Flag, std::less<>> flags_;
  std::map<std::string, std::string, std::less<>> aliases_;  // alias -> name
};

template <typename T>
FlagSet& FlagSet::Int(absl::string_view name, T* out, int64_t lo, int64_t hi) {
  static_assert(std::is_integral_v<typename Target<T>::Value>, "Int needs an integer variable");
  return Add(name, true, [out, lo, hi](absl::string_view v) -> absl::Status {
    absl::StatusOr<int64_t> x = ParseIntValue(v, lo, hi);
    if (!x.ok()) return x.status();
    Target<T>::Set(out, static_cast<typename Target<T>::Value>(*x));
    return absl::OkStatus();
  });
}

template <typename T>
FlagSet& FlagSet::Double(absl::string_view name, T* out, const DoubleRange& range) {
  return Add(name, true, [out, range](absl::string_view v) -> absl::Status {
    absl::StatusOr<double> x = ParseDoubleValue(v, range);
    if (!x.ok()) return x.status();
    Target<T>::Set(out, *x);
    return absl::OkStatus();
  });
}

template <typename T, typename V>
FlagSet& FlagSet::Choice(absl::string_view name, T* out, Choices<V> choices) {
  std::string allowed;
  for (const auto& [word, value] : choices) {
    if (!allowed.empty()) allowed += ", ";
    allowed += word;
  }
  return Add(name, true,
             [out, choices = std::move(choices), allowed](absl::string_view v) -> absl::Status {
               for (const auto& [word, value] : choices) {
                 if (v == word) {
                   Target<T>::Set(out, value);
                   return absl::OkStatus();
                 }
               }
               return absl::InvalidArgumentError(NotOneOf(v, allowed));
             });
}

template <typename T, typename V>
FlagSet& FlagSet::Choice(absl::string_view name, T* out,
                         std::function<std::optional<V>(absl::string_view)> parse,
                         std::string allowed) {
  return Add(name, true,
             [out, parse = std::move(parse), allowed](absl::string_view v) -> absl::Status {
               std::optional<V> value = parse(v);
               if (!value.has_value()) return absl::InvalidArgumentError(NotOneOf(v, allowed));
               Target<T>::Set(out, *std::move(value));
               return absl::OkStatus();
             });
}

}  // namespace memplan
