#include "agent/cli/export_command.h"

#include <cstdio>
#include <string>
#include <vector>

#include "agent/io/checkpoint.h"
#include "common/flags.h"

namespace memplan {
namespace {

constexpr char kExportUsage[] = R"(usage: memplan-agent export CHECKPOINT_DIR OUT_DIR [--params-only]

Reads a memplan training checkpoint (a per-rank one, written by several ranks, is assembled from
its rank-*.safetensors files) and writes OUT_DIR as one checkpoint: config.json +
model.safetensors, which Hugging Face transformers loads (from_pretrained), plus trainer.json and
optimizer.safetensors, from which any number of ranks resumes. OUT_DIR is replaced atomically if
it is a checkpoint already; any other existing non-empty directory is refused.
  --params-only   leave the optimizer state out (a smaller model export; a run resumed from it
                  starts the optimizer afresh)
The whole model is held in host memory while it is written.
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
  FlagSet flags;
  flags.Switch("--params-only", &params_only);
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
  if (params_only) checkpoint->optimizer_state.clear();
  const absl::Status saved = io::SaveCheckpoint(positional[1], checkpoint->trainer,
                                                checkpoint->params, checkpoint->optimizer_state);
  if (!saved.ok()) {
    std::fprintf(stderr, "memplan-agent export: %s\n", saved.ToString().c_str());
    return 1;
  }
  std::printf("exported %s (step %lld, %zu parameters%s) to %s\n", positional[0].c_str(),
              static_cast<long long>(checkpoint->trainer.step), checkpoint->params.size(),
              params_only ? "" : " and optimizer state", positional[1].c_str());
  return 0;
}

}  // namespace memplan
