#include "agent/cli/export_command.h"

#include <cstdio>
#include <string>
#include <vector>

#include "absl/strings/str_join.h"
#include "agent/io/checkpoint.h"
#include "agent/io/model_files.h"
#include "common/flags.h"

namespace memplan {
namespace {

constexpr char kExportUsage[] = R"(usage: memplan-agent export CHECKPOINT_DIR OUT_DIR [--params-only] [--source-model DIR]

Reads a memplan training checkpoint (a per-rank one, written by several ranks, is assembled from
its rank-*.safetensors files) and writes OUT_DIR as one checkpoint: config.json +
model.safetensors, which Hugging Face transformers loads (from_pretrained), plus trainer.json and
optimizer.safetensors, from which any number of ranks resumes. OUT_DIR is replaced atomically if
it is a checkpoint already; any other existing non-empty directory is refused.
  --params-only   leave the optimizer state out (no optimizer.safetensors; a run resumed from
                  it starts the optimizer afresh); of an OSFT checkpoint, the factors too
                  (osft_config.json, osft_factors.safetensors): the merged model alone
  --source-model DIR   copy the tokenizer files and generation_config.json from DIR (the
                  Hugging Face model the run trained); default: from CHECKPOINT_DIR, where
                  `memplan-agent train --model DIR --save` puts them
An OSFT checkpoint's osft_config.json and osft_factors.safetensors are copied along
(docs/agent.md, "OSFT"). The whole model is held in host memory while it is written.
)";

}  // namespace

int RunExportCommand(const std::vector<std::string>& args) {
  for (const std::string& a : args) {
    if (a == "--help" || a == "-h") {
      std::fputs(kExportUsage, stdout);
      return 0;
    }
  }
  std::vector<std::string> positional;
  bool params_only = false;
  std::string source_model;
  FlagSet flags;
  flags.Switch("--params-only", &params_only).NonEmptyString("--source-model", &source_model);
  if (absl::Status s = flags.Parse(args, &positional); !s.ok()) {
    std::fprintf(stderr, "memplan-agent export: %s\n%s", std::string(s.message()).c_str(),
                 kExportUsage);
    return 2;
  }
  if (positional.size() != 2) {
    std::fprintf(stderr, "memplan-agent export: need CHECKPOINT_DIR and OUT_DIR\n%s",
                 kExportUsage);
    return 2;
  }
  absl::StatusOr<io::Checkpoint> checkpoint = io::LoadCheckpoint(positional[0]);
  if (!checkpoint.ok()) {
    std::fprintf(stderr, "memplan-agent export: %s\n", checkpoint.status().ToString().c_str());
    return 1;
  }
  if (params_only) {
    checkpoint->optimizer_state.clear();
    // [OSFT checkpoints] The merged weights are the model; without its factors it is not an
    // OSFT run's any more.
    checkpoint->osft = io::OsftCheckpoint();
  }
  const absl::Status saved =
      io::SaveCheckpoint(positional[1], checkpoint->trainer, checkpoint->params,
                         checkpoint->optimizer_state, checkpoint->osft);
  if (!saved.ok()) {
    std::fprintf(stderr, "memplan-agent export: %s\n", saved.ToString().c_str());
    return 1;
  }
  // The tokenizer and generation settings, so OUT_DIR loads and generates like its source.
  absl::StatusOr<std::vector<std::string>> copied =
      io::CopyModelSideFiles(source_model.empty() ? positional[0] : source_model, positional[1]);
  if (!copied.ok()) {
    std::fprintf(stderr, "memplan-agent export: %s\n", copied.status().ToString().c_str());
    return 1;
  }
  std::printf("exported %s (step %lld, %zu parameters%s) to %s\n", positional[0].c_str(),
              static_cast<long long>(checkpoint->trainer.step), checkpoint->params.size(),
              checkpoint->optimizer_state.empty() ? "" : " and optimizer state",
              positional[1].c_str());
  std::printf("copied %s\n", copied->empty() ? "no tokenizer or generation_config.json files"
                                             : absl::StrJoin(*copied, ", ").c_str());
  return 0;
}

}  // namespace memplan
