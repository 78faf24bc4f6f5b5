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
// --images FILE: a vision-language model's images, a safetensors file with pixel_values
// [patches, C·T·P·P] and int64 image_grid_thw [images, 3] of all rows, in order.
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "agent/io/checkpoint.h"
#include "agent/io/hf_checkpoint.h"
#include "agent/io/peft_adapter.h"
#include "agent/io/safetensors_torch.h"
#include "agent/model/llama_model.h"
#include "agent/train/train_config.h"
#include "agent/train/trainer.h"
#include "common/flags.h"
#include "common/hf_config.h"
#include "common/request_flags.h"
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
    "  --images FILE        safetensors with pixel_values and image_grid_thw of every row\n"
    "  --vision-checkpoint  recompute the vision tower's blocks in backward\n"
    "LoRA (grads and params are then the adapters'):\n"
    "  --lora-rank N --lora-alpha F --lora-dropout F --lora-targets LIST|all [--qlora 1]\n"
    "  --load-adapter DIR   initial adapter values from a PEFT adapter directory\n"
    "  --adapter-n-persist N  managed: the adapters' persistent chunks (default all)\n"
    "  --seed N             torch::manual_seed(N) right before the step (dropout masks)\n"
    "  --save-adapter DIR   write the adapter after the step in PEFT's format\n"
    "  --merge-export DIR   write base + merged adapter after the step (Hugging Face layout)\n"
    "OSFT (grads and params are then the low factors'):\n"
    "  --osft-rank-ratio R --osft-targets LIST|all\n"
    "  --steps N            optimizer steps on the same batches (default 1); loss.K is step K's\n"
    "                       loss (K >= 2), grads are the first step's, params after the last\n";

// The flags, read by common/flags.h; unset ones keep these defaults.
struct Flags {
  std::string model, tokens, out;
  std::optional<DType> dtype = DType::kFloat32;
  std::string device = "cpu";
  int64_t grad_accum = 1;
  bool plain = false;
  std::optional<std::vector<BlockMode>> block_modes;
  std::optional<int64_t> chunk_kib;  // set: managed
  int64_t n_persist = 0;
  int64_t n_buffer = 2;
  std::optional<OptimizerKind> optimizer = OptimizerKind::kAdamW;
  double lr = 1e-3, beta1 = 0.9, beta2 = 0.999, eps = 1e-8, weight_decay = 0.01, clip = 0;
  int64_t head_chunk_rows = 0;
  std::string save_hf;
  std::string images;
  bool vision_checkpoint = false;
  LoraOptions lora;
  std::string load_adapter, save_adapter, merge_export;
  int64_t adapter_n_persist = -1;  // -1: all persistent
  std::optional<int64_t> seed;
  OsftOptions osft;
  int64_t steps = 1;
};

absl::StatusOr<Flags> ParseFlags(int argc, char** argv) {
  Flags f;
  f.lora.targets = {"q_proj", "v_proj"};
  bool help = false;
  FlagSet flags("see --help");
  flags.Switch("--help", &help)
      .Alias("-h", "--help")
      .NonEmptyString("--model", &f.model)
      .NonEmptyString("--tokens", &f.tokens)
      .NonEmptyString("--out", &f.out)
      .String("--device", &f.device)
      .Int(kGradAccumFlag, &f.grad_accum)
      .Switch("--plain", &f.plain)
      .Custom("--block-modes",
              [&f](absl::string_view v) -> absl::Status {
                ASSIGN_OR_RETURN(f.block_modes, ParseBlockModeList(v));
                return absl::OkStatus();
              })
      .Int("--chunk-kib", &f.chunk_kib, 1, int64_t{1} << 24)
      .Int("--n-persist", &f.n_persist, 0, kMaxChunkCount)
      .Int("--n-buffer", &f.n_buffer, 0, kMaxChunkCount)
      .Double("--lr", &f.lr, 0, 1e3)
      .Double("--beta1", &f.beta1, DoubleRange{0, 1, false, true})
      .Double("--beta2", &f.beta2, DoubleRange{0, 1, false, true})
      .Double("--eps", &f.eps, 0, 1)
      .Double("--weight-decay", &f.weight_decay, 0, 1e3)
      .Double("--clip", &f.clip, 0, 1e12)
      .Int("--head-chunk-rows", &f.head_chunk_rows, 0, int64_t{1} << 40)
      .String("--save-hf", &f.save_hf)
      .String("--images", &f.images)
      .Switch("--vision-checkpoint", &f.vision_checkpoint)
      .Int("--lora-rank", &f.lora.rank, 0, kMaxLoraRank)
      .Double("--lora-alpha", &f.lora.alpha, DoubleRange{0, 1e12, /*lo_open=*/true})
      .Double("--lora-dropout", &f.lora.dropout, DoubleRange{0, 1, false, /*hi_open=*/true})
      .Choice("--qlora", &f.lora.nf4_base, FlagSet::Choices<bool>{{"1", true}, {"0", false}})
      .String("--load-adapter", &f.load_adapter)
      .Int("--adapter-n-persist", &f.adapter_n_persist, -1, kMaxChunkCount)
      .Int("--seed", &f.seed, 0, std::numeric_limits<int64_t>::max())
      .String("--save-adapter", &f.save_adapter)
      .String("--merge-export", &f.merge_export)
      .Double("--osft-rank-ratio", &f.osft.rank_ratio, DoubleRange{0, 1, true, true})
      .Custom("--osft-targets",
              [&f](absl::string_view v) -> absl::Status {
                ASSIGN_OR_RETURN(f.osft.targets, ParseLoraTargetList("--osft-targets", v));
                return absl::OkStatus();
              })
      .Int("--steps", &f.steps, 1, 1000);
  AddDTypeFlag(&flags, "--dtype", &f.dtype);
  AddOptimizerFlag(&flags, &f.optimizer);
  AddLoraTargetsFlag(&flags, &f.lora.targets);
  RETURN_IF_ERROR(flags.Parse(std::vector<std::string>(argv + 1, argv + argc)));
  if (help) {
    std::fputs(kUsage, stdout);
    std::exit(0);
  }
  for (const char* required : {"--model", "--tokens", "--out"}) {
    if (!flags.Given(required)) {
      return absl::InvalidArgumentError(absl::StrCat(required, " is required\n", kUsage));
    }
  }
  return f;
}

torch::Tensor Fp32Cpu(const torch::Tensor& t) {
  return t.detach().to(torch::kCPU).to(torch::kFloat32).contiguous();
}

absl::Status Run(const Flags& f) {
  ASSIGN_OR_RETURN(ModelSpec spec, LoadHfConfigFile(f.model));
  const std::optional<DType> dtype = f.dtype;
  const torch::Device device(f.device);

  ASSIGN_OR_RETURN(std::vector<NamedParam> tokens, io::ReadSafetensorsFile(f.tokens));
  torch::Tensor ids, targets;
  for (const NamedParam& t : tokens) {
    if (t.name == "input_ids") ids = t.param;
    if (t.name == "targets") targets = t.param;
  }
  if (!ids.defined() || !targets.defined() || ids.sizes() != targets.sizes() || ids.dim() != 2) {
    return absl::InvalidArgumentError("--tokens: needs input_ids and targets of one [rows, seq]");
  }
  VisionInputs images;
  if (!f.images.empty()) {
    ASSIGN_OR_RETURN(std::vector<NamedParam> read, io::ReadSafetensorsFile(f.images));
    for (const NamedParam& t : read) {
      if (t.name == "pixel_values") images.pixel_values = t.param;
      if (t.name == "image_grid_thw") images.image_grid_thw = t.param;
    }
    if (!images.pixel_values.defined() || !images.image_grid_thw.defined()) {
      return absl::InvalidArgumentError("--images: needs pixel_values and image_grid_thw");
    }
  }
  const int64_t grad_accum = f.grad_accum;
  if (ids.size(0) % grad_accum != 0) {
    return absl::InvalidArgumentError("--grad-accum must divide the token rows");
  }

  LlamaModelOptions model_options;
  model_options.spec = spec;
  model_options.dtype = *dtype;
  model_options.device = device;
  model_options.head_chunk_rows = f.head_chunk_rows;
  model_options.vision_checkpoint = f.vision_checkpoint;
  if (f.lora.enabled()) model_options.lora = f.lora;
  if (f.osft.enabled()) model_options.osft = f.osft;
  ASSIGN_OR_RETURN(std::unique_ptr<LlamaModel> model, LlamaModel::Create(model_options));
  ASSIGN_OR_RETURN(std::unique_ptr<io::HfCheckpoint> checkpoint, io::HfCheckpoint::Open(f.model));
  ASSIGN_OR_RETURN(io::HfLoadReport report, io::LoadModelCheckpoint(*checkpoint, *model));
  if (!f.load_adapter.empty()) {
    ASSIGN_OR_RETURN(io::PeftAdapter adapter, io::ReadPeftAdapter(f.load_adapter));
    if (adapter.lora.rank != model_options.lora.rank ||
        adapter.lora.alpha != model_options.lora.alpha) {
      return absl::InvalidArgumentError("--load-adapter: its r / lora_alpha differ from the flags");
    }
    RETURN_IF_ERROR(io::CopyParamsByName(adapter.tensors, model->TrainableParams()));
  }
  std::vector<NamedParam> out;
  {
    torch::NoGradGuard no_grad;
    VisionInputs on_device = images;
    if (images.pixel_values.defined()) on_device.pixel_values = images.pixel_values.to(device);
    out.push_back({"logits", Fp32Cpu(model->Logits(ids.to(device), on_device))});
  }

  TrainerOptions options;
  options.grad_accum = static_cast<int>(grad_accum);
  options.max_grad_norm = f.clip;
  options.adamw.lr = f.lr;
  options.adamw.beta1 = f.beta1;
  options.adamw.beta2 = f.beta2;
  options.adamw.eps = f.eps;
  options.adamw.weight_decay = f.weight_decay;
  options.plain_reference = f.plain;
  options.optimizer = *f.optimizer;
  if (f.block_modes.has_value()) options.block_modes = *f.block_modes;
  if (f.chunk_kib.has_value()) {
    options.managed = true;
    options.chunks.chunk_bytes = *f.chunk_kib << 10;
    options.chunks.n_persist = static_cast<int>(f.n_persist);
    options.chunks.n_buffer = static_cast<int>(f.n_buffer);
    options.chunks.max_grad_norm = options.max_grad_norm;
    options.chunks.cpu_threads = 2;
    options.adapter_n_persist = static_cast<int>(f.adapter_n_persist);
  }
  ASSIGN_OR_RETURN(std::unique_ptr<Trainer> trainer, Trainer::Create(model.get(), options));

  std::vector<MicroBatch> batches;
  const int64_t rows = ids.size(0) / grad_accum;
  for (int64_t i = 0; i < grad_accum; ++i) {
    batches.push_back({ids.slice(0, i * rows, (i + 1) * rows).contiguous(),
                       targets.slice(0, i * rows, (i + 1) * rows).contiguous(),
                       ImagesOfRows(spec, images, ids, i * rows, (i + 1) * rows)});
  }
  if (f.seed.has_value()) torch::manual_seed(static_cast<uint64_t>(*f.seed));
  ASSIGN_OR_RETURN(double loss, trainer->ForwardBackward(batches));
  out.push_back({"loss", torch::tensor({static_cast<float>(loss)})});
  for (const NamedParam& g : trainer->Grads()) out.push_back({"grad." + g.name, Fp32Cpu(g.param)});
  ASSIGN_OR_RETURN(double norm, trainer->OptimizerStep());
  (void)norm;
  for (int64_t step = 2; step <= f.steps; ++step) {
    ASSIGN_OR_RETURN(StepStats stats, trainer->Step(batches));
    out.push_back({absl::StrCat("loss.", step), torch::tensor({static_cast<float>(stats.loss)})});
  }
  for (const NamedParam& p : trainer->Params()) {
    out.push_back({"param." + p.name, Fp32Cpu(p.param)});
  }
  RETURN_IF_ERROR(io::SaveSafetensorsFile(f.out, out));
  if (!f.save_adapter.empty()) {
    RETURN_IF_ERROR(
        io::SavePeftAdapter(f.save_adapter, model_options.lora, f.model, trainer->Params(),
                            spec.IsVisionLanguage()));
  }
  if (!f.merge_export.empty()) {
    ASSIGN_OR_RETURN(const std::vector<NamedParam> base,
                     model->DequantizedBase(trainer->BaseParams()));
    ASSIGN_OR_RETURN(std::vector<NamedParam> merged,
                     io::MergeLora(base, trainer->Params(), model_options.lora));
    io::TrainerState state;
    state.model = spec;
    state.param_dtype = *dtype;
    RETURN_IF_ERROR(io::SaveCheckpoint(f.merge_export, state, merged, {}));
  }
  if (!f.save_hf.empty() && !model_options.lora.enabled()) {
    io::TrainerState state;
    state.workload.micro_batch = rows;
    state.workload.seq_len = ids.size(1);
    state.workload.grad_accum = static_cast<int32_t>(grad_accum);
    RETURN_IF_ERROR(trainer->SaveCheckpoint(f.save_hf, state));
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
