// memplan-plan-bench: times MakePlan (search + alternatives + limits) on preset models and
// cards and prints p50 / p99 / max latency. Usage: memplan-plan-bench [--runs=N] [--verbose]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include "common/build_info.h"
#include "common/flags.h"
#include "common/presets.h"
#include "planner/core/plan_engine.h"

namespace {

struct Case {
  const char* model;
  const char* card;
  int64_t micro_batch;
  int64_t seq_len;
  int32_t world_size;
};

double Percentile(std::vector<double> v, double q) {
  std::sort(v.begin(), v.end());
  const size_t i = static_cast<size_t>(q * static_cast<double>(v.size() - 1) + 0.5);
  return v[std::min(i, v.size() - 1)];
}

double Gib(int64_t b) { return static_cast<double>(b) / static_cast<double>(1 << 30); }

}  // namespace

int main(int argc, char** argv) {
  int runs = 200;
  bool verbose = false;
  std::string only_model;
  bool skip_limits = false;
  bool help = false;
  const std::vector<std::string> args(argv + 1, argv + argc);
  if (memplan::VersionRequested(args)) {
    std::printf("%s\n", memplan::build_info::VersionLine("memplan-plan-bench").c_str());
    return 0;
  }
  memplan::FlagSet flags;
  flags.Int("--runs", &runs, 1, 1 << 20)
      .Switch("--verbose", &verbose)
      .Switch("--skip-limits", &skip_limits)
      .String("--model", &only_model)
      .Switch("--help", &help)
      .Alias("-h", "--help");
  const absl::Status parsed = flags.Parse(args);
  if (!parsed.ok() || help) {
    if (!parsed.ok()) {
      std::fprintf(stderr, "memplan-plan-bench: %s\n", std::string(parsed.message()).c_str());
    }
    std::fprintf(help ? stdout : stderr,
                 "usage: memplan-plan-bench [--runs=N (default 200)] [--verbose] "
                 "[--model=PRESET (only its cases)] [--skip-limits]\n"
                 "Times MakePlan (search, alternatives, limits) on preset models and cards and "
                 "prints p50/p99/max latency per case.\n");
    return help ? 0 : 2;
  }
  const Case cases[] = {
      {"llama-3.1-70b", "h100-80gb", 1, 4096, 8},   {"llama-3.1-70b", "h100-80gb", 1, 4096, 1},
      {"llama-3.1-405b", "h100-80gb", 1, 4096, 8},  {"llama-3.1-405b", "h100-80gb", 1, 4096, 1},
      {"llama-3.1-405b", "h100-80gb", 1, 4096, 64}, {"llama-3.1-8b", "h100-80gb", 1, 4096, 1},
  };
  std::printf("%-16s %-10s %-9s %3s %6s %9s %9s %9s %10s  %s\n", "model", "card", "BxS", "W",
              "runs", "p50_ms", "p99_ms", "max_ms", "evaluated", "verdict");
  for (const Case& c : cases) {
    if (!only_model.empty() && only_model != c.model) continue;
    memplan::PlanInputs in;
    in.arch = *memplan::FindModelPreset(c.model);
    in.hardware = *memplan::FindHardwarePreset(c.card);
    in.workload.micro_batch = c.micro_batch;
    in.workload.seq_len = c.seq_len;
    in.workload.world_size = c.world_size;
    in.skip_limits = skip_limits;
    std::vector<double> ms;
    ms.reserve(static_cast<size_t>(runs));
    memplan::PlanOutcome last;
    for (int r = 0; r < runs; ++r) {
      const auto t0 = std::chrono::steady_clock::now();
      auto outcome = memplan::MakePlan(in);
      const auto t1 = std::chrono::steady_clock::now();
      if (!outcome.ok()) {
        std::fprintf(stderr, "MakePlan failed: %s\n", outcome.status().ToString().c_str());
        return 1;
      }
      ms.push_back(std::chrono::duration<double, std::milli>(t1 - t0).count());
      if (r + 1 == runs) last = *std::move(outcome);
    }
    char bxs[32];
    std::snprintf(bxs, sizeof(bxs), "%lldx%lld", static_cast<long long>(c.micro_batch),
                  static_cast<long long>(c.seq_len));
    std::printf("%-16s %-10s %-9s %3d %6d %9.2f %9.2f %9.2f %10lld  %s peak %.1f GiB, %.0f tok/s\n",
                c.model, c.card, bxs, c.world_size, runs, Percentile(ms, 0.5), Percentile(ms, 0.99),
                *std::max_element(ms.begin(), ms.end()),
                static_cast<long long>(last.plans_evaluated), last.fits ? "fits" : "no-fit",
                Gib(last.prediction.peak_bytes), last.prediction.tokens_per_second);
    if (verbose) {
      std::printf(
          "  reason: %s\n  limits: max_micro_batch %lld, max_seq_len %lld, min_gpu %.1f "
          "GiB\n",
          last.reason.c_str(), static_cast<long long>(last.max_micro_batch),
          static_cast<long long>(last.max_seq_len), Gib(last.min_gpu_memory_bytes));
      for (size_t i = 0; i < last.alternative_notes.size(); ++i) {
        std::printf("  alt %zu: %s\n", i + 1, last.alternative_notes[i].c_str());
      }
    }
  }
  return 0;
}
