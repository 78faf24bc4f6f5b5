// `memplan-agent export`: one training checkpoint (per-rank or not) rewritten as a single-writer
// checkpoint directory, which is also a Hugging Face checkpoint (config.json + model.safetensors)
// that transformers' from_pretrained loads. Torch-free header; returns the process exit code.
#pragma once

#include <string>
#include <vector>

namespace memplan {

// 0 on success, 1 on an I/O or validation error, 2 on bad arguments.
int RunExportCommand(const std::vector<std::string>& args);

}  // namespace memplan
