#include "agent/io/model_files.h"

#include <cstdint>

#include "agent/io/file_system.h"
#include "agent/io/writable_file.h"
#include "common/status.h"

namespace memplan::io {
namespace {

// A tokenizer.json of a large vocabulary is tens of megabytes; nothing here approaches this.
constexpr int64_t kMaxSideFileBytes = int64_t{1} << 30;

}  // namespace

const std::vector<std::string>& ModelSideFileNames() {
  static const std::vector<std::string> names = {
      "tokenizer.json",   "tokenizer_config.json", "special_tokens_map.json",
      "tokenizer.model",  "vocab.json",            "merges.txt",
      "vocab.txt",        "added_tokens.json",     "chat_template.jinja",
      "generation_config.json"};
  return names;
}

absl::StatusOr<std::vector<std::string>> CopyModelSideFiles(const std::string& from_dir,
                                                            const std::string& to_dir) {
  std::vector<std::string> copied;
  if (AbsolutePath(from_dir) == AbsolutePath(to_dir)) return copied;
  for (const std::string& name : ModelSideFileNames()) {
    const std::string from = JoinPath(from_dir, name);
    if (!IsRegularFile(from)) continue;
    ASSIGN_OR_RETURN(std::string bytes, ReadSmallFile(from, kMaxSideFileBytes));
    RETURN_IF_ERROR(WriteFileDurably(JoinPath(to_dir, name), bytes));
    copied.push_back(name);
  }
  return copied;
}

}  // namespace memplan::io
