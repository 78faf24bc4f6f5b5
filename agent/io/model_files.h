// The files of a Hugging Face model directory that are not weights but travel with them: the
// tokenizer (tokenizer.json, tokenizer_config.json, special_tokens_map.json, tokenizer.model,
// vocab.json / merges.txt / vocab.txt, added_tokens.json, chat_template.jinja) and
// generation_config.json. Exports copy them so that the written directory loads and generates
// like its source. Torch-free.
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace memplan::io {

// The file names above, in a fixed order.
const std::vector<std::string>& ModelSideFileNames();

// Copies each of ModelSideFileNames() that `from_dir` holds into `to_dir` (which must exist),
// replacing what is there, each written durably; returns the names copied (none: empty). Copying
// a directory onto itself copies nothing.
absl::StatusOr<std::vector<std::string>> CopyModelSideFiles(const std::string& from_dir,
                                                            const std::string& to_dir);

}  // namespace memplan::io
