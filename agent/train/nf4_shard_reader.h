// Nf4ShardReader: a QLoRA base loaded by ranges ([Sharded NF4 loading]): each rank quantizes
// only the NF4 bytes its frozen ChunkManager stores, bit for bit the bytes of quantizing the
// whole model on the same device, and holds no more of the unquantized base than the weights in
// flight.
//
// [Sharded NF4 loading] A QLoRA model created with deferred_values has its NF4 parts without
// values; the base manager's LoadRanges asks for this rank's byte ranges of each part.
// * nf4_data bytes [a, b) hold elements [2a, 2b): the whole 64-element blocks around them are read
//   and packed (QuantizeNf4Blocks), a data byte depending on its own block only.
// * nf4_absmax_code and nf4_absmax_scale bytes need every block's absmax (the offset is their
//   mean): the weight is read whole, once per rank that stores any of them, and its
//   double-quantized absmax (QuantizeNf4Absmax) kept until its parts are taken; a data range
//   covering the whole weight quantizes it whole (QuantizeNf4) and keeps the same.
// * The offset, a number every rank's forward needs, comes from the ranks that computed it:
//   SetOffsets all-gathers them (each weight's absmax codes are stored somewhere, so some rank
//   always did).
// Weights are quantized on the model's device (as LlamaModel::Create does: the offset, a mean,
// depends on the device's summation order), one at a time on a GPU. What is read and drawn in
// flight (a quantized weight's absmax read counted whole, any other read by its range), beyond
// the first, is at most
// kNf4LoadBudgetBytes (the planner's [Host reserve]).
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "agent/chunks/chunk_manager.h"
#include "agent/core/torch_pch.h"
#include "agent/dist/communicator.h"
#include "agent/model/llama_model.h"

namespace memplan {

inline constexpr int64_t kNf4LoadBudgetBytes = int64_t{1} << 30;

// Thread-safe: LoadRanges calls Read from several threads at once.
class Nf4ShardReader {
 public:
  // What this rank quantized and read of the quantized weights.
  struct Counts {
    int64_t data_bytes_quantized = 0;  // nf4_data bytes packed (the stored ones, whole blocks)
    int64_t elements_read = 0;         // elements of quantized weights asked of `values`
    int64_t weights_read_whole = 0;    // weights read whole (their absmax state)
    // Seconds summed over the reading threads: waiting for the in-flight budget, asking `values`
    // (drawing or reading the unquantized elements), and moving and quantizing them.
    double budget_wait_seconds = 0;
    double read_seconds = 0;
    double quantize_seconds = 0;
  };

  // `values` reads elements of the model's base tensors by Hugging Face name in the model dtype
  // (a checkpoint's ranges, or LlamaModel::InitialValues); it must be thread-safe.
  Nf4ShardReader(const LlamaModel& model, ChunkManager::RangeReader values);

  // A ChunkManager::RangeReader over the base manager's parameters: elements [begin, begin + len)
  // of an NF4 part, quantized here; any other name is passed to `values`.
  absl::StatusOr<torch::Tensor> Read(const std::string& name, int64_t begin, int64_t len);

  // Sets every quantized weight's offset in `model`: those computed here, the others from the
  // ranks that computed them (one all-gather when `communicator` has several ranks: every rank
  // calls it, after its reads). INTERNAL when no rank computed a weight's.
  absl::Status SetOffsets(LlamaModel& model, Communicator* communicator);

  Counts counts() const;

 private:
  enum class Part { kData, kAbsmaxCode, kAbsmaxScale };
  struct Weight {
    std::string name;
    int64_t numel = 0;
    // The absmax state, once computed: kept until this rank has taken its parts.
    enum { kNone, kComputing, kDone } state = kNone;
    absl::Status status;
    torch::Tensor absmax_code, absmax_scale;
    float offset = 0;
  };

  // The weight's absmax state, computed here from the whole weight unless another call did (or
  // is doing) it; with `want_data` the whole weight's data too when this call computed it
  // (undefined otherwise).
  absl::StatusOr<torch::Tensor> Whole(int w, bool want_data);
  absl::StatusOr<torch::Tensor> DataRange(int w, int64_t begin, int64_t len);
  // Reads elements [first, first + count) of `name` under the budget and runs `quantize` on them
  // on the device, one quantization at a time there; sets the seconds each step took. A LibTorch
  // error while quantizing is RESOURCE_EXHAUSTED.
  absl::Status ReadAndQuantize(
      const std::string& name, int64_t first, int64_t count,
      const std::function<absl::Status(const torch::Tensor& on_device)>& quantize,
      double* read_seconds, double* quantize_seconds);
  // Holds `bytes` of kNf4LoadBudgetBytes while it lives (the first in flight always proceeds).
  class Budget;

  // Logs the counts so far, at most every 20 s (mu_ held).
  void LogProgressLocked();

  ChunkManager::RangeReader values_;
  torch::Device device_;
  int64_t work_bytes_per_element_;  // a drawn fp32 value and its model-dtype copy
  std::map<std::string, std::pair<int, Part>> parts_;  // NF4 part name -> (weight, part)
  std::map<std::string, int64_t> numel_;               // Hugging Face name -> elements

  mutable std::mutex mu_;
  std::condition_variable changed_;  // a weight's state or the budget changed
  std::vector<Weight> weights_;      // guarded by mu_ (but name and numel: constant)
  int64_t in_flight_bytes_ = 0;      // guarded by mu_
  Counts counts_;                    // guarded by mu_
  std::chrono::steady_clock::time_point last_progress_ = std::chrono::steady_clock::now();  // mu_
  std::mutex device_mu_;             // one quantization at a time on a GPU
};

}  // namespace memplan
