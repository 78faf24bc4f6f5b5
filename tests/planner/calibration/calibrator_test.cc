#include "planner/calibration/calibrator.h"

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "gtest/gtest.h"

namespace memplan {
namespace {

constexpr int64_t kGiB = int64_t{1} << 30;
constexpr int64_t kContextBytes = 500 << 20;

// A run whose true peak is alpha * raw + context, multiplied by (1 + noise).
CalibrationSample Sample(int64_t raw_bytes, double alpha, double noise, int64_t at_ms) {
  CalibrationSample s;
  s.raw_model_bytes = raw_bytes;
  s.fixed_bytes = kContextBytes;
  s.measured_bytes = static_cast<int64_t>((alpha * raw_bytes + kContextBytes) * (1 + noise));
  s.measured_at_unix_ms = at_ms;
  return s;
}

// The guarantee: no OOM sample (a plan that ran out of memory) is predicted to fit again.
void ExpectNoOomUnderEstimate(const std::vector<CalibrationSample>& samples,
                              const CalibrationResult& r) {
  for (const CalibrationSample& s : samples) {
    if (!s.oom) continue;
    EXPECT_GE(CalibratedPeakBytes(r.fragmentation_factor, r.residual_bytes, s),
              s.measured_bytes)
        << "raw=" << s.raw_model_bytes << " measured=" << s.measured_bytes;
  }
}

// The residual without its cap: the pure "never under-predict an OOM of the window" guarantee.
CalibratorOptions Uncapped() {
  CalibratorOptions options;
  options.max_residual_fraction = 1e9;
  return options;
}

TEST(CalibratorTest, NoSamplesGivesIdentity) {
  const CalibrationResult r = FitCalibration({}, CalibratorOptions{});
  EXPECT_EQ(r.fragmentation_factor, 1.0);
  EXPECT_EQ(r.residual_bytes, 0);
  EXPECT_EQ(r.samples, 0);
}

TEST(CalibratorTest, InvalidSamplesAreIgnored) {
  CalibrationSample no_raw{0, kContextBytes, 10 * kGiB, 1, false};
  CalibrationSample no_measure{10 * kGiB, kContextBytes, 0, 2, false};
  const CalibrationResult r = FitCalibration({no_raw, no_measure}, CalibratorOptions{});
  EXPECT_EQ(r.samples, 0);
  EXPECT_EQ(r.fragmentation_factor, 1.0);
}

TEST(CalibratorTest, ContractFormulaRoundsTheScaledPartUp) {
  EXPECT_EQ(CalibratedPeakBytes(1.5, 7, 3, 100), 5 + 7 + 100);  // ceil(4.5) = 5
  EXPECT_EQ(CalibratedPeakBytes(1.0, 0, 1000, 0), 1000);
  // [Exact and scaled bytes]: the exact part is not scaled.
  EXPECT_EQ(CalibratedPeakBytes(1.5, 7, 13, 100, 10), 10 + 5 + 7 + 100);
}

// Runs whose exactly sized bytes (persistent chunks, optimizer state) are large and whose
// dynamic bytes carry the allocator's slack: the fit learns the slack of the dynamic part alone,
// and a run with a different exact/dynamic split is then predicted right, where a factor over
// all bytes would scale the optimizer state too.
TEST(CalibratorTest, ScalesOnlyTheDynamicBytes) {
  constexpr double kSlack = 1.08;
  auto run = [](int64_t exact, int64_t dynamic, int64_t at_ms) {
    CalibrationSample s;
    s.exact_bytes = exact;
    s.raw_model_bytes = exact + dynamic;
    s.fixed_bytes = kContextBytes;
    s.measured_bytes = exact + static_cast<int64_t>(kSlack * static_cast<double>(dynamic)) +
                       kContextBytes;
    s.measured_at_unix_ms = at_ms;
    return s;
  };
  const std::vector<CalibrationSample> window = {run(40 * kGiB, 10 * kGiB, 1),
                                                 run(10 * kGiB, 30 * kGiB, 2),
                                                 run(25 * kGiB, 5 * kGiB, 3)};
  const CalibrationResult r = FitCalibration(window, CalibratorOptions{});
  EXPECT_NEAR(r.estimated_fragmentation_factor, kSlack, 1e-6);
  EXPECT_LE(r.calibrated_mean_abs_relative_error, 1e-6);
  const CalibrationSample held_out = run(60 * kGiB, 2 * kGiB, 4);
  const int64_t predicted = CalibratedPeakBytes(r.fragmentation_factor, r.residual_bytes, held_out);
  EXPECT_NEAR(static_cast<double>(predicted), static_cast<double>(held_out.measured_bytes),
              1e-4 * static_cast<double>(held_out.measured_bytes));
  // Samples stored before the split (exact 0) keep the old meaning: every byte scaled.
  CalibrationSample old{100, 10, 120, 1, false};
  EXPECT_NEAR(FitCalibration({old}, CalibratorOptions{}).fragmentation_factor, 1.1, 1e-12);
}

TEST(CalibratorTest, ReportsTheUncalibratedErrorOfTheRawModel) {
  // raw + fixed = 110 against a measured 120 -> |110 - 120| / 120.
  CalibrationSample s{100, 10, 120, 1, false};
  const CalibrationResult r = FitCalibration({s}, CalibratorOptions{});
  EXPECT_NEAR(r.mean_abs_relative_error, 10.0 / 120.0, 1e-12);
  EXPECT_NEAR(r.fragmentation_factor, 1.1, 1e-12);
  EXPECT_LE(r.calibrated_mean_abs_relative_error, 1.0 / 120.0);
}

TEST(CalibratorTest, ConvergesToTheTrueFactorUnderNoise) {
  std::mt19937_64 rng(42);
  std::normal_distribution<double> noise(0.0, 0.02);
  std::uniform_int_distribution<int64_t> raw(2 * kGiB, 70 * kGiB);
  for (double alpha : {0.70, 0.93, 0.96, 1.07, 1.4}) {
    std::vector<CalibrationSample> samples;
    for (int i = 0; i < 20; ++i) samples.push_back(Sample(raw(rng), alpha, noise(rng), i));
    const CalibrationResult r = FitCalibration(samples, CalibratorOptions{});
    // 2 % multiplicative noise on the whole peak; the median lands within a few percent.
    EXPECT_NEAR(r.estimated_fragmentation_factor, alpha, 0.03 * alpha) << "alpha=" << alpha;
    // No OOM in the window: the applied factor is the estimate itself, with no residual.
    EXPECT_EQ(r.fragmentation_factor, r.estimated_fragmentation_factor);
    EXPECT_EQ(r.residual_bytes, 0);
    EXPECT_EQ(r.samples, 20);
    // The central estimate: its mean error is about the noise's mean absolute value (1.6 %).
    EXPECT_LT(r.calibrated_mean_abs_relative_error, 0.025) << "alpha=" << alpha;
  }
}

TEST(CalibratorTest, SmallNoiseConvergesTheAppliedFactorToo) {
  std::mt19937_64 rng(3);
  std::normal_distribution<double> noise(0.0, 0.002);
  std::uniform_int_distribution<int64_t> raw(2 * kGiB, 70 * kGiB);
  std::vector<CalibrationSample> samples;
  for (int i = 0; i < 20; ++i) samples.push_back(Sample(raw(rng), 0.93, noise(rng), i));
  const CalibrationResult r = FitCalibration(samples, CalibratorOptions{});
  EXPECT_NEAR(r.fragmentation_factor, 0.93, 0.015);
  EXPECT_LT(r.calibrated_mean_abs_relative_error, 0.01);
}

TEST(CalibratorTest, ExactDataGivesExactFactorAndNoResidual) {
  std::vector<CalibrationSample> samples;
  for (int i = 1; i <= 9; ++i) samples.push_back(Sample(i * 4 * kGiB, 0.96, 0.0, i));
  const CalibrationResult r = FitCalibration(samples, CalibratorOptions{});
  EXPECT_NEAR(r.fragmentation_factor, 0.96, 1e-6);
  // Only rounding of measured_bytes may leave a shortfall of a byte or two.
  EXPECT_LE(r.residual_bytes, 2);
  EXPECT_NEAR(r.calibrated_mean_abs_relative_error, 0.0, 1e-6);
}

TEST(CalibratorTest, OneOutlierDoesNotSwingTheFactor) {
  std::vector<CalibrationSample> samples;
  for (int i = 0; i < 9; ++i) samples.push_back(Sample((10 + i) * kGiB, 0.96, 0.0, i));
  const CalibrationResult clean = FitCalibration(samples, CalibratorOptions{});
  // A run that measured three times its true peak (another process on the card, say).
  samples.push_back(Sample(12 * kGiB, 0.96 * 3, 0.0, 100));
  const CalibrationResult r = FitCalibration(samples, Uncapped());
  // A mean would have moved the factor by (2.88 - 0.96) / 10 = 0.19. A measured run is not
  // covered: the prediction stays the central one, no residual.
  EXPECT_NEAR(r.fragmentation_factor, clean.fragmentation_factor, 0.01);
  EXPECT_EQ(r.residual_bytes, 0);
  EXPECT_EQ(r.uncovered_samples, 0);

  // The same run out of memory: without the cap the residual absorbs it.
  samples.back().oom = true;
  const CalibrationResult oom = FitCalibration(samples, Uncapped());
  EXPECT_NEAR(oom.fragmentation_factor, clean.fragmentation_factor, 0.01);
  ExpectNoOomUnderEstimate(samples, oom);
  EXPECT_GT(oom.residual_bytes, 0);
  EXPECT_EQ(oom.uncovered_samples, 0);

  // With the default cap the residual stays small and the OOM is reported instead.
  const CalibrationResult capped = FitCalibration(samples, CalibratorOptions{});
  EXPECT_NEAR(capped.fragmentation_factor, clean.fragmentation_factor, 0.01);
  EXPECT_LE(capped.residual_bytes, static_cast<int64_t>(0.05 * 15 * kGiB));
  EXPECT_EQ(capped.uncovered_samples, 1);
}

TEST(CalibratorTest, AnOomAnywhereMovesTheFactorAtMostTheBoundedRaise) {
  CalibratorOptions options = Uncapped();
  for (int position = 0; position < 10; ++position) {
    std::vector<CalibrationSample> samples;
    for (int i = 0; i < 10; ++i) {
      const double alpha = i == position ? 0.96 * 4 : 0.96;
      samples.push_back(Sample((4 + 4 * i) * kGiB, alpha, 0.0, i));
      samples.back().oom = i == position;
    }
    const CalibrationResult r = FitCalibration(samples, options);
    EXPECT_GE(r.fragmentation_factor, 0.96 - 1e-9) << position;
    EXPECT_LE(r.fragmentation_factor, 0.96 * (1 + options.max_factor_raise) + 1e-9) << position;
    ExpectNoOomUnderEstimate(samples, r);
  }
}

TEST(CalibratorTest, FactorIsClampedAndResidualRestoresTheGuarantee) {
  std::vector<CalibrationSample> high = {Sample(10 * kGiB, 5.0, 0.0, 1),
                                         Sample(20 * kGiB, 5.0, 0.0, 2)};
  const CalibrationResult r_high = FitCalibration(high, Uncapped());
  EXPECT_EQ(r_high.fragmentation_factor, 2.0);
  EXPECT_EQ(r_high.residual_bytes, 0);  // measured runs: the clamped estimate, not covered
  high.push_back(Sample(15 * kGiB, 5.0, 0.0, 3));
  high.back().oom = true;
  const CalibrationResult r_oom = FitCalibration(high, Uncapped());
  EXPECT_EQ(r_oom.fragmentation_factor, 2.0);
  EXPECT_GT(r_oom.residual_bytes, 0);
  ExpectNoOomUnderEstimate(high, r_oom);

  std::vector<CalibrationSample> low = {Sample(10 * kGiB, 0.1, 0.0, 1)};
  const CalibrationResult r_low = FitCalibration(low, Uncapped());
  EXPECT_EQ(r_low.fragmentation_factor, 0.5);
  EXPECT_EQ(r_low.residual_bytes, 0);  // floored: never pulls predictions below the clamp
}

TEST(CalibratorTest, OomSamplesBoundFromBelowWithoutVoting) {
  std::vector<CalibrationSample> samples;
  for (int i = 0; i < 5; ++i) samples.push_back(Sample((10 + i) * kGiB, 1.0, 0.0, i));
  const CalibrationResult before = FitCalibration(samples, CalibratorOptions{});
  // The planner said this fits; the card ran out at 80 GiB.
  CalibrationSample oom{70 * kGiB, kContextBytes, 80 * kGiB, 10, true};
  samples.push_back(oom);
  const CalibrationResult r = FitCalibration(samples, Uncapped());
  EXPECT_EQ(r.estimated_fragmentation_factor, before.estimated_fragmentation_factor);
  ExpectNoOomUnderEstimate(samples, r);
  EXPECT_EQ(r.samples, 6);

  const CalibrationResult only_oom = FitCalibration({oom}, Uncapped());
  EXPECT_EQ(only_oom.fragmentation_factor, 1.0);
  ExpectNoOomUnderEstimate({oom}, only_oom);

  // An OOM 10 GiB above a 70 GiB model is a cost-model miss, not fragmentation: by default the
  // residual stays within 5% of the median measurement and the sample is reported uncovered.
  const CalibrationResult capped = FitCalibration(samples, CalibratorOptions{});
  EXPECT_EQ(capped.estimated_fragmentation_factor, before.estimated_fragmentation_factor);
  EXPECT_LE(capped.residual_bytes, static_cast<int64_t>(0.05 * 13 * kGiB));
  EXPECT_EQ(capped.uncovered_samples, 1);
}

TEST(CalibratorTest, OnlyTheNewestWindowCounts) {
  std::vector<CalibrationSample> samples;
  // Old runs (before, say, a driver upgrade) at 1.5; the newest 20 at 0.9.
  for (int i = 0; i < 30; ++i) samples.push_back(Sample((5 + i) * kGiB, 1.5, 0.0, i));
  for (int i = 0; i < 20; ++i) samples.push_back(Sample((5 + i) * kGiB, 0.9, 0.0, 100 + i));
  CalibratorOptions options;
  options.window_samples = 20;
  const CalibrationResult r = FitCalibration(samples, options);
  EXPECT_NEAR(r.fragmentation_factor, 0.9, 1e-6);
  EXPECT_EQ(r.samples, 20);
}

TEST(CalibratorTest, ResultDoesNotDependOnInputOrder) {
  std::mt19937_64 rng(7);
  std::normal_distribution<double> noise(0.0, 0.05);
  std::vector<CalibrationSample> samples;
  for (int i = 0; i < 15; ++i) samples.push_back(Sample((3 + i) * kGiB, 1.1, noise(rng), i));
  const CalibrationResult a = FitCalibration(samples, CalibratorOptions{});
  std::shuffle(samples.begin(), samples.end(), rng);
  const CalibrationResult b = FitCalibration(samples, CalibratorOptions{});
  EXPECT_EQ(a.fragmentation_factor, b.fragmentation_factor);
  EXPECT_EQ(a.residual_bytes, b.residual_bytes);
}

// Property over many random windows: bounded factor, non-negative residual, no OOM sample under
// its prediction, and the residual is the smallest one that achieves that.
TEST(CalibratorTest, RandomWindowsKeepTheGuaranteeWithAMinimalResidual) {
  std::mt19937_64 rng(1234);
  std::uniform_real_distribution<double> alpha(0.3, 3.0);
  std::uniform_real_distribution<double> noise(-0.1, 0.3);
  std::uniform_int_distribution<int64_t> raw(1, 100 * kGiB);
  std::uniform_int_distribution<int> count(1, 30);
  std::bernoulli_distribution oom(0.1);
  CalibratorOptions options = Uncapped();
  options.window_samples = 0;  // whole input
  for (int trial = 0; trial < 300; ++trial) {
    const double true_alpha = alpha(rng);
    std::vector<CalibrationSample> samples;
    const int n = count(rng);
    for (int i = 0; i < n; ++i) {
      CalibrationSample s = Sample(raw(rng), true_alpha, noise(rng), i);
      s.oom = oom(rng);
      samples.push_back(s);
    }
    const CalibrationResult r = FitCalibration(samples, options);
    ASSERT_GE(r.fragmentation_factor, options.min_fragmentation_factor);
    ASSERT_LE(r.fragmentation_factor, options.max_fragmentation_factor);
    ASSERT_GE(r.residual_bytes, 0);
    ExpectNoOomUnderEstimate(samples, r);
    if (r.residual_bytes > 0) {
      bool tight = false;
      for (const CalibrationSample& s : samples) {
        if (!s.oom) continue;
        tight |= CalibratedPeakBytes(r.fragmentation_factor, r.residual_bytes - 1,
                                     s.raw_model_bytes, s.fixed_bytes) < s.measured_bytes;
      }
      EXPECT_TRUE(tight) << "residual is larger than needed";
    }
  }
}

}  // namespace
}  // namespace memplan

namespace memplan {
namespace {

TEST(CalibratorTest, StepTimeFactorIsTheMedianRatioOfTimedSamples) {
  std::vector<CalibrationSample> samples;
  const double ratios[] = {1.10, 1.08, 3.0 /* an outlier */, 1.12, 1.09};
  for (int i = 0; i < 5; ++i) {
    CalibrationSample s = Sample(10 * kGiB, 1.0, 0.0, i);
    s.predicted_seconds = 0.5 + 0.1 * i;
    s.measured_seconds = s.predicted_seconds * ratios[i];
    samples.push_back(s);
  }
  CalibrationSample untimed = Sample(10 * kGiB, 1.0, 0.0, 10);  // no step time: no vote
  samples.push_back(untimed);
  CalibrationSample oom = Sample(10 * kGiB, 1.0, 0.0, 11);
  oom.oom = true;
  oom.predicted_seconds = 1.0;
  oom.measured_seconds = 100.0;  // an OOM's step time means nothing
  samples.push_back(oom);
  const CalibrationResult r = FitCalibration(samples, CalibratorOptions{});
  EXPECT_EQ(r.time_samples, 5);
  EXPECT_NEAR(r.time_factor, 1.10, 1e-12);

  CalibratorOptions options;
  options.max_time_factor = 1.05;
  EXPECT_DOUBLE_EQ(FitCalibration(samples, options).time_factor, 1.05);  // clamped

  const CalibrationResult none = FitCalibration({untimed}, CalibratorOptions{});
  EXPECT_EQ(none.time_samples, 0);
  EXPECT_EQ(none.time_factor, 0);
}

}  // namespace
}  // namespace memplan
