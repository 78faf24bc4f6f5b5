#include "planner/cli/text_table.h"

#include "gtest/gtest.h"

namespace memplan::cli {
namespace {

TEST(TextTableTest, AlignsColumnsAndCountsUtf8AsOneColumn) {
  TextTable table({"name", "GiB", "blocks"},
                  {TextTable::Align::kLeft, TextTable::Align::kRight, TextTable::Align::kLeft});
  table.AddRow({"a", "1.50", "ckpt×12 none×4"});
  table.AddRow({"longer", "71.25", "none×16"});
  EXPECT_EQ(table.Render(),
            "name      GiB  blocks\n"
            "------  -----  --------------\n"
            "a        1.50  ckpt×12 none×4\n"
            "longer  71.25  none×16\n");
  EXPECT_EQ(table.row_count(), 2);
}

TEST(TextTableTest, IndentsAndPadsShortRowsAndDropsExtraCells) {
  TextTable table({"k", "v"});
  table.AddRow({"x"});
  table.AddRow({"y", "2", "surplus"});
  EXPECT_EQ(table.Render(2),
            "  k  v\n"
            "  -  -\n"
            "  x\n"
            "  y  2\n");
}

TEST(TextTableTest, DisplayWidthCountsCodePoints) {
  EXPECT_EQ(DisplayWidth(""), 0);
  EXPECT_EQ(DisplayWidth("abc"), 3);
  EXPECT_EQ(DisplayWidth("×"), 1);  // two bytes in UTF-8
  EXPECT_EQ(DisplayWidth("ckpt×12"), 7);
}

}  // namespace
}  // namespace memplan::cli
