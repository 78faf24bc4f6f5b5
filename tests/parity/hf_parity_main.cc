// memplan-hf-parity: one training step of a Hugging Face checkpoint under a given residency plan,
// with everything the parity suite (tests/parity/hf_parity_test.py) compares against transformers
// written to one safetensors file:
//   logits             [batch, seq, vocab] fp32, plain forward before the step
//   loss               [1] fp32, the step's loss (mean over the micro-batches)
//   grad.<name>        accumulated gradient of every parameter (fp32)
//   param.<name>       every parameter after the optimizer step (fp32)
// Input: a safetensors file with int64 "input_ids" and "targets", [grad_accum * batch, seq]
// (targets already shifted, -100 ignored), split into grad_accum micro-batches of `batch` rows.
// --save-hf DIR also writes a memplan checkpoint after the step (a Hugging Face directory).
#include <cstdio>
#include <map>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "agent/io/checkpoint.h"
#include "agent/io/hf_checkpoint.h"
#include "agent/io/peft_adapter.h"
#include "agent/io/safetensors_torch.h"
#include "agent/model/llama_model.h"
#include "agent/train/train_config.h"
#include "agent/train/trainer.h"
#include "common/flag_arg.h"
#include "common/hf_config.h"
#include "common/status.h"

namespace memplan {
namespace {

constexpr char kUsage[] =
    "usage: memplan-hf-parity --model DIR --tokens FILE --out FILE [options]\n"
    "  --model DIR          Hugging Face checkpoint (config.json + safetensors)\n"
    "  --tokens FILE        safetensors with int64 input_ids and targets [rows, seq]\n"
    "  --out FILE           safetensors to write (logits, loss, grad.*, param.*)\n"
    "  --dtype fp32|bf16    model dtype (default fp32)\n"
    "  --device cpu|cuda    (default cpu)\n"
    "  --grad-accum N       micro-batches per step; rows must divide by it (default 1)\n"
    "  --plain              unmanaged plain-autograd reference (all blocks NONE)\n"
    "  --block-modes CSV    none,ckpt,swap,hs_offload per block (default all none)\n"
    "  --chunk-kib N        managed: chunk size in KiB (makes the run managed)\n"
    "  --n-persist N        managed: persistent chunks (default 0)\n"
    "  --n-buffer N         managed: device buffers (default 2)\n"
    "  --optimizer NAME     adamw (default), adamw_bf16 (pure bf16, needs --dtype bf16), sgd\n"
    "  --lr F --beta1 F --beta2 F --eps F --weight-decay F   optimizer hyper-parameters\n"
    "  --clip F             max grad norm (default 0 = off)\n"
    "  --head-chunk-rows N  LM head + loss over N tokens at a time (default: the model's rule)\n"
    "  --save-hf DIR        write a checkpoint (Hugging Face layout) after the step\n"
    "LoRA (grads and params are then the adapters'):\n"
    "  --lora-rank N --lora-alpha F --lora-dropout F --lora-targets LIST|all [--qlora 1]\n"
    "  --load-adapter DIR   initial adapter values from a PEFT adapter directory\n"
    "  --adapter-n-persist N  managed: the adapters' persistent chunks (default all)\n"
    "  --seed N             torch::manual_seed(N) right before the step (dropout masks)\n"
    "  --save-adapter DIR   write the adapter after the step in PEFT's format\n"
    "  --merge-export DIR   write base + merged adapter after the step (Hugging Face layout)\n";

struct Flags {
  std::map<std::string, std::string> values;
  bool plain = false;

  std::string Get(const std::string& name, const std::string& fallback = "") const {
    auto it = values.find(name);
    return it == values.end() ? fallback : it->second;
  }
  absl::StatusOr<double> Double(const std::string& name, double fallback) const {
    auto it = values.find(name);
    if (it == values.end()) return fallback;
    double v = 0;
    if (!absl::SimpleAtod(it->second, &v)) {
      return absl::InvalidArgumentError(absl::StrCat(name, ": not a number: ", it->second));
    }
    return v;
  }
  absl::StatusOr<int64_t> Int(const std::string& name, int64_t fallback) const {
    auto it = values.find(name);
    if (it == values.end()) return fallback;
    int64_t v = 0;
    if (!absl::SimpleAtoi(it->second, &v)) {
      return absl::InvalidArgumentError(absl::StrCat(name, ": not an integer: ", it->second));
    }
    return v;
  }
};

absl::StatusOr<Flags> ParseFlags(int argc, char** argv) {
  Flags f;
  for (int i = 1; i < argc; ++i) {
    FlagArg arg = SplitFlagArg(argv[i]);
    if (arg.name == "--help" || arg.name == "-h") {
      std::fputs(kUsage, stdout);
      std::exit(0);
    }
    if (arg.name == "--plain") {
      f.plain = true;
      continue;
    }
    if (arg.name.rfind("--", 0) != 0) {
      return absl::InvalidArgumentError(absl::StrCat("unexpected argument ", arg.name));
    }
    if (!arg.value.has_value()) {
      if (i + 1 >= argc) return absl::InvalidArgumentError(absl::StrCat(arg.name, " needs a value"));
      arg.value = argv[++i];
    }
    f.values[arg.name] = *arg.value;
  }
  for (const char* required : {"--model", "--tokens", "--out"}) {
    if (f.values.count(required) == 0) {
      return absl::InvalidArgumentError(absl::StrCat(required, " is required\n", kUsage));
    }
  }
  return f;
}

torch::Tensor Fp32Cpu(const torch::Tensor& t) {
  return t.detach().to(torch::kCPU).to(torch::kFloat32).contiguous();
}

absl::Status Run(const Flags& f) {
  ASSIGN_OR_RETURN(ModelSpec spec, LoadHfConfigFile(f.Get("--model")));
  const std::optional<DType> dtype = ParseDType(f.Get("--dtype", "fp32"));
  if (!dtype.has_value()) return absl::InvalidArgumentError("--dtype: fp32 or bf16");
  const torch::Device device(f.Get("--device", "cpu"));

  ASSIGN_OR_RETURN(std::vector<NamedParam> tokens, io::ReadSafetensorsFile(f.Get("--tokens")));
  torch::Tensor ids, targets;
  for (const NamedParam& t : tokens) {
    if (t.name == "input_ids") ids = t.param;
    if (t.name == "targets") targets = t.param;
  }
  if (!ids.defined() || !targets.defined() || ids.sizes() != targets.sizes() || ids.dim() != 2) {
    return absl::InvalidArgumentError("--tokens: needs input_ids and targets of one [rows, seq]");
  }
  ASSIGN_OR_RETURN(int64_t grad_accum, f.Int("--grad-accum", 1));
  if (grad_accum < 1 || ids.size(0) % grad_accum != 0) {
    return absl::InvalidArgumentError("--grad-accum must divide the token rows");
  }

  LlamaModelOptions model_options;
  model_options.spec = spec;
  model_options.dtype = *dtype;
  model_options.device = device;
  ASSIGN_OR_RETURN(model_options.head_chunk_rows, f.Int("--head-chunk-rows", 0));
  ASSIGN_OR_RETURN(model_options.lora.rank, f.Int("--lora-rank", 0));
  if (model_options.lora.enabled()) {
    ASSIGN_OR_RETURN(model_options.lora.alpha, f.Double("--lora-alpha", 16));
    ASSIGN_OR_RETURN(model_options.lora.dropout, f.Double("--lora-dropout", 0));
    ASSIGN_OR_RETURN(model_options.lora.targets,
                     ParseLoraTargetList("--lora-targets", f.Get("--lora-targets", "q_proj,v_proj")));
    model_options.lora.nf4_base = f.Get("--qlora") == "1";
  }
  ASSIGN_OR_RETURN(std::unique_ptr<LlamaModel> model, LlamaModel::Create(model_options));
  ASSIGN_OR_RETURN(std::unique_ptr<io::HfCheckpoint> checkpoint,
                   io::HfCheckpoint::Open(f.Get("--model")));
  ASSIGN_OR_RETURN(io::HfLoadReport report, io::LoadModelCheckpoint(*checkpoint, *model));
  if (!f.Get("--load-adapter").empty()) {
    ASSIGN_OR_RETURN(io::PeftAdapter adapter, io::ReadPeftAdapter(f.Get("--load-adapter")));
    if (adapter.lora.rank != model_options.lora.rank ||
        adapter.lora.alpha != model_options.lora.alpha) {
      return absl::InvalidArgumentError("--load-adapter: its r / lora_alpha differ from the flags");
    }
    RETURN_IF_ERROR(io::CopyParamsByName(adapter.tensors, model->TrainableParams()));
  }
  std::vector<NamedParam> out;
  {
    torch::NoGradGuard no_grad;
    out.push_back({"logits", Fp32Cpu(model->Logits(ids.to(device)))});
  }

  TrainerOptions options;
  options.grad_accum = static_cast<int>(grad_accum);
  ASSIGN_OR_RETURN(options.max_grad_norm, f.Double("--clip", 0));
  ASSIGN_OR_RETURN(options.adamw.lr, f.Double("--lr", 1e-3));
  ASSIGN_OR_RETURN(options.adamw.beta1, f.Double("--beta1", 0.9));
  ASSIGN_OR_RETURN(options.adamw.beta2, f.Double("--beta2", 0.999));
  ASSIGN_OR_RETURN(options.adamw.eps, f.Double("--eps", 1e-8));
  ASSIGN_OR_RETURN(options.adamw.weight_decay, f.Double("--weight-decay", 0.01));
  options.plain_reference = f.plain;
  const std::optional<OptimizerKind> optimizer = ParseOptimizer(f.Get("--optimizer", "adamw"));
  if (!optimizer.has_value()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--optimizer: allowed ", std::string(OptimizerAllowList())));
  }
  options.optimizer = *optimizer;
  if (!f.Get("--block-modes").empty()) {
    ASSIGN_OR_RETURN(options.block_modes, ParseBlockModeList(f.Get("--block-modes")));
  }
  if (!f.Get("--chunk-kib").empty()) {
    options.managed = true;
    ASSIGN_OR_RETURN(int64_t kib, f.Int("--chunk-kib", 0));
    options.chunks.chunk_bytes = kib << 10;
    ASSIGN_OR_RETURN(int64_t n_persist, f.Int("--n-persist", 0));
    ASSIGN_OR_RETURN(int64_t n_buffer, f.Int("--n-buffer", 2));
    options.chunks.n_persist = static_cast<int>(n_persist);
    options.chunks.n_buffer = static_cast<int>(n_buffer);
    options.chunks.max_grad_norm = options.max_grad_norm;
    options.chunks.cpu_threads = 2;
    ASSIGN_OR_RETURN(int64_t adapter_n_persist, f.Int("--adapter-n-persist", -1));
    options.adapter_n_persist = static_cast<int>(adapter_n_persist);
  }
  ASSIGN_OR_RETURN(std::unique_ptr<Trainer> trainer, Trainer::Create(model.get(), options));

  std::vector<MicroBatch> batches;
  const int64_t rows = ids.size(0) / grad_accum;
  for (int64_t i = 0; i < grad_accum; ++i) {
    batches.push_back({ids.slice(0, i * rows, (i + 1) * rows).contiguous(),
                       targets.slice(0, i * rows, (i + 1) * rows).contiguous()});
  }
  if (!f.Get("--seed").empty()) {
    ASSIGN_OR_RETURN(int64_t seed, f.Int("--seed", 0));
    torch::manual_seed(static_cast<uint64_t>(seed));
  }
  ASSIGN_OR_RETURN(double loss, trainer->ForwardBackward(batches));
  out.push_back({"loss", torch::tensor({static_cast<float>(loss)})});
  for (const NamedParam& g : trainer->Grads()) out.push_back({"grad." + g.name, Fp32Cpu(g.param)});
  ASSIGN_OR_RETURN(double norm, trainer->OptimizerStep());
  (void)norm;
  for (const NamedParam& p : trainer->Params()) {
    out.push_back({"param." + p.name, Fp32Cpu(p.param)});
  }
  RETURN_IF_ERROR(io::SaveSafetensorsFile(f.Get("--out"), out));
  if (!f.Get("--save-adapter").empty()) {
    RETURN_IF_ERROR(io::SavePeftAdapter(f.Get("--save-adapter"), model_options.lora,
                                        f.Get("--model"), trainer->Params()));
  }
  if (!f.Get("--merge-export").empty()) {
    ASSIGN_OR_RETURN(const std::vector<NamedParam> base,
                     model->DequantizedBase(trainer->BaseParams()));
    ASSIGN_OR_RETURN(std::vector<NamedParam> merged,
                     io::MergeLora(base, trainer->Params(), model_options.lora));
    io::TrainerState state;
    state.model = spec;
    state.param_dtype = *dtype;
    RETURN_IF_ERROR(io::SaveCheckpoint(f.Get("--merge-export"), state, merged, {}));
  }
  if (!f.Get("--save-hf").empty() && !model_options.lora.enabled()) {
    io::TrainerState state;
    state.workload.micro_batch = rows;
    state.workload.seq_len = ids.size(1);
    state.workload.grad_accum = static_cast<int32_t>(grad_accum);
    RETURN_IF_ERROR(trainer->SaveCheckpoint(f.Get("--save-hf"), state));
  }
  std::printf("parity run: %lld tensors loaded, loss %.8f, %zu outputs\n",
              static_cast<long long>(report.tensors_loaded), loss, out.size());
  return absl::OkStatus();
}

}  // namespace
}  // namespace memplan

int main(int argc, char** argv) {
  absl::StatusOr<memplan::Flags> flags = memplan::ParseFlags(argc, argv);
  if (!flags.ok()) {
    std::fprintf(stderr, "memplan-hf-parity: %s\n", std::string(flags.status().message()).c_str());
    return 2;
  }
  absl::Status s;
  try {
    s = memplan::Run(*flags);
  } catch (const c10::Error& e) {
    s = absl::InternalError(e.what_without_backtrace());
  }
  if (!s.ok()) {
    std::fprintf(stderr, "memplan-hf-parity: %s\n", s.ToString().c_str());
    return 1;
  }
  return 0;
}
