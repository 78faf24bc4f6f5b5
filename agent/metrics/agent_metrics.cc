#include "agent/metrics/agent_metrics.h"

#include <utility>

#include "absl/synchronization/mutex.h"
#include "common/metrics_server.h"
#include "prometheus/counter.h"
#include "prometheus/family.h"
#include "prometheus/gauge.h"
#include "prometheus/registry.h"

namespace memplan {

struct AgentMetrics::Impl {
  // The series of one plan_id.
  struct Series {
    prometheus::Counter* steps = nullptr;
    prometheus::Gauge* step_seconds = nullptr;
    prometheus::Gauge* tokens_per_second = nullptr;
    prometheus::Gauge* allocated = nullptr;
    prometheus::Gauge* reserved = nullptr;
    prometheus::Gauge* peak_allocated = nullptr;
    prometheus::Gauge* peak_reserved = nullptr;
    prometheus::Counter* chunk_h2d = nullptr;
    prometheus::Gauge* predicted_peak = nullptr;
    prometheus::Gauge* predicted_step_seconds = nullptr;
    prometheus::Gauge* predicted_tokens_per_second = nullptr;
    prometheus::Gauge* loss = nullptr;
    prometheus::Gauge* step = nullptr;
  };

  explicit Impl(std::shared_ptr<prometheus::Registry> r)
      : registry(std::move(r)),
        steps(Counter("memplan_agent_steps_total", "Optimizer steps completed by this run.")),
        step_seconds(Gauge("memplan_agent_step_seconds", "Wall time of the last optimizer step.")),
        tokens_per_second(
            Gauge("memplan_agent_tokens_per_second", "Tokens per second of the last step.")),
        allocated(Gauge("memplan_agent_device_allocated_bytes",
                        "Device memory held by the caching allocator's tensors, after the step.")),
        reserved(Gauge("memplan_agent_device_reserved_bytes",
                       "Device memory reserved by the caching allocator, after the step.")),
        peak_allocated(Gauge("memplan_agent_step_peak_allocated_bytes",
                             "Peak allocated device memory during the last step.")),
        peak_reserved(Gauge("memplan_agent_step_peak_reserved_bytes",
                            "Peak reserved device memory during the last step.")),
        chunk_bytes(Counter("memplan_agent_chunk_bytes_total",
                            "Parameter chunk bytes moved between host and device, by direction.")),
        predicted_peak(Gauge("memplan_agent_predicted_peak_bytes",
                             "The planner's predicted steady-state peak for this run's plan.")),
        predicted_step_seconds(Gauge("memplan_agent_predicted_step_seconds",
                                     "The planner's predicted step time for this run's plan.")),
        predicted_tokens_per_second(
            Gauge("memplan_agent_predicted_tokens_per_second",
                  "The planner's predicted tokens per second for this run's plan.")),
        loss(Gauge("memplan_agent_loss", "Training loss of the last optimizer step.")),
        step(Gauge("memplan_agent_step",
                   "Optimizer steps of the run so far, those before a resume included.")) {
    RegisterBuildInfo(*registry);
  }

  prometheus::Family<prometheus::Gauge>& Gauge(const char* name, const char* help) {
    return prometheus::BuildGauge().Name(name).Help(help).Register(*registry);
  }
  prometheus::Family<prometheus::Counter>& Counter(const char* name, const char* help) {
    return prometheus::BuildCounter().Name(name).Help(help).Register(*registry);
  }

  std::shared_ptr<prometheus::Registry> registry;
  prometheus::Family<prometheus::Counter>& steps;
  prometheus::Family<prometheus::Gauge>& step_seconds;
  prometheus::Family<prometheus::Gauge>& tokens_per_second;
  prometheus::Family<prometheus::Gauge>& allocated;
  prometheus::Family<prometheus::Gauge>& reserved;
  prometheus::Family<prometheus::Gauge>& peak_allocated;
  prometheus::Family<prometheus::Gauge>& peak_reserved;
  prometheus::Family<prometheus::Counter>& chunk_bytes;
  prometheus::Family<prometheus::Gauge>& predicted_peak;
  prometheus::Family<prometheus::Gauge>& predicted_step_seconds;
  prometheus::Family<prometheus::Gauge>& predicted_tokens_per_second;
  prometheus::Family<prometheus::Gauge>& loss;
  prometheus::Family<prometheus::Gauge>& step;
  std::unique_ptr<MetricsServer> server;

  absl::Mutex mu;
  Series series ABSL_GUARDED_BY(mu);
};

absl::StatusOr<std::unique_ptr<AgentMetrics>> AgentMetrics::Start(const std::string& address) {
  auto impl = std::make_unique<Impl>(std::make_shared<prometheus::Registry>());
  absl::StatusOr<std::unique_ptr<MetricsServer>> server =
      MetricsServer::Start(address, impl->registry);
  if (!server.ok()) return server.status();
  impl->server = *std::move(server);
  return std::unique_ptr<AgentMetrics>(new AgentMetrics(std::move(impl)));
}

AgentMetrics::AgentMetrics(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
AgentMetrics::~AgentMetrics() = default;

int AgentMetrics::port() const { return impl_->server->port(); }

void AgentMetrics::SetPlan(const AgentPlanInfo& plan) {
  const prometheus::Labels labels = {{"plan_id", plan.plan_id.empty() ? "none" : plan.plan_id}};
  Impl& m = *impl_;
  absl::MutexLock lock(&m.mu);
  m.series.steps = &m.steps.Add(labels);
  m.series.step_seconds = &m.step_seconds.Add(labels);
  m.series.tokens_per_second = &m.tokens_per_second.Add(labels);
  m.series.allocated = &m.allocated.Add(labels);
  m.series.reserved = &m.reserved.Add(labels);
  m.series.peak_allocated = &m.peak_allocated.Add(labels);
  m.series.peak_reserved = &m.peak_reserved.Add(labels);
  prometheus::Labels h2d = labels;
  h2d["direction"] = "h2d";
  m.series.chunk_h2d = &m.chunk_bytes.Add(h2d);
  m.series.predicted_peak = &m.predicted_peak.Add(labels);
  m.series.predicted_step_seconds = &m.predicted_step_seconds.Add(labels);
  m.series.predicted_tokens_per_second = &m.predicted_tokens_per_second.Add(labels);
  m.series.loss = &m.loss.Add(labels);
  m.series.step = &m.step.Add(labels);
  m.series.predicted_peak->Set(static_cast<double>(plan.predicted_peak_bytes));
  m.series.predicted_step_seconds->Set(plan.predicted_step_seconds);
  m.series.predicted_tokens_per_second->Set(plan.predicted_tokens_per_second);
}

void AgentMetrics::ObserveStep(const AgentStepSample& step) {
  absl::MutexLock lock(&impl_->mu);
  Impl::Series& s = impl_->series;
  if (s.steps == nullptr) return;  // SetPlan first
  s.steps->Increment();
  s.step_seconds->Set(step.seconds);
  s.tokens_per_second->Set(step.tokens_per_second);
  s.allocated->Set(static_cast<double>(step.allocated_bytes));
  s.reserved->Set(static_cast<double>(step.reserved_bytes));
  s.peak_allocated->Set(static_cast<double>(step.peak_allocated_bytes));
  s.peak_reserved->Set(static_cast<double>(step.peak_reserved_bytes));
  if (step.chunk_upload_bytes > 0)
    s.chunk_h2d->Increment(static_cast<double>(step.chunk_upload_bytes));
  s.loss->Set(step.loss);
  s.step->Set(static_cast<double>(step.step));
}

}  // namespace memplan
