// LoRA and QLoRA over several ranks, end to end on the CPU: world_size processes of
// lora_sharded_worker (Gloo on 127.0.0.1), the frozen base sharded over them ([Sharded frozen
// base] in agent/chunks/chunk_manager.cc) and the adapters replicated with all-reduced grads (or,
// offloaded, sharded as a full fine-tune's chunks). What is checked, per LoraShardCase:
// * one step on each rank's rows equals one process on the global batch: the loss, the pre-clip
//   norm and every adapter gradient within 1e-5 relative; the adapters after the step are bit for
//   bit torch::optim::AdamW of the run's own gradients, and differ from the one-process run's
//   only as far as AdamW's first step amplifies the gradients' summation-order differences
//   (elements with tiny gradients; over 99% of every adapter within 1e-5 of its largest
//   magnitude); every rank holds the same adapters;
// * the base gathered back from the shards equals the unsharded base byte for byte (NF4 codes,
//   scales and norms included), and each rank's base host bytes are its shards: ceil(S / W)
//   per offloaded chunk of S bytes (and persistent chunks sharded on the device when asked);
// * QLoRA ([Sharded NF4 loading]): each rank quantized at most its 1/W of the NF4 data bytes (plus
//   the blocks a shard boundary cuts), the ranks together all of them, no rank read every
//   quantized weight, and the base dequantizes (offsets included) as the whole-model
//   quantization's, bit for bit;
// * a LoRA checkpoint written by 2 ranks resumes on 1, and one written by 1 process resumes on 3,
//   with the losses of the uninterrupted run (1e-5 relative).
// Every rank (and the one-process runs that save and resume) loads as `memplan-agent train`
// does: a LoRA base without values whose shards are drawn by LoadParamRanges (QLoRA: and
// quantized there). The one-process step reference materialises the model, quantized whole.
#include <sys/wait.h>

#include <algorithm>
#include <cstdio>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "agent/io/peft_adapter.h"
#include "common/nf4_bytes.h"
#include "common/optimizer_bytes.h"
#include "gtest/gtest.h"
#include "tests/agent/subprocess.h"
#include "tests/agent/train/lora_sharded_cases.h"

namespace memplan {
namespace {

const bool kSingleThread = [] {
  torch::set_num_threads(1);
  return true;
}();

// Runs world_size workers in `mode`; fails the test (with the ranks' stderr) unless all exit 0.
// Returns false when there is no Gloo (the caller skips).
bool RunWorkers(int world_size, const std::string& mode, const std::string& prefix) {
  const int port = testing::FreeLoopbackPort();
  EXPECT_GT(port, 0);
  std::vector<testing::Child> children;
  for (int r = 0; r < world_size; ++r) {
    children.push_back(testing::Spawn(
        {MEMPLAN_LORA_SHARD_WORKER, mode, prefix},
        {absl::StrCat("WORLD_SIZE=", world_size), absl::StrCat("RANK=", r),
         absl::StrCat("LOCAL_RANK=", r), absl::StrCat("LOCAL_WORLD_SIZE=", world_size),
         "MASTER_ADDR=127.0.0.1", absl::StrCat("MASTER_PORT=", port)},
        absl::StrCat(prefix, ".", mode, ".", r)));
    EXPECT_GT(children.back().pid, 0);
  }
  bool gloo = true;
  for (int r = 0; r < world_size; ++r) {
    int status = 0;
    EXPECT_EQ(waitpid(children[r].pid, &status, 0), children[r].pid);
    const std::string err = testing::ReadFile(children[r].err_path);
    std::remove(children[r].out_path.c_str());
    std::remove(children[r].err_path.c_str());
    if (absl::StrContains(err, "no Gloo process group")) gloo = false;
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0)
        << mode << " rank " << r << " stderr:\n"
        << err;
  }
  return gloo;
}

std::vector<torch::Tensor> LoadRank(const std::string& prefix, const std::string& name, int r) {
  const std::string path = absl::StrCat(prefix, ".", name, ".rank", r, ".pt");
  std::vector<torch::Tensor> got;
  torch::load(got, path);
  std::remove(path.c_str());
  return got;
}

double MaxAbsDiff(const torch::Tensor& a, const torch::Tensor& b) {
  return (a.to(torch::kFloat64) - b.to(torch::kFloat64)).abs().max().item<double>();
}

struct Reference {
  double loss = 0;
  double norm = 0;
  std::vector<NamedParam> grads, params, initial_adapters, base;
  torch::Tensor dequantized;  // testing::DequantizedWeights of the whole-model quantization
};

Reference OneProcessStep(const testing::LoraShardCase& c) {
  Reference ref;
  std::unique_ptr<LlamaModel> model = testing::MakeLoraShardModel(c);
  EXPECT_NE(model, nullptr);
  for (const NamedParam& p : model->TrainableParams()) {
    ref.initial_adapters.push_back({p.name, p.param.detach().clone()});
  }
  for (const NamedParam& p : model->Params()) ref.base.push_back({p.name, p.param.detach().clone()});
  ref.dequantized = testing::DequantizedWeights(*model, ref.base);
  auto trainer = Trainer::Create(model.get(), testing::LoraShardOptions(c));
  EXPECT_TRUE(trainer.ok()) << trainer.status();
  auto loss = (*trainer)->ForwardBackward(testing::LoraGlobalBatches(c, 1));
  EXPECT_TRUE(loss.ok()) << loss.status();
  ref.loss = *loss;
  ref.grads = (*trainer)->Grads();
  auto norm = (*trainer)->OptimizerStep();
  EXPECT_TRUE(norm.ok()) << norm.status();
  ref.norm = *norm;
  ref.params = (*trainer)->Params();
  return ref;
}

// The NF4 data bytes rank `rank` of `world` stores of a QLoRA case's base: its byte range
// [r P / W, (r + 1) P / W) of every chunk of S bytes padded to P = W ceil(S / W) ([Sharded frozen
// base]), or the whole of a persistent chunk that is not sharded.
int64_t StoredDataBytes(const testing::LoraShardCase& c, int rank, int world) {
  std::unique_ptr<LlamaModel> model = testing::MakeLoraShardModel(c, /*deferred=*/true);
  const ChunkManagerOptions options = testing::LoraShardOptions(c).chunks;
  absl::StatusOr<ChunkPacking> layout = ChunkManager::LayoutOf(model->ParamGroups(), options);
  EXPECT_TRUE(layout.ok()) << layout.status();
  if (!layout.ok()) return 0;
  int64_t stored = 0;
  for (size_t i = 0; i < layout->params().size(); ++i) {
    if (!layout->params()[i].name.ends_with(kNf4DataSuffix)) continue;
    const ParamSlot& slot = layout->slots()[i];
    const int64_t size = layout->chunks()[slot.chunk].size_bytes;
    const int64_t padded = world * ((size + world - 1) / world);
    int64_t from = padded * rank / world, to = padded * (rank + 1) / world;
    if (slot.chunk < c.base_n_persist && !c.base_params_sharded) from = 0, to = size;
    stored += std::max<int64_t>(
        0, std::min(to, slot.offset_bytes + slot.size_bytes) - std::max(from, slot.offset_bytes));
  }
  return stored;
}

class LoraShardedTest : public ::testing::TestWithParam<int> {};

TEST_P(LoraShardedTest, OneStepEqualsOneProcessOnTheGlobalBatch) {
  const int world = GetParam();
  const std::string prefix = absl::StrCat(::testing::TempDir(), "/lora_step_", getpid(), "_w", world);
  if (!RunWorkers(world, "step", prefix)) GTEST_SKIP() << "no Gloo process group";
  if (HasFailure()) return;
  for (const testing::LoraShardCase& c : testing::LoraShardCases()) {
    SCOPED_TRACE(c.name);
    const Reference ref = OneProcessStep(c);
    const size_t n_grads = ref.grads.size(), n_params = ref.params.size(), n_base = ref.base.size();
    ASSERT_EQ(n_grads, n_params);
    ASSERT_GT(n_params, 0u);
    if (c.max_grad_norm > 0) {
      EXPECT_GT(ref.norm, c.max_grad_norm);  // it clipped
    }
    // The step moved the adapters, so equality below is not equality of initial values.
    double moved = 0;
    for (size_t i = 0; i < n_params; ++i) {
      moved = std::max(moved, MaxAbsDiff(ref.params[i].param, ref.initial_adapters[i].param));
    }
    EXPECT_GT(moved, 1e-3);
    // The NF4 base's data bytes and its quantized weights' elements.
    int64_t total_data_bytes = 0, total_elements = 0, quantized_sum = 0;
    for (const NamedParam& p : ref.base) {
      if (!p.name.ends_with(kNf4DataSuffix)) continue;
      total_data_bytes += p.param.numel();
      total_elements += 2 * p.param.numel();  // every tiny weight has an even size
    }
    std::vector<torch::Tensor> rank0;
    for (int r = 0; r < world; ++r) {
      SCOPED_TRACE(absl::StrCat("rank ", r));
      const std::vector<torch::Tensor> got = LoadRank(prefix, c.name, r);
      ASSERT_EQ(got.size(), 5 + n_grads + n_params + n_base);
      EXPECT_NEAR(got[0].item<double>(), ref.loss, 1e-5 * std::abs(ref.loss));
      EXPECT_NEAR(got[1].item<double>(), ref.norm, 1e-5 * std::abs(ref.norm));
      for (size_t i = 0; i < n_grads; ++i) {
        const torch::Tensor& g = got[2 + i];
        const torch::Tensor& e = ref.grads[i].param;
        ASSERT_EQ(g.sizes(), e.sizes()) << ref.grads[i].name;
        EXPECT_LE(MaxAbsDiff(g, e), 1e-5 * e.abs().max().item<double>() + 1e-9)
            << "grad " << ref.grads[i].name;
      }
      // The adapters after the step are bit for bit torch::optim::AdamW applied to this run's own
      // (all-reduced) gradients, clipped by its norm: the sharded update is exact.
      const double norm = got[1].item<double>();
      const float coef = c.max_grad_norm > 0
                             ? std::min(1.0f, static_cast<float>(c.max_grad_norm) /
                                                  (static_cast<float>(norm) + 1e-6f))
                             : 1.0f;
      std::map<std::string, torch::Tensor> got_grads, ref_grads, initial;
      for (size_t i = 0; i < n_grads; ++i) {
        got_grads[ref.grads[i].name] = got[2 + i];
        ref_grads[ref.grads[i].name] = ref.grads[i].param;
      }
      for (const NamedParam& p : ref.initial_adapters) initial[p.name] = p.param;
      const AdamWOptions a = testing::LoraShardOptions(c).adamw;
      std::vector<torch::Tensor> leaves;
      for (size_t i = 0; i < n_params; ++i) {
        const std::string& name = ref.params[i].name;
        ASSERT_TRUE(got_grads.count(name) && initial.count(name)) << name;
        leaves.push_back(initial[name].clone().set_requires_grad(true));
        torch::Tensor g = got_grads[name].clone();
        if (coef < 1.0f) g.mul_(coef);  // clip_grad_norm_'s grad.mul_(coef)
        leaves.back().mutable_grad() = g;
      }
      torch::optim::AdamW adamw(leaves, torch::optim::AdamWOptions(a.lr)
                                            .betas({a.beta1, a.beta2})
                                            .eps(a.eps)
                                            .weight_decay(a.weight_decay));
      adamw.step();
      for (size_t i = 0; i < n_params; ++i) {
        const std::string& name = ref.params[i].name;
        const torch::Tensor& p = got[2 + n_grads + i];
        const torch::Tensor& e = ref.params[i].param;
        ASSERT_EQ(p.sizes(), e.sizes()) << name;
        EXPECT_TRUE(torch::equal(p, leaves[i].detach()))
            << name << ": not AdamW of the run's grads, max diff "
            << MaxAbsDiff(p, leaves[i].detach());
        // Against the one-process run: AdamW's first step moves an element by
        // lr c g / (c |g| + eps), so |dp| <= lr c eps |dg| / (c min|g| + eps)^2 (min|g| = 0
        // where the signs differ) plus fp32 rounding: elements with tiny gradients may move by
        // up to a step, all others agree to about 1e-6.
        const torch::Tensor g = got_grads[name].to(torch::kFloat64);
        const torch::Tensor r = ref_grads[name].to(torch::kFloat64);
        const torch::Tensor smallest =
            torch::where(g * r <= 0, torch::zeros_like(g), torch::min(g.abs(), r.abs()));
        const torch::Tensor bound =
            a.lr * coef * a.eps * (g - r).abs() / (coef * smallest + a.eps).pow(2) + 1e-6;
        const torch::Tensor diff = (p.to(torch::kFloat64) - e.to(torch::kFloat64)).abs();
        EXPECT_TRUE((diff <= bound).all().item<bool>())
            << name << ": max excess " << (diff - bound).max().item<double>() << ", max diff "
            << diff.max().item<double>();
        // Most elements agree to 1e-5 of the adapter's largest magnitude.
        const double close =
            (diff <= 1e-5 * e.abs().max().item<double>()).to(torch::kFloat64).mean().item<double>();
        EXPECT_GT(close, 0.99) << name;
      }
      for (size_t i = 0; i < n_base; ++i) {
        const torch::Tensor& b = got[2 + n_grads + n_params + i];
        EXPECT_EQ(b.scalar_type(), ref.base[i].param.scalar_type()) << ref.base[i].name;
        EXPECT_TRUE(torch::equal(b, ref.base[i].param)) << "base " << ref.base[i].name;
      }
      // [Sharded NF4 loading] The rank quantized only what it stores, and the offsets it did not
      // compute came from the others: every weight dequantizes as the whole-model quantization's.
      EXPECT_TRUE(torch::equal(got[got.size() - 3], ref.dequantized)) << "dequantized base";
      const torch::Tensor counts = got[got.size() - 2];
      if (c.nf4) {
        const int64_t quantized = counts[0].item<int64_t>(), read = counts[1].item<int64_t>();
        std::printf("%s rank %d of %d: %lld of %lld NF4 data bytes quantized, %lld of %lld "
                    "weight elements read, %lld weights read whole\n",
                    c.name.c_str(), r, world, static_cast<long long>(quantized),
                    static_cast<long long>(total_data_bytes), static_cast<long long>(read),
                    static_cast<long long>(total_elements),
                    static_cast<long long>(counts[2].item<int64_t>()));
        quantized_sum += quantized;
        // The data bytes this rank stores, and at most a partial block where a shard boundary
        // cuts a weight's data, at either end of each chunk's shard.
        const int64_t stored = StoredDataBytes(c, r, world);
        EXPECT_LT(stored, total_data_bytes);
        EXPECT_GE(quantized, stored);
        EXPECT_LE(quantized, stored + static_cast<int64_t>(got.back().numel() - 3) * kNf4Blocksize);
        EXPECT_LT(read, total_elements);
      } else {
        EXPECT_EQ(counts.sum().item<int64_t>(), 0);
      }
      // The base's bytes on this rank: its shards.
      const torch::Tensor stats = got.back();
      const int64_t n_persist = stats[2].item<int64_t>();
      // fp32 chunks, or bytes ([Byte chunks]: NF4 codes, fp32 scales and norms together).
      const int64_t elem = c.nf4 ? 1 : 4;
      int64_t host = 0, persistent = 0;
      for (int64_t k = 3; k < stats.numel(); ++k) {
        const int64_t s = stats[k].item<int64_t>();
        const int64_t shard = ShardElems(s / elem, world) * elem;
        if (k - 3 >= n_persist) {
          host += shard;
        } else {
          persistent += c.base_params_sharded ? shard : s;
        }
      }
      EXPECT_EQ(n_persist, c.base_n_persist);
      EXPECT_EQ(stats[0].item<int64_t>(), host);
      EXPECT_EQ(stats[1].item<int64_t>(), persistent);
      // Every rank holds the same adapters.
      if (r == world - 1 && c.nf4) {
        EXPECT_GE(quantized_sum, total_data_bytes);
      }
      if (r == 0) {
        rank0 = got;
      } else {
        for (size_t i = 0; i < n_params; ++i) {
          EXPECT_TRUE(torch::equal(got[2 + n_grads + i], rank0[2 + n_grads + i]))
              << ref.params[i].name;
        }
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Ranks, LoraShardedTest, ::testing::Values(2, 3),
                         [](const ::testing::TestParamInfo<int>& info) {
                           return absl::StrCat(info.param, "_ranks");
                         });

// One process: steps 1 to 3, or (resume) steps 2 and 3 from `ckpt`; the checkpoint written
// after step 1 when `save`.
std::vector<double> OneProcessLosses(const testing::LoraShardCase& c, const std::string& ckpt,
                                     bool save) {
  // One rank loads as `memplan-agent train` does too: the base's values drawn into its chunks.
  std::unique_ptr<LlamaModel> model = testing::MakeLoraShardModel(c, /*deferred=*/true);
  auto trainer = Trainer::Create(model.get(), testing::LoraShardOptions(c));
  EXPECT_TRUE(trainer.ok()) << trainer.status();
  if (model->options().deferred_values) {
    EXPECT_TRUE((*trainer)
                    ->LoadParamRanges([&model](const std::string& name, int64_t begin,
                                               int64_t len) {
                      return model->InitialValues(name, begin, len);
                    })
                    .ok());
  }
  std::vector<double> losses;
  int first = 1;
  if (!save) {
    auto saved = io::LoadLoraCheckpoint(ckpt);
    EXPECT_TRUE(saved.ok()) << saved.status();
    if (!saved.ok()) return losses;
    EXPECT_TRUE((*trainer)->RestoreCheckpoint(*saved).ok());
    EXPECT_EQ((*trainer)->step(), 1);
    first = 2;
  }
  for (int step = first; step <= 3; ++step) {
    auto loss = (*trainer)->ForwardBackward(testing::LoraGlobalBatches(c, step));
    EXPECT_TRUE(loss.ok()) << loss.status();
    losses.push_back(*loss);
    EXPECT_TRUE((*trainer)->OptimizerStep().ok());
    if (save && step == 1) {
      EXPECT_TRUE((*trainer)->SaveCheckpoint(ckpt, io::TrainerState{}).ok());
    }
  }
  return losses;
}

void ExpectLossesNear(const std::vector<double>& want, const torch::Tensor& got) {
  ASSERT_EQ(got.numel(), static_cast<int64_t>(want.size()));
  for (size_t i = 0; i < want.size(); ++i) {
    EXPECT_NEAR(got[static_cast<int64_t>(i)].item<double>(), want[i], 1e-5 * std::abs(want[i]))
        << "loss " << i;
  }
}

TEST(LoraShardedResumeTest, TwoRanksSaveOneResumes) {
  const std::string prefix = absl::StrCat(::testing::TempDir(), "/lora_resume21_", getpid());
  if (!RunWorkers(2, "save", prefix)) GTEST_SKIP() << "no Gloo process group";
  if (HasFailure()) return;
  for (const testing::LoraShardCase& c : testing::LoraShardCases()) {
    SCOPED_TRACE(c.name);
    const std::string ckpt = prefix + "." + c.name + ".ckpt";
    // Rank 0 alone wrote one PEFT adapter (and the state beside it).
    EXPECT_TRUE(io::IsLoraCheckpoint(ckpt));
    auto adapter = io::ReadPeftAdapter(ckpt);
    ASSERT_TRUE(adapter.ok()) << adapter.status();
    EXPECT_EQ(adapter->lora.rank, 4);
    EXPECT_FALSE(adapter->tensors.empty());
    std::vector<torch::Tensor> ranks[2] = {LoadRank(prefix, c.name, 0), LoadRank(prefix, c.name, 1)};
    ASSERT_EQ(ranks[0].size(), 1u);
    ASSERT_EQ(ranks[1].size(), 1u);
    EXPECT_TRUE(torch::equal(ranks[0][0], ranks[1][0]));
    // The two ranks' run is one process's run.
    const std::vector<double> whole = OneProcessLosses(c, prefix + "." + c.name + ".whole", true);
    ExpectLossesNear(whole, ranks[0][0]);
    const std::vector<double> resumed = OneProcessLosses(c, ckpt, false);
    ExpectLossesNear(resumed, ranks[0][0].narrow(0, 1, 2));
  }
}

TEST(LoraShardedResumeTest, OneProcessSavesThreeRanksResume) {
  const std::string prefix = absl::StrCat(::testing::TempDir(), "/lora_resume13_", getpid());
  std::vector<std::vector<double>> whole;
  for (const testing::LoraShardCase& c : testing::LoraShardCases()) {
    whole.push_back(OneProcessLosses(c, prefix + "." + c.name + ".ckpt", true));
  }
  if (!RunWorkers(3, "resume", prefix)) GTEST_SKIP() << "no Gloo process group";
  if (HasFailure()) return;
  size_t k = 0;
  for (const testing::LoraShardCase& c : testing::LoraShardCases()) {
    SCOPED_TRACE(c.name);
    const std::vector<double> want(whole[k].begin() + 1, whole[k].end());
    ++k;
    for (int r = 0; r < 3; ++r) {
      const std::vector<torch::Tensor> got = LoadRank(prefix, c.name, r);
      ASSERT_EQ(got.size(), 1u);
      ExpectLossesNear(want, got[0]);
    }
  }
}

}  // namespace
}  // namespace memplan
