// TrainSession's loading (train_session.h): the model's weights from a checkpoint or an adapter,
// each rank's shards of them, and whether a resumed run has anything left to train; the rest of
// the session is train_session.cc.
#include "agent/train/train_session.h"

#include <ATen/Parallel.h>
#include <signal.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <functional>
#include <map>
#include <ostream>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "agent/chunks/chunk_manager.h"
#include "agent/client/plan_share.h"
#include "agent/core/seconds_since.h"
#include "agent/client/planner_client.h"
#include "agent/client/planner_loop.h"
#include "agent/dist/process_group.h"
#include "agent/io/checkpoint.h"
#include "agent/io/file_system.h"
#include "agent/io/model_files.h"
#include "agent/io/peft_adapter.h"
#include "agent/io/random_access_file.h"
#include "agent/io/safetensors_torch.h"
#include "agent/io/synthetic_tokens.h"
#include "agent/io/token_batcher.h"
#include "agent/io/token_file.h"
#include "agent/io/trainer_state.h"
#include "agent/io/writable_file.h"
#include "agent/metrics/agent_metrics.h"
#include "agent/profiler/memory_probe.h"
#include "agent/profiler/memory_timeline.h"
#include "agent/train/device_setup.h"
#include "agent/model/layers.h"
#include "common/hf_config.h"
#include "common/nf4_bytes.h"
#include "common/param_shapes.h"
#include "common/log.h"
#include "common/presets.h"
#include "common/status.h"
#include "common/validate.h"

namespace memplan {

absl::StatusOr<bool> TrainSession::ResumeIsComplete() {
  if (config_.resume_dir.empty()) return false;
  constexpr int64_t kMaxTrainerFileBytes = int64_t{16} << 20;
  absl::StatusOr<std::string> text = io::ReadSmallFile(
      io::JoinPath(config_.resume_dir, io::kCheckpointTrainerFile), kMaxTrainerFileBytes);
  // An unreadable checkpoint is reported by Resume(), with the rest of its checks.
  if (!text.ok()) return false;
  absl::StatusOr<io::CheckpointManifest> manifest = io::DecodeCheckpointManifest(*text);
  if (!manifest.ok() || manifest->trainer.step < config_.steps) return false;
  const int64_t at = manifest->trainer.step;
  if (lead_) {
    std::printf(
        "nothing trained: --resume %s is already at step %lld >= --steps %lld (--steps counts "
        "steps in all; give --steps above %lld to train further)\n",
        config_.resume_dir.c_str(), static_cast<long long>(at),
        static_cast<long long>(config_.steps), static_cast<long long>(at));
    MEMPLAN_LOG(kInfo, "nothing to train")
        .Field("dir", config_.resume_dir)
        .Field("checkpoint_step", at)
        .Field("steps", config_.steps);
  }
  return true;
}

absl::Status TrainSession::LoadWeights() {
  if (checkpoint_ != nullptr) {  // --model, opened by ResolveModelSpec()
    const std::vector<NamedParam> names = io::FlattenParamGroups(model_->ParamGroups());
    if (sharded_load_) {
      // Checked now (names, shapes, dtypes), read by FillShards() once the chunks exist. QLoRA's
      // NF4 parts are read as the weights they quantize ([Sharded NF4 loading]).
      std::vector<NamedParam> sources;
      for (const NamedParam& p : names) {
        if (!IsNf4PartName(p.name)) sources.push_back(p);
      }
      std::map<std::string, std::vector<int64_t>> shapes;
      for (const ParamShape& p : HfParamShapes(spec_)) shapes[p.name] = p.shape;
      for (const std::string& name : model_->QuantizedWeightNames()) {
        sources.push_back({name, torch::empty(shapes.at(name), torch::TensorOptions()
                                                                   .dtype(ToScalarType(dtype_))
                                                                   .device(torch::kMeta))});
      }
      ASSIGN_OR_RETURN(matched_, checkpoint_->Match(sources, {}));
    } else {
      // [QLoRA] an NF4 base is quantized from the checkpoint's weights one at a time.
      ASSIGN_OR_RETURN(io::HfLoadReport report, io::LoadModelCheckpoint(*checkpoint_, *model_));
      MEMPLAN_LOG(kInfo, "loaded checkpoint")
          .Field("dir", config_.model_dir)
          .Field("tensors", report.tensors_loaded)
          .Field("quantized_nf4", static_cast<int64_t>(model_->QuantizedWeightNames().size()))
          .Field("bytes", report.bytes_read);
    }
  }
  if (!config_.load_adapter_dir.empty()) {
    ASSIGN_OR_RETURN(io::PeftAdapter adapter, io::ReadPeftAdapter(config_.load_adapter_dir));
    if (LoraTrainingMethod(adapter.lora).lora_target_modules !=
            LoraTrainingMethod(config_.lora).lora_target_modules ||
        adapter.lora.rank != config_.lora.rank || adapter.lora.alpha != config_.lora.alpha) {
      return absl::InvalidArgumentError(
          absl::StrCat("--load-adapter ", config_.load_adapter_dir, ": r ", adapter.lora.rank,
                       ", lora_alpha ", adapter.lora.alpha,
                       " and target_modules must equal --lora-rank, --lora-alpha and "
                       "--lora-targets"));
    }
    RETURN_IF_ERROR(io::CopyParamsByName(adapter.tensors, model_->TrainableParams()));
    MEMPLAN_LOG(kInfo, "loaded adapter").Field("dir", config_.load_adapter_dir);
  }
  return absl::OkStatus();
}

absl::Status TrainSession::FillShards() {
  // A resumed run is filled by the checkpoint it resumes from (Resume()), except LoRA's base,
  // which its checkpoints do not hold.
  if (!sharded_load_ || (!config_.resume_dir.empty() && !config_.lora.enabled())) {
    return absl::OkStatus();
  }
  // [Sharded loading] Each rank reads what it stores: its shard of every offloaded chunk and
  // the whole persistent chunks, from the checkpoint's byte ranges or drawn as Create would.
  const torch::ScalarType param_dtype = model_->Params().front().param.scalar_type();
  std::atomic<int64_t> bytes_read{0};
  ChunkManager::RangeReader read;
  if (checkpoint_ != nullptr) {
    read = [&](const std::string& name, int64_t begin,
               int64_t len) -> absl::StatusOr<torch::Tensor> {
      auto it = matched_.source_of.find(name);
      if (it == matched_.source_of.end()) {
        return absl::NotFoundError(
            absl::StrCat(config_.model_dir, ": nothing loads \"", name, "\""));
      }
      ASSIGN_OR_RETURN(torch::Tensor part,
                       checkpoint_->ReadRange(it->second, begin, len, param_dtype));
      // ReadRange reads exactly len elements of the stored dtype.
      bytes_read += len * static_cast<int64_t>(torch::elementSize(
                              io::TorchDTypeOf(checkpoint_->Find(it->second)->dtype)));
      return part;
    };
  } else {
    read = [&](const std::string& name, int64_t begin, int64_t len) {
      return model_->InitialValues(name, begin, len);
    };
  }
  const auto load_start = std::chrono::steady_clock::now();
  RETURN_IF_ERROR(trainer_->LoadParamRanges(read));
  // Drawing or reading a 32 B base takes a while: how long, on every rank.
  MEMPLAN_LOG(kInfo, "parameters filled")
      .Field("rank", dist_.rank)
      .Field("source", checkpoint_ != nullptr ? "checkpoint" : "synthetic draw")
      .Field("seconds", SecondsSince(load_start));
  if (checkpoint_ != nullptr) {
    MEMPLAN_LOG(kInfo, "loaded checkpoint")
        .Field("dir", config_.model_dir)
        .Field("tensors", matched_.loads.size())
        .Field("bytes", bytes_read.load())
        .Field("rank", dist_.rank);
  }
  if (model_->has_nf4_base()) {
    const Nf4ShardReader::Counts& n = trainer_->nf4_load_counts();
    MEMPLAN_LOG(kInfo, "quantized base")
        .Field("rank", dist_.rank)
        .Field("nf4_data_bytes", n.data_bytes_quantized)
        .Field("weight_elements_read", n.elements_read)
        .Field("weights_read_whole", n.weights_read_whole)
        .Field("budget_wait_seconds", n.budget_wait_seconds)
        .Field("read_seconds", n.read_seconds)
        .Field("quantize_seconds", n.quantize_seconds);
  }
  return absl::OkStatus();
}

}  // namespace memplan
