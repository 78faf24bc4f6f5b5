// One rank of the several-rank LoRA tests (lora_sharded_test.cc starts world_size of these with
// torchrun's variables on a loopback port): joins the Gloo group and, for every LoraShardCase,
//   step PREFIX:   one optimizer step on its rows of the global batch; saves [loss, grad norm,
//                  adapter grads..., adapters after the step..., base values...,
//                  the quantized weights dequantized (QLoRA: fp32, concatenated; else empty),
//                  int64 [NF4 data bytes quantized, elements read, weights read whole],
//                  int64 [base host bytes, base persistent device bytes, base n_persist,
//                  base chunk bytes...]] to PREFIX.CASE.rankR.pt;
//   save PREFIX:   steps 1 to 3, the LoRA checkpoint written after step 1 to PREFIX.CASE.ckpt;
//                  saves [loss 1, loss 2, loss 3];
//   resume PREFIX: restores PREFIX.CASE.ckpt and runs steps 2 and 3; saves [loss 2, loss 3].
// Exit status: 0, or 1 with "rank R: <error>" on stderr.
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <string>
#include <vector>

#include "agent/dist/process_group.h"
#include "tests/agent/gloo_environment.h"
#include "agent/io/peft_adapter.h"
#include "common/status.h"
#include "tests/agent/train/lora_sharded_cases.h"

namespace memplan {
namespace {

int Fail(int rank, const absl::Status& status) {
  std::fprintf(stderr, "rank %d: %s\n", rank, std::string(status.message()).c_str());
  return 1;
}

absl::StatusOr<double> Step(Trainer& trainer, const testing::LoraShardCase& c, int step, int rank,
                            int world) {
  const std::vector<MicroBatch> batches =
      testing::LoraRankBatches(testing::LoraGlobalBatches(c, step), rank, world);
  ASSIGN_OR_RETURN(const double loss, trainer.ForwardBackward(batches));
  RETURN_IF_ERROR(trainer.OptimizerStep().status());
  return loss;
}

absl::Status RunCase(const std::string& mode, const std::string& prefix,
                     const testing::LoraShardCase& c, Communicator& comm) {
  const int rank = comm.rank(), world = comm.world_size();
  // Every rank loads as `memplan-agent train` does: a LoRA base without values, and only what
  // the rank stores drawn into its chunks (QLoRA: and quantized, [Sharded NF4 loading]).
  std::unique_ptr<LlamaModel> model = testing::MakeLoraShardModel(c, /*deferred=*/true);
  if (!model) return absl::InternalError("model creation failed");
  TrainerOptions options = testing::LoraShardOptions(c);
  options.communicator = &comm;
  ASSIGN_OR_RETURN(std::unique_ptr<Trainer> trainer, Trainer::Create(model.get(), options));
  if (model->options().deferred_values) {
    RETURN_IF_ERROR(trainer->LoadParamRanges(
        [&model](const std::string& name, int64_t begin, int64_t len) {
          return model->InitialValues(name, begin, len);
        }));
  }
  const std::string ckpt = prefix + "." + c.name + ".ckpt";
  std::vector<torch::Tensor> out;
  try {
    if (mode == "step") {
      const std::vector<MicroBatch> batches =
          testing::LoraRankBatches(testing::LoraGlobalBatches(c, 1), rank, world);
      ASSIGN_OR_RETURN(const double loss, trainer->ForwardBackward(batches));
      const std::vector<NamedParam> grads = trainer->Grads();
      ASSIGN_OR_RETURN(const double norm, trainer->OptimizerStep());
      out = {torch::tensor(loss, torch::kFloat64), torch::tensor(norm, torch::kFloat64)};
      for (const NamedParam& g : grads) out.push_back(g.param);
      for (const NamedParam& p : trainer->Params()) out.push_back(p.param);
      const std::vector<NamedParam> base = trainer->BaseParams();
      for (const NamedParam& p : base) out.push_back(p.param);
      out.push_back(testing::DequantizedWeights(*model, base));
      const Nf4ShardReader::Counts& n = trainer->nf4_load_counts();
      out.push_back(torch::tensor(std::vector<int64_t>{n.data_bytes_quantized, n.elements_read,
                                                       n.weights_read_whole},
                                  torch::kInt64));
      const ChunkMemoryStats b = trainer->base_chunk_manager()->MemoryStats();
      std::vector<int64_t> stats = {b.host_pinned_bytes + b.host_pageable_bytes,
                                    b.persistent_device_bytes, b.n_persist};
      stats.insert(stats.end(), b.chunk_bytes.begin(), b.chunk_bytes.end());
      out.push_back(torch::tensor(stats, torch::kInt64));
    } else if (mode == "save") {
      std::vector<double> losses;
      for (int step = 1; step <= 3; ++step) {
        ASSIGN_OR_RETURN(const double loss, Step(*trainer, c, step, rank, world));
        losses.push_back(loss);
        if (step == 1) RETURN_IF_ERROR(trainer->SaveCheckpoint(ckpt, io::TrainerState{}));
      }
      out.push_back(torch::tensor(losses, torch::kFloat64));
    } else if (mode == "resume") {
      ASSIGN_OR_RETURN(const io::Checkpoint saved, io::LoadLoraCheckpoint(ckpt));
      RETURN_IF_ERROR(trainer->RestoreCheckpoint(saved));
      if (trainer->step() != 1) return absl::InternalError("resumed at the wrong step");
      std::vector<double> losses;
      for (int step = 2; step <= 3; ++step) {
        ASSIGN_OR_RETURN(const double loss, Step(*trainer, c, step, rank, world));
        losses.push_back(loss);
      }
      out.push_back(torch::tensor(losses, torch::kFloat64));
    } else {
      return absl::InvalidArgumentError("mode must be step, save or resume: " + mode);
    }
  } catch (const c10::Error& e) {
    return absl::InternalError(e.what_without_backtrace());
  }
  torch::save(out, prefix + "." + c.name + ".rank" + std::to_string(rank) + ".pt");
  return absl::OkStatus();
}

int Run(const std::string& mode, const std::string& prefix) {
  torch::set_num_threads(1);
  absl::StatusOr<DistOptions> dist =
      testing::GlooOptionsFromEnvironment(60);
  if (!dist.ok()) return Fail(-1, dist.status());
  absl::StatusOr<std::unique_ptr<ProcessGroup>> group = ProcessGroup::Join(*dist);
  if (!group.ok()) return Fail(dist->rank, group.status());
  for (const testing::LoraShardCase& c : testing::LoraShardCases()) {
    if (absl::Status s = RunCase(mode, prefix, c, **group); !s.ok()) {
      return Fail((*group)->rank(), absl::Status(s.code(), c.name + ": " + std::string(s.message())));
    }
  }
  return 0;
}

}  // namespace
}  // namespace memplan

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: lora_sharded_worker step|save|resume PREFIX\n");
    return 2;
  }
  return memplan::Run(argv[1], argv[2]);
}
