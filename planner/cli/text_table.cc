#include "planner/cli/text_table.h"

#include <algorithm>
#include <utility>

namespace memplan::cli {

int DisplayWidth(const std::string& text) {
  int width = 0;
  // Count every byte that is not a UTF-8 continuation byte (10xxxxxx).
  for (unsigned char c : text) width += (c & 0xC0) != 0x80;
  return width;
}

TextTable::TextTable(std::vector<std::string> headers, std::vector<Align> aligns)
    : headers_(std::move(headers)), aligns_(std::move(aligns)) {
  aligns_.resize(headers_.size(), Align::kLeft);
}

void TextTable::AddRow(std::vector<std::string> cells) {
  cells.resize(headers_.size());
  rows_.push_back(std::move(cells));
}

std::string TextTable::Render(int indent) const {
  std::vector<int> widths(headers_.size(), 0);
  for (size_t c = 0; c < headers_.size(); ++c) widths[c] = DisplayWidth(headers_[c]);
  for (const auto& row : rows_) {
    for (size_t c = 0; c < row.size(); ++c) widths[c] = std::max(widths[c], DisplayWidth(row[c]));
  }
  const std::string margin(static_cast<size_t>(std::max(indent, 0)), ' ');
  auto line = [&](const std::vector<std::string>& cells) {
    std::string out = margin;
    for (size_t c = 0; c < cells.size(); ++c) {
      const std::string pad(static_cast<size_t>(widths[c] - DisplayWidth(cells[c])), ' ');
      const bool last = c + 1 == cells.size();
      if (aligns_[c] == Align::kRight) {
        out += pad + cells[c];
      } else {
        out += cells[c];
        if (!last) out += pad;
      }
      if (!last) out += "  ";
    }
    // Trailing blanks from empty left-aligned cells serve no one.
    while (!out.empty() && out.back() == ' ') out.pop_back();
    return out + "\n";
  };
  std::string out = line(headers_);
  std::vector<std::string> rule;
  for (int w : widths) rule.push_back(std::string(static_cast<size_t>(w), '-'));
  out += line(rule);
  for (const auto& row : rows_) out += line(row);
  return out;
}

}  // namespace memplan::cli
