// A plain-text table for terminal output: left-aligned text columns, right-aligned numeric ones,
// widths measured in UTF-8 code points (so "ckpt×12" lines up). Thread-compatible.
#pragma once

#include <string>
#include <vector>

namespace memplan::cli {

class TextTable {
 public:
  enum class Align { kLeft, kRight };

  // One header per column; a column is right-aligned when its alignment says so.
  explicit TextTable(std::vector<std::string> headers, std::vector<Align> aligns = {});

  // Short rows are padded with empty cells and extra cells are dropped, so a formatting slip
  // never crashes the CLI.
  void AddRow(std::vector<std::string> cells);
  int row_count() const { return static_cast<int>(rows_.size()); }

  // Header, a dashed rule, then the rows; each line indented by `indent` spaces and ending in '\n'.
  std::string Render(int indent = 0) const;

 private:
  std::vector<std::string> headers_;
  std::vector<Align> aligns_;
  std::vector<std::vector<std::string>> rows_;
};

// Display width of a UTF-8 string in code points.
int DisplayWidth(const std::string& text);

}  // namespace memplan::cli
