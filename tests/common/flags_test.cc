#include "common/flags.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <optional>
#include <string>
#include <vector>

namespace memplan {
namespace {

using ::testing::ElementsAre;

// The message of a parse that must fail with INVALID_ARGUMENT.
std::string ErrorOf(FlagSet& flags, std::vector<std::string> args) {
  const absl::Status s = flags.Parse(args);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  return std::string(s.message());
}

TEST(FlagSetTest, BothSpellingsOfAValue) {
  int64_t seq = 0;
  std::string name;
  FlagSet flags;
  flags.Int("--seq", &seq, 1, 100).String("--name", &name);
  ASSERT_TRUE(flags.Parse({"--seq=7", "--name", "x=y"}).ok());
  EXPECT_EQ(seq, 7);
  EXPECT_EQ(name, "x=y");
  ASSERT_TRUE(flags.Parse({"--seq", "8", "--name=a=b"}).ok());
  EXPECT_EQ(seq, 8);
  EXPECT_EQ(name, "a=b");  // only the first '=' splits
  // A value flag takes the next argument whatever it looks like.
  EXPECT_EQ(ErrorOf(flags, {"--seq", "-5"}), "--seq: -5 is outside [1, 100]");
  ASSERT_TRUE(flags.Parse({"--name", "--seq"}).ok());
  EXPECT_EQ(name, "--seq");
}

TEST(FlagSetTest, IntegersNameTheFlagAndTheRange) {
  int32_t n = 0;
  std::optional<int64_t> batch;
  FlagSet flags;
  flags.Int("--n", &n, 0, 10).Int(IntFlagSpec{"--batch", 1, 65536}, &batch);
  ASSERT_TRUE(flags.Parse({"--n", "0"}).ok());
  EXPECT_EQ(n, 0);
  EXPECT_FALSE(batch.has_value()) << "written only when given";
  ASSERT_TRUE(flags.Parse({"--batch=65536"}).ok());
  EXPECT_EQ(batch, 65536);
  EXPECT_EQ(ErrorOf(flags, {"--batch", "0"}), "--batch: 0 is outside [1, 65536]");
  EXPECT_EQ(ErrorOf(flags, {"--batch", "65537"}), "--batch: 65537 is outside [1, 65536]");
  EXPECT_EQ(ErrorOf(flags, {"--batch", "two"}), "--batch: \"two\" is not an integer in [1, 65536]");
  EXPECT_EQ(ErrorOf(flags, {"--n=1.5"}), "--n: \"1.5\" is not an integer in [0, 10]");
  EXPECT_EQ(ErrorOf(flags, {"--n="}), "--n: \"\" is not an integer in [0, 10]");
  EXPECT_EQ(ErrorOf(flags, {"--n", "99999999999999999999"}),
            "--n: \"99999999999999999999\" is not an integer in [0, 10]");
}

TEST(FlagSetTest, NumbersWithClosedAndOpenRanges) {
  double lr = 0;
  double dropout = 0;
  std::optional<double> margin;
  FlagSet flags;
  flags.Double("--lr", &lr, 0, 1e3)
      .Double("--dropout", &dropout, DoubleRange{0, 1, false, true})
      .Double(DoubleFlagSpec{"--margin", {0, 0.5}}, &margin);
  ASSERT_TRUE(flags.Parse({"--lr", "3e-4", "--dropout=0.5", "--margin", "0.5"}).ok());
  EXPECT_DOUBLE_EQ(lr, 3e-4);
  EXPECT_EQ(dropout, 0.5);
  EXPECT_EQ(margin, 0.5);
  EXPECT_EQ(ErrorOf(flags, {"--margin", "0.9"}), "--margin: 0.9 is outside [0, 0.5]");
  EXPECT_EQ(ErrorOf(flags, {"--dropout", "1"}), "--dropout: 1 is outside [0, 1)");
  EXPECT_EQ(ErrorOf(flags, {"--lr", "fast"}), "--lr: \"fast\" is not a number in [0, 1000]");
  EXPECT_EQ(ErrorOf(flags, {"--lr", "nan"}), "--lr: \"nan\" is not a number in [0, 1000]");
  EXPECT_EQ(ErrorOf(flags, {"--lr", "inf"}), "--lr: \"inf\" is not a number in [0, 1000]");
  EXPECT_EQ(ErrorOf(flags, {"--lr", "2000"}), "--lr: 2000 is outside [0, 1000]");
}

TEST(FlagSetTest, SwitchesTakeNoValue) {
  bool plain = false;
  int calls = 0;
  FlagSet flags;
  flags.Switch("--plain", &plain).CustomSwitch("--qlora", [&calls] { ++calls; });
  ASSERT_TRUE(flags.Parse({"--plain", "--qlora"}).ok());
  EXPECT_TRUE(plain);
  EXPECT_EQ(calls, 1);
  EXPECT_EQ(ErrorOf(flags, {"--plain=yes"}), "--plain: takes no value");
  EXPECT_FALSE(flags.TakesValue("--plain"));
}

TEST(FlagSetTest, StringsMissingAndEmptyValues) {
  std::string db = "default";
  std::string metrics = "default";
  FlagSet flags;
  flags.NonEmptyString("--db", &db).String("--metrics", &metrics);
  ASSERT_TRUE(flags.Parse({"--metrics="}).ok());
  EXPECT_EQ(metrics, "") << "String accepts the empty value";
  EXPECT_EQ(ErrorOf(flags, {"--db="}), "--db: must not be empty");
  EXPECT_EQ(db, "default");
  EXPECT_EQ(ErrorOf(flags, {"--db"}), "--db: needs a value");
}

TEST(FlagSetTest, ChoicesListWhatIsAllowed) {
  enum class Mode { kQuick, kFull };
  Mode mode = Mode::kQuick;
  std::optional<bool> sharded;
  std::optional<int> parsed;
  FlagSet flags;
  flags
      .Choice("--mode", &mode,
              FlagSet::Choices<Mode>{{"quick", Mode::kQuick}, {"full", Mode::kFull}})
      .Choice("--state", &sharded, FlagSet::Choices<bool>{{"sharded", true}, {"replicated", false}})
      .Choice<std::optional<int>, int>(
          "--level", &parsed,
          [](absl::string_view v) -> std::optional<int> {
            if (v == "one" || v == "ONE") return 1;
            return std::nullopt;
          },
          "one");
  ASSERT_TRUE(flags.Parse({"--mode", "full", "--state=replicated", "--level", "ONE"}).ok());
  EXPECT_EQ(mode, Mode::kFull);
  EXPECT_EQ(sharded, false);
  EXPECT_EQ(parsed, 1);
  EXPECT_EQ(ErrorOf(flags, {"--mode", "fast"}), "--mode: \"fast\" is not one of quick, full");
  EXPECT_EQ(ErrorOf(flags, {"--level=two"}), "--level: \"two\" is not one of one");
  // A long value is quoted in part (common/validate.h's Quote).
  const std::string message = ErrorOf(flags, {"--mode", std::string(1000, 'x')});
  EXPECT_THAT(message, ::testing::HasSubstr("(1000 bytes) is not one of quick, full"));
  EXPECT_LT(message.size(), 200u);
}

TEST(FlagSetTest, CommaListsAndTheAllWord) {
  static constexpr const char* kModules[] = {"q_proj", "k_proj", "v_proj"};
  std::vector<std::string> targets;
  FlagSet flags;
  flags.List("--targets", &targets, kModules, "all");
  ASSERT_TRUE(flags.Parse({"--targets", "v_proj, q_proj"}).ok());
  EXPECT_THAT(targets, ElementsAre("v_proj", "q_proj"));
  ASSERT_TRUE(flags.Parse({"--targets=all"}).ok());
  EXPECT_THAT(targets, ElementsAre("q_proj", "k_proj", "v_proj"));
  EXPECT_EQ(ErrorOf(flags, {"--targets", "q_proj,mlp"}),
            "--targets: \"mlp\" is not one of q_proj, k_proj, v_proj (or all)");
  EXPECT_EQ(ErrorOf(flags, {"--targets", " , "}),
            "--targets: expected a comma-separated list of q_proj, k_proj, v_proj (or all)");
}

TEST(FlagSetTest, CustomFlagsGetTheFlagInFrontOfTheirProblem) {
  int64_t bytes = 0;
  FlagSet flags;
  flags.Custom("--size", [&bytes](absl::string_view v) -> absl::Status {
    if (v != "1K") return absl::InvalidArgumentError("expected 1K");
    bytes = 1024;
    return absl::OkStatus();
  });
  ASSERT_TRUE(flags.Parse({"--size", "1K"}).ok());
  EXPECT_EQ(bytes, 1024);
  EXPECT_EQ(ErrorOf(flags, {"--size", "2K"}), "--size: expected 1K");
}

TEST(FlagSetTest, AliasesAreNamedAsGiven) {
  std::optional<double> margin;
  FlagSet flags;
  flags.Double("--safety-margin", &margin, 0, 0.5).Alias("--margin", "--safety-margin");
  ASSERT_TRUE(flags.Parse({"--margin", "0.25"}).ok());
  EXPECT_EQ(margin, 0.25);
  EXPECT_TRUE(flags.Given("--safety-margin"));
  EXPECT_TRUE(flags.Given("--margin"));
  EXPECT_EQ(ErrorOf(flags, {"--margin=1"}), "--margin: 1 is outside [0, 0.5]");
  EXPECT_EQ(ErrorOf(flags, {"--safety-margin=1"}), "--safety-margin: 1 is outside [0, 0.5]");
  EXPECT_THAT(flags.Names(), ElementsAre("--margin", "--safety-margin"));
}

TEST(FlagSetTest, UnknownFlagsAndPositionals) {
  bool help = false;
  FlagSet flags("see --help");
  flags.Switch("--help", &help).Alias("-h", "--help");
  EXPECT_EQ(ErrorOf(flags, {"--bogus=1"}), "unknown flag --bogus; see --help");
  EXPECT_EQ(ErrorOf(flags, {"positional"}), "unexpected argument \"positional\"; see --help");
  FlagSet bare;
  EXPECT_EQ(ErrorOf(bare, {"--bogus"}), "unknown flag --bogus");
  std::vector<std::string> positionals;
  ASSERT_TRUE(flags.Parse({"a", "-h", "-", "b"}, &positionals).ok());
  EXPECT_TRUE(help);
  EXPECT_THAT(positionals, ElementsAre("a", "-", "b")) << "\"-\" is a positional (stdin)";
  EXPECT_FALSE(FlagSet().Given("--help"));
}

TEST(FlagSetTest, TakeLeavesTheOtherArgumentsInOrder) {
  std::string ca;
  int64_t port = 0;
  FlagSet flags;
  flags.NonEmptyString("--tls-ca", &ca).Int("--port", &port, 1, 65535);
  std::vector<std::string> args = {"--out", "x",         "--tls-ca", "ca.pem",
                                   "pos",   "--port=80", "--other"};
  ASSERT_TRUE(flags.Take(&args).ok());
  EXPECT_EQ(ca, "ca.pem");
  EXPECT_EQ(port, 80);
  EXPECT_THAT(args, ElementsAre("--out", "x", "pos", "--other"));
  EXPECT_TRUE(flags.Given("--port"));
  std::vector<std::string> bad = {"--port", "0"};
  EXPECT_EQ(flags.Take(&bad).message(), "--port: 0 is outside [1, 65535]");
  std::vector<std::string> missing = {"--x", "--tls-ca"};
  EXPECT_EQ(flags.Take(&missing).message(), "--tls-ca: needs a value");
}

TEST(FlagSetTest, ApplyAtStepsThroughAnArgumentList) {
  int64_t n = 0;
  FlagSet flags;
  flags.Int("--n", &n, 0, 9);
  const std::vector<std::string> args = {"word", "--n", "4", "--n=5"};
  size_t i = 1;
  ASSERT_TRUE(flags.ApplyAt(args, &i).ok());
  EXPECT_EQ(i, 2u) << "the value's index";
  EXPECT_EQ(n, 4);
  i = 3;
  ASSERT_TRUE(flags.ApplyAt(args, &i).ok());
  EXPECT_EQ(i, 3u);
  EXPECT_EQ(n, 5);
  EXPECT_TRUE(flags.Has("--n"));
  EXPECT_FALSE(flags.Has("--m"));
  EXPECT_TRUE(flags.TakesValue("--n"));
}

TEST(FlagValueTest, ProblemsWithoutAFlag) {
  EXPECT_EQ(*ParseIntValue("42", 0, 100), 42);
  EXPECT_EQ(*ParseIntValue(" 42 ", 0, 100), 42);
  EXPECT_EQ(ParseIntValue("101", 0, 100).status().message(), "101 is outside [0, 100]");
  EXPECT_EQ(ParseIntValue("x", 0, 100).status().message(), "\"x\" is not an integer in [0, 100]");
  EXPECT_EQ(*ParseDoubleValue("0.25", 0, 1), 0.25);
  EXPECT_EQ(ParseDoubleValue("0", DoubleRange{0, 1, true, false}).status().message(),
            "0 is outside (0, 1]");
  EXPECT_EQ(ParseIntFlag("--pool GPUS", "0", 1, 1000000).status().message(),
            "--pool GPUS: 0 is outside [1, 1000000]");
  EXPECT_EQ(ParseDoubleFlag("--lr", "x", DoubleRange{0, 1}).status().message(),
            "--lr: \"x\" is not a number in [0, 1]");
  EXPECT_EQ(FlagError("--pool", "no NAME=").message(), "--pool: no NAME=");
  EXPECT_EQ(NotOneOf("mpi", "nccl, gloo"), "\"mpi\" is not one of nccl, gloo");
  EXPECT_EQ(RangeText(1, 2), "[1, 2]");
  EXPECT_EQ(RangeText(DoubleRange{0, 1, false, true}), "[0, 1)");
}

TEST(SplitFlagTest, NameAndInlineValue) {
  EXPECT_EQ(SplitFlag("--a=b").name, "--a");
  EXPECT_EQ(SplitFlag("--a=b").value, "b");
  EXPECT_EQ(SplitFlag("--a").value, std::nullopt);
  EXPECT_EQ(SplitFlag("x=y").name, "x=y") << "a positional keeps its '='";
  EXPECT_TRUE(IsFlag("-h"));
  EXPECT_FALSE(IsFlag("-"));
  EXPECT_FALSE(IsFlag("plan"));
}

}  // namespace
}  // namespace memplan
