#include "agent/train/nf4_shard_reader.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>
#include <utility>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "agent/core/seconds_since.h"
#include "agent/quant/nf4.h"
#include "common/log.h"
#include "common/nf4_bytes.h"
#include "common/param_shapes.h"
#include "common/status.h"

namespace memplan {
namespace {
using Clock = std::chrono::steady_clock;
}  // namespace

class Nf4ShardReader::Budget {
 public:
  Budget(Nf4ShardReader& reader, int64_t bytes) : reader_(reader), bytes_(bytes) {
    const Clock::time_point start = Clock::now();
    std::unique_lock<std::mutex> lock(reader_.mu_);
    reader_.changed_.wait(lock, [&] {
      return reader_.in_flight_bytes_ == 0 ||
             reader_.in_flight_bytes_ + bytes_ <= kNf4LoadBudgetBytes;
    });
    reader_.in_flight_bytes_ += bytes_;
    reader_.counts_.budget_wait_seconds += SecondsSince(start);
  }
  ~Budget() {
    {
      std::lock_guard<std::mutex> lock(reader_.mu_);
      reader_.in_flight_bytes_ -= bytes_;
    }
    reader_.changed_.notify_all();
  }

 private:
  Nf4ShardReader& reader_;
  const int64_t bytes_;
};

Nf4ShardReader::Nf4ShardReader(const LlamaModel& model, ChunkManager::RangeReader values)
    : values_(std::move(values)),
      device_(model.options().device),
      work_bytes_per_element_(4 + DTypeBytes(model.options().dtype)) {
  for (const ParamShape& p : HfParamShapes(model.spec())) numel_[p.name] = p.numel();
  for (const std::string& name : model.QuantizedWeightNames()) {
    const int w = static_cast<int>(weights_.size());
    Weight weight;
    weight.name = name;
    weight.numel = numel_.at(name);
    weights_.push_back(std::move(weight));
    parts_[name + std::string(kNf4DataSuffix)] = {w, Part::kData};
    parts_[name + std::string(kNf4AbsmaxCodeSuffix)] = {w, Part::kAbsmaxCode};
    parts_[name + std::string(kNf4AbsmaxScaleSuffix)] = {w, Part::kAbsmaxScale};
  }
}

absl::StatusOr<torch::Tensor> Nf4ShardReader::Read(const std::string& name, int64_t begin,
                                                   int64_t len) {
  auto it = parts_.find(name);
  if (it == parts_.end()) {
    // The base's other tensors (embedding, head, norms) count against the same budget, by the
    // range read (InitialValues draws the segments around it only: [Segmented draws]).
    const Budget hold(*this, len * work_bytes_per_element_);
    return values_(name, begin, len);
  }
  const auto [w, part] = it->second;
  if (part == Part::kData) return DataRange(w, begin, len);
  RETURN_IF_ERROR(Whole(w, /*want_data=*/false).status());
  std::lock_guard<std::mutex> lock(mu_);
  Weight& weight = weights_[w];
  // Each part is read once per load: what this rank stores of it is taken, the rest dropped.
  torch::Tensor& held = part == Part::kAbsmaxCode ? weight.absmax_code : weight.absmax_scale;
  if (!held.defined() || begin < 0 || begin + len > held.numel()) {
    return absl::InternalError(absl::StrCat(name, ": elements [", begin, ", ", begin + len,
                                            ") read twice or out of range"));
  }
  torch::Tensor out = held.narrow(0, begin, len).clone();
  held = torch::Tensor();
  return out;
}

absl::StatusOr<torch::Tensor> Nf4ShardReader::Whole(int w, bool want_data) {
  const std::string& name = weights_[w].name;
  const int64_t numel = weights_[w].numel;
  {
    std::unique_lock<std::mutex> lock(mu_);
    Weight& weight = weights_[w];
    if (weight.state != Weight::kNone) {
      changed_.wait(lock, [&] { return weight.state == Weight::kDone; });
      RETURN_IF_ERROR(weight.status);
      return torch::Tensor();
    }
    weight.state = Weight::kComputing;
  }
  torch::Tensor data;
  quant::Nf4AbsmaxState state;
  double read_seconds = 0, quantize_seconds = 0;
  absl::Status status = ReadAndQuantize(
      name, 0, numel,
      [&](const torch::Tensor& on_device) -> absl::Status {
        if (want_data) {
          ASSIGN_OR_RETURN(quant::Nf4Tensor q, quant::QuantizeNf4(on_device, kNf4Blocksize));
          data = q.data.to(torch::kCPU);
          state = {q.absmax_code.to(torch::kCPU), q.absmax_scale.to(torch::kCPU), q.absmax_offset};
        } else {
          ASSIGN_OR_RETURN(state, quant::QuantizeNf4Absmax(on_device, kNf4Blocksize));
          state.absmax_code = state.absmax_code.to(torch::kCPU);
          state.absmax_scale = state.absmax_scale.to(torch::kCPU);
        }
        return absl::OkStatus();
      },
      &read_seconds, &quantize_seconds);
  if (!status.ok()) status = absl::Status(status.code(), absl::StrCat(name, ": ", status.message()));
  {
    std::lock_guard<std::mutex> lock(mu_);
    Weight& weight = weights_[w];
    weight.state = Weight::kDone;
    weight.status = status;
    weight.absmax_code = std::move(state.absmax_code);
    weight.absmax_scale = std::move(state.absmax_scale);
    weight.offset = state.absmax_offset;
    counts_.elements_read += numel;
    counts_.weights_read_whole += 1;
    counts_.read_seconds += read_seconds;
    counts_.quantize_seconds += quantize_seconds;
    if (data.defined()) counts_.data_bytes_quantized += data.numel();
    LogProgressLocked();
  }
  changed_.notify_all();
  RETURN_IF_ERROR(status);
  return data;
}

absl::StatusOr<torch::Tensor> Nf4ShardReader::DataRange(int w, int64_t begin, int64_t len) {
  const std::string& name = weights_[w].name;
  const int64_t numel = weights_[w].numel;
  const int64_t data_bytes = Nf4Parts(numel).data_bytes;
  if (begin < 0 || len <= 0 || begin + len > data_bytes) {
    return absl::OutOfRangeError(absl::StrCat(name, std::string(kNf4DataSuffix), ": bytes [", begin, ", ",
                                              begin + len, ") of ", data_bytes));
  }
  if (begin == 0 && len == data_bytes) {
    // The whole weight: its absmax state comes with it, unless another part's read took it.
    ASSIGN_OR_RETURN(torch::Tensor data, Whole(w, /*want_data=*/true));
    if (data.defined()) return data;
  }
  // The whole blocks around elements [2 begin, 2 (begin + len)).
  const int64_t first_block = 2 * begin / kNf4Blocksize;
  const int64_t first = first_block * kNf4Blocksize;
  const int64_t end = std::min(
      (std::min(2 * (begin + len), numel) + kNf4Blocksize - 1) / kNf4Blocksize * kNf4Blocksize,
      numel);
  torch::Tensor data;
  double read_seconds = 0, quantize_seconds = 0;
  RETURN_IF_ERROR(ReadAndQuantize(
      name, first, end - first,
      [&](const torch::Tensor& on_device) -> absl::Status {
        ASSIGN_OR_RETURN(data,
                         quant::QuantizeNf4Blocks(on_device, first_block, numel, kNf4Blocksize));
        data = data.to(torch::kCPU);
        return absl::OkStatus();
      },
      &read_seconds, &quantize_seconds));
  {
    std::lock_guard<std::mutex> lock(mu_);
    counts_.elements_read += end - first;
    counts_.data_bytes_quantized += data.numel();
    counts_.read_seconds += read_seconds;
    counts_.quantize_seconds += quantize_seconds;
    LogProgressLocked();
  }
  return data.narrow(0, begin - first / 2, len).clone();
}

absl::Status Nf4ShardReader::ReadAndQuantize(
    const std::string& name, int64_t first, int64_t count,
    const std::function<absl::Status(const torch::Tensor& on_device)>& quantize,
    double* read_seconds, double* quantize_seconds) {
  const Budget hold(*this, count * work_bytes_per_element_);
  const Clock::time_point read_start = Clock::now();
  ASSIGN_OR_RETURN(const torch::Tensor values, values_(name, first, count));
  *read_seconds = SecondsSince(read_start);
  std::unique_lock<std::mutex> device_lock(device_mu_, std::defer_lock);
  if (!device_.is_cpu()) device_lock.lock();
  const Clock::time_point quantize_start = Clock::now();
  absl::Cleanup timed = [&] { *quantize_seconds = SecondsSince(quantize_start); };
  try {
    torch::NoGradGuard no_grad;
    return quantize(values.to(device_));
  } catch (const c10::Error& e) {
    return absl::ResourceExhaustedError(
        absl::StrCat("quantizing \"", name, "\": ", e.what_without_backtrace()));
  }
}

void Nf4ShardReader::LogProgressLocked() {
  // Long work says how far it is: a 70 B base takes minutes on one rank.
  const Clock::time_point now = Clock::now();
  if (now - last_progress_ < std::chrono::seconds(20)) return;
  last_progress_ = now;
  MEMPLAN_LOG(kInfo, "quantizing base")
      .Field("weights_read_whole", counts_.weights_read_whole)
      .Field("of_weights", static_cast<int64_t>(weights_.size()))
      .Field("elements_read", counts_.elements_read)
      .Field("budget_wait_seconds", counts_.budget_wait_seconds)
      .Field("read_seconds", counts_.read_seconds)
      .Field("quantize_seconds", counts_.quantize_seconds);
}

absl::Status Nf4ShardReader::SetOffsets(LlamaModel& model, Communicator* communicator) {
  const int64_t n = static_cast<int64_t>(weights_.size());
  // NaN: not computed on this rank.
  torch::Tensor offsets = torch::full({std::max<int64_t>(n, 1)},
                                      std::numeric_limits<float>::quiet_NaN(), torch::kFloat32);
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (int64_t w = 0; w < n; ++w) {
      if (weights_[w].state == Weight::kDone && weights_[w].status.ok()) {
        offsets[w] = weights_[w].offset;
      }
    }
  }
  const int world = communicator == nullptr ? 1 : communicator->world_size();
  torch::Tensor all = offsets.view({1, -1});
  if (world > 1) {
    try {
      const torch::Tensor input = offsets.to(communicator->device());
      torch::Tensor output = torch::empty({world * input.numel()}, input.options());
      RETURN_IF_ERROR(communicator->AllGather(output, input)->Wait());
      all = output.to(torch::kCPU).view({world, -1});
    } catch (const c10::Error& e) {
      return absl::InternalError(
          absl::StrCat("sharing the NF4 offsets: ", e.what_without_backtrace()));
    }
  }
  const float* v = all.data_ptr<float>();
  const int64_t stride = all.size(1);
  for (int64_t w = 0; w < n; ++w) {
    int r = 0;
    while (r < world && std::isnan(v[r * stride + w])) ++r;
    if (r == world) {
      return absl::InternalError(absl::StrCat(
          weights_[w].name, ": no rank computed its NF4 offset (it stores none of its absmax)"));
    }
    RETURN_IF_ERROR(model.SetQuantizedOffset(weights_[w].name, v[r * stride + w]));
  }
  return absl::OkStatus();
}

Nf4ShardReader::Counts Nf4ShardReader::counts() const {
  std::lock_guard<std::mutex> lock(mu_);
  return counts_;
}

}  // namespace memplan
