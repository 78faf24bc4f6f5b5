// Minimal structured logging (Debian's Abseil has no absl/log): one line per event,
// `ts=... level=... msg="..." key=value ...` on stderr. Thread-safe.
#pragma once

#include <sstream>
#include <string>
#include <string_view>

namespace memplan {

enum class LogLevel { kDebug = 0, kInfo = 1, kWarning = 2, kError = 3 };

// Messages below this level are dropped. Default kInfo.
void SetMinLogLevel(LogLevel level);
LogLevel MinLogLevel();

// Writes one formatted record. `fields` is already "k=v k=v".
void EmitLog(LogLevel level, std::string_view msg, std::string_view fields);

// Builder: LogRecord(kInfo, "plan served").Field("plan_id", id).Field("ms", 3.2);
class LogRecord {
 public:
  LogRecord(LogLevel level, std::string_view msg) : level_(level), msg_(msg) {}
  ~LogRecord();
  LogRecord(const LogRecord&) = delete;
  LogRecord& operator=(const LogRecord&) = delete;

  template <typename T>
  LogRecord& Field(std::string_view key, const T& value) {
    fields_ << ' ' << key << '=';
    AppendValue(value);
    return *this;
  }

 private:
  void AppendValue(const std::string& v) { AppendQuoted(v); }
  void AppendValue(std::string_view v) { AppendQuoted(v); }
  void AppendValue(const char* v) { AppendQuoted(v); }
  template <typename T>
  void AppendValue(const T& v) {
    fields_ << v;
  }
  void AppendQuoted(std::string_view v);

  LogLevel level_;
  std::string msg_;
  std::ostringstream fields_;
};

}  // namespace memplan

#define MEMPLAN_LOG(level, msg) ::memplan::LogRecord(::memplan::LogLevel::level, msg)
