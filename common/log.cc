#include "common/log.h"

#include <atomic>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <mutex>

namespace memplan {
namespace {

std::atomic<int> g_min_level{static_cast<int>(LogLevel::kInfo)};
std::mutex g_write_mu;

const char* LevelName(LogLevel level) {
  switch (level) {
    case LogLevel::kDebug: return "debug";
    case LogLevel::kInfo: return "info";
    case LogLevel::kWarning: return "warning";
    case LogLevel::kError: return "error";
  }
  return "info";
}

}  // namespace

void SetMinLogLevel(LogLevel level) { g_min_level.store(static_cast<int>(level)); }
LogLevel MinLogLevel() { return static_cast<LogLevel>(g_min_level.load()); }

void EmitLog(LogLevel level, std::string_view msg, std::string_view fields) {
  if (static_cast<int>(level) < g_min_level.load()) return;
  const auto now = std::chrono::system_clock::now();
  const std::time_t secs = std::chrono::system_clock::to_time_t(now);
  const auto millis =
      std::chrono::duration_cast<std::chrono::milliseconds>(now.time_since_epoch()).count() % 1000;
  std::tm tm{};
  gmtime_r(&secs, &tm);
  char stamp[32];
  std::strftime(stamp, sizeof(stamp), "%Y-%m-%dT%H:%M:%S", &tm);
  std::lock_guard<std::mutex> lock(g_write_mu);
  std::fprintf(stderr, "ts=%s.%03dZ level=%s msg=\"%.*s\"%.*s\n", stamp, static_cast<int>(millis),
               LevelName(level), static_cast<int>(msg.size()), msg.data(),
               static_cast<int>(fields.size()), fields.data());
}

LogRecord::~LogRecord() { EmitLog(level_, msg_, fields_.str()); }

void LogRecord::AppendQuoted(std::string_view v) {
  fields_ << '"';
  for (char c : v) {
    if (c == '"' || c == '\\') fields_ << '\\';
    if (c == '\n') {
      fields_ << "\\n";
      continue;
    }
    fields_ << c;
  }
  fields_ << '"';
}

}  // namespace memplan
