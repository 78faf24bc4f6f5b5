// Fuzzes the request decoder and validator: random and mutated PlanRequest bytes go through
// ParseFromString and PlannerCore::Plan. Nothing may crash, and every failure must be a clean
// client-facing status (never INTERNAL/UNKNOWN). Fixed seed and bounded iterations.
#include <gtest/gtest.h>

#include <cstdint>
#include <limits>
#include <memory>
#include <random>
#include <string>

#include "common/presets.h"
#include "common/proto_convert.h"
#include "google/protobuf/stubs/logging.h"
#include "memplan/v1/planner.pb.h"
#include "planner/service/planner_core.h"
#include "planner/service/search_executor.h"
#include "planner/store/store.h"

namespace memplan {
namespace {

class PlanRequestFuzzTest : public ::testing::Test {
 protected:
  // Invalid UTF-8 in string fields is expected here; protobuf would log every one of them.
  static void SetUpTestSuite() { google::protobuf::SetLogHandler(nullptr); }

  void SetUp() override {
    store_ = NewMemoryStore();
    executor_ = std::make_unique<SearchExecutor>(SearchExecutor::Options{.threads = 1});
    auto core = PlannerCore::Create(*store_, *executor_, nullptr);
    ASSERT_TRUE(core.ok());
    core_ = *std::move(core);
  }

  // Feeds one serialized request; returns whether it parsed.
  bool Feed(const std::string& bytes) {
    v1::PlanRequest request;
    if (!request.ParseFromString(bytes)) return false;
    Check(request);
    return true;
  }

  void Check(const v1::PlanRequest& request) {
    auto result = core_->Plan(request);
    ++planned_;
    if (result.ok()) {
      ++ok_;
      EXPECT_FALSE(result->plan_id().empty());
      EXPECT_GE(result->prediction().peak_bytes(), 0);
      return;
    }
    const absl::StatusCode code = result.status().code();
    EXPECT_TRUE(code == absl::StatusCode::kInvalidArgument || code == absl::StatusCode::kNotFound)
        << result.status() << "\nrequest: " << request.ShortDebugString();
    EXPECT_FALSE(result.status().message().empty());
  }

  static v1::PlanRequest Seed(std::mt19937_64& rng) {
    v1::PlanRequest r;
    if (rng() % 2 == 0) {
      r.set_arch_preset("llama-tiny");
    } else {
      *r.mutable_arch() = ToProto(*FindModelPreset("llama-tiny"));
    }
    if (rng() % 2 == 0) {
      r.set_hardware_preset("rtx-3090");
    } else {
      *r.mutable_hardware_spec() = ToProto(*FindHardwarePreset("rtx-3090"));
    }
    r.mutable_workload()->set_micro_batch(1 + rng() % 4);
    r.mutable_workload()->set_seq_len(128 << (rng() % 4));
    r.set_param_dtype(static_cast<v1::DType>(rng() % 4));
    const char* optimizers[] = {"adamw", "adamw_bf16", "sgd", "", "adam"};
    r.set_optimizer(optimizers[rng() % 5]);
    r.set_skip_limits(true);
    if (rng() % 3 == 0) r.mutable_fixed()->set_n_checkpoint(static_cast<int>(rng() % 6));
    if (rng() % 3 == 0) r.mutable_fixed()->set_n_persist(static_cast<int>(rng() % 4));
    if (rng() % 4 == 0) {
      r.mutable_training()->set_kind(v1::TrainingMethod::LORA);
      r.mutable_training()->set_lora_rank(static_cast<int64_t>(rng() % 64));
      r.mutable_training()->add_lora_target_modules(rng() % 2 ? "q_proj" : "x_proj");
    }
    return r;
  }

  std::unique_ptr<Store> store_;
  std::unique_ptr<SearchExecutor> executor_;
  std::unique_ptr<PlannerCore> core_;
  int planned_ = 0;
  int ok_ = 0;
};

TEST_F(PlanRequestFuzzTest, RandomBytesNeverCrash) {
  std::mt19937_64 rng(0x5eed);
  int parsed = 0;
  for (int i = 0; i < 20000; ++i) {
    std::string bytes(rng() % 96, '\0');
    for (char& c : bytes) c = static_cast<char>(rng());
    parsed += Feed(bytes) ? 1 : 0;
  }
  // Random bytes rarely form a valid message; the empty one does, and must be refused cleanly.
  EXPECT_TRUE(Feed(""));
  EXPECT_GT(parsed, 0);
}

TEST_F(PlanRequestFuzzTest, MutatedValidRequestsNeverCrash) {
  std::mt19937_64 rng(20240601);
  int parsed = 0;
  constexpr int kIterations = 3000;
  for (int i = 0; i < kIterations; ++i) {
    std::string bytes = Seed(rng).SerializeAsString();
    const int mutations = 1 + static_cast<int>(rng() % 3);
    for (int m = 0; m < mutations && !bytes.empty(); ++m) {
      const size_t at = rng() % bytes.size();
      switch (rng() % 4) {
        case 0:
          bytes[at] = static_cast<char>(rng());
          break;  // overwrite a byte
        case 1:
          bytes[at] ^= static_cast<char>(1 << (rng() % 8));
          break;  // flip a bit
        case 2:
          bytes.erase(at, 1 + rng() % 4);
          break;  // delete a run
        case 3:
          bytes.insert(at, 1, static_cast<char>(rng()));
          break;  // insert a byte
      }
    }
    parsed += Feed(bytes) ? 1 : 0;
  }
  // A good share of mutants still parse, so the validator (not just the decoder) was exercised.
  EXPECT_GT(parsed, kIterations / 10);
}

// Structured fuzzing: well-formed messages whose numeric fields take extreme values.
TEST_F(PlanRequestFuzzTest, ExtremeFieldValuesGiveCleanStatuses) {
  std::mt19937_64 rng(77);
  const int64_t extremes[] = {
      0, -1, 1, 3, 7, 1 << 20, int64_t{1} << 40, INT64_MAX, INT64_MIN, INT32_MAX, INT32_MIN};
  auto pick = [&] { return extremes[rng() % (sizeof(extremes) / sizeof(extremes[0]))]; };
  const double reals[] = {0.0,
                          -1.0,
                          1e-300,
                          1e300,
                          std::numeric_limits<double>::infinity(),
                          std::numeric_limits<double>::quiet_NaN(),
                          0.3};
  auto pick_real = [&] { return reals[rng() % (sizeof(reals) / sizeof(reals[0]))]; };
  constexpr int kIterations = 1000;
  for (int i = 0; i < kIterations; ++i) {
    v1::PlanRequest r = Seed(rng);
    *r.mutable_arch() = ToProto(*FindModelPreset("llama-tiny"));
    *r.mutable_hardware_spec() = ToProto(*FindHardwarePreset("rtx-3090"));
    switch (rng() % 12) {
      case 0:
        r.mutable_arch()->set_hidden_size(pick());
        break;
      case 1:
        r.mutable_arch()->set_num_layers(pick());
        break;
      case 2:
        r.mutable_arch()->set_num_heads(pick());
        break;
      case 3:
        r.mutable_arch()->set_head_dim(pick());
        break;
      case 4:
        r.mutable_workload()->set_micro_batch(pick());
        break;
      case 5:
        r.mutable_workload()->set_seq_len(pick());
        break;
      case 6:
        r.mutable_workload()->set_world_size(static_cast<int32_t>(pick()));
        break;
      case 7:
        r.mutable_hardware_spec()->set_gpu_memory_bytes(pick());
        break;
      case 8:
        r.mutable_hardware_spec()->set_hbm_bytes_per_second(pick_real());
        break;
      case 9:
        r.set_safety_margin(pick_real());
        break;
      case 10:
        r.mutable_fixed()->set_chunk_bytes(pick());
        break;
      case 11:
        r.mutable_arch()->set_rope_theta(pick_real());
        break;
    }
    Check(r);
  }
  EXPECT_EQ(planned_, kIterations);
  EXPECT_GT(ok_, 0);  // the seeds are valid often enough for the search itself to be exercised
}

}  // namespace
}  // namespace memplan
