// One rank of the sharded-step tests (sharded_trainer_test.cc starts world_size of these with
// torchrun's variables on a loopback port): joins the Gloo group, runs one optimizer step of every
// ShardCase on its rows of the global batch, and saves [loss, grad norm, grads..., params...
// (ParamOrder), collectives, memory] per case to PREFIX.CASE.rankR.pt; collectives is int64
// [all-gathers, reduce-scatters, all-reduces] the trainer and its chunk manager issued (creation
// to the gathers after the step included); memory is int64 [host bytes (pinned + pageable),
// n_persist, every chunk's bytes...] from ChunkManager::MemoryStats(), then int64
// [persistent_device_bytes, persistent_state_device_bytes].
//   sharded_step_worker PREFIX [KILL_RANK [kill|stop|vanish [TIMEOUT_SECONDS]]]
// With KILL_RANK, that rank kills itself (SIGKILL; "stop": SIGSTOP, a hung rank) in the middle of
// the first case's backward, and the others must fail, naming it; "vanish": it runs every case
// and exits without leaving the group (no [Leaving] mark). TIMEOUT_SECONDS: the collective
// timeout (default 30). Exit status: 0, or 1 with "rank R: <error>" on stderr.
#include <signal.h>

#include <cstdio>
#include <cstdlib>
#include <optional>
#include <string>
#include <vector>

#include "agent/dist/counting_communicator.h"
#include "agent/dist/process_group.h"
#include "tests/agent/gloo_environment.h"
#include "tests/agent/train/sharded_cases.h"

namespace memplan {
namespace {

// Sends this process `signal` at the PostBackward of one block group, after the chunk manager's
// hook.
class KillAt final : public ParamResidency {
 public:
  KillAt(int group, int signal) : group_(group), signal_(signal) {}
  void PreForward(int) override {}
  void PostForward(int) override {}
  void PreBackward(int) override {}
  void PostBackward(int group) override {
    if (group == group_) raise(signal_);
  }

 private:
  int group_;
  int signal_;
};

int Fail(int rank, const absl::Status& status) {
  std::fprintf(stderr, "rank %d: %s\n", rank, std::string(status.message()).c_str());
  return 1;
}

int Run(const std::string& prefix, int kill_rank, int signal, int timeout_seconds) {
  torch::set_num_threads(1);
  absl::StatusOr<DistOptions> dist =
      testing::GlooOptionsFromEnvironment(timeout_seconds, 200);
  if (!dist.ok()) return Fail(-1, dist.status());
  absl::StatusOr<std::unique_ptr<ProcessGroup>> group = ProcessGroup::Join(*dist);
  if (!group.ok()) return Fail(dist->rank, group.status());
  const int rank = (*group)->rank();
  const int world = (*group)->world_size();
  for (const testing::ShardCase& c : testing::ShardCases()) {
    // Every rank loads as `memplan-agent train` does: a model without values, and only what it
    // stores drawn into its chunks; the reference (one process, in the test) materialises the
    // whole model.
    std::unique_ptr<LlamaModel> model = testing::MakeShardCaseModel(c, /*deferred=*/true);
    if (!model) return Fail(rank, absl::InternalError("model creation failed"));
    TrainerOptions options = testing::ShardCaseOptions(c, model->num_blocks());
    CountingCommunicator counting(group->get());
    options.communicator = &counting;
    KillAt kill(/*group=*/2, signal);
    if (rank == kill_rank && signal != 0) options.observer = &kill;
    absl::StatusOr<std::unique_ptr<Trainer>> trainer = Trainer::Create(model.get(), options);
    if (!trainer.ok()) return Fail(rank, trainer.status());
    if (absl::Status s = (*trainer)->LoadParamRanges(
            [&model](const std::string& name, int64_t begin, int64_t len) {
              return model->InitialValues(name, begin, len);
            });
        !s.ok()) {
      return Fail(rank, s);
    }
    const std::vector<MicroBatch> batches =
        testing::RankBatches(testing::GlobalBatches(c, world, model->spec().vocab_size), rank);
    absl::StatusOr<double> loss = (*trainer)->ForwardBackward(batches);
    if (!loss.ok()) return Fail(rank, loss.status());
    // Before Grads() or Step(): the persistent all-reduces already started by backward.
    const int64_t reduces_in_backward = (*trainer)->chunk_manager()->PersistentReducesInBackward();
    const int64_t reduces_beside = (*trainer)->chunk_manager()->ShardReducesBesideBackward();
    std::vector<NamedParam> grads;
    try {
      grads = (*trainer)->Grads();
    } catch (const c10::Error& e) {
      return Fail(rank, absl::InternalError(e.what_without_backtrace()));
    }
    absl::StatusOr<double> norm = (*trainer)->OptimizerStep();
    if (!norm.ok()) return Fail(rank, norm.status());
    std::vector<torch::Tensor> out = {torch::tensor(*loss, torch::kFloat64),
                                      torch::tensor(*norm, torch::kFloat64)};
    for (const NamedParam& g : grads) out.push_back(g.param);
    try {
      for (const NamedParam& p : (*trainer)->Params()) out.push_back(p.param);
    } catch (const c10::Error& e) {
      return Fail(rank, absl::InternalError(e.what_without_backtrace()));
    }
    const CollectiveCounts& n = counting.counts();
    out.push_back(torch::tensor(
        std::vector<int64_t>{n.all_gathers, n.reduce_scatters, n.all_reduces, reduces_in_backward,
                             reduces_beside},
        torch::kInt64));
    const ChunkMemoryStats stats = (*trainer)->chunk_manager()->MemoryStats();
    std::vector<int64_t> memory = {stats.host_pinned_bytes + stats.host_pageable_bytes,
                                   stats.n_persist};
    memory.insert(memory.end(), stats.chunk_bytes.begin(), stats.chunk_bytes.end());
    out.push_back(torch::tensor(memory, torch::kInt64));
    out.push_back(torch::tensor(
        std::vector<int64_t>{stats.persistent_device_bytes, stats.persistent_state_device_bytes,
                             stats.persistent_gather_device_bytes, stats.persistent_gathers},
        torch::kInt64));
    torch::save(out, prefix + "." + c.name + ".rank" + std::to_string(rank) + ".pt");
  }
  if (rank == kill_rank && signal == 0) std::_Exit(0);  // "vanish": the group is not left
  return 0;
}

}  // namespace
}  // namespace memplan

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: sharded_step_worker PREFIX [KILL_RANK]\n");
    return 2;
  }
  const std::string fault = argc > 3 ? argv[3] : "kill";
  const int signal = fault == "stop" ? SIGSTOP : fault == "vanish" ? 0 : SIGKILL;
  return memplan::Run(argv[1], argc > 2 ? std::atoi(argv[2]) : -1, signal,
                      argc > 4 ? std::atoi(argv[4]) : 30);
}
