// The Store contract, run over both implementations (SqliteStore on a temp file, MemoryStore).
#include "planner/store/store.h"

#include <stdlib.h>

#include <atomic>
#include <filesystem>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace memplan {
namespace {

namespace v1 = memplan::v1;
using ::testing::HasSubstr;
using ::testing::StartsWith;

// Deterministic clock: each call advances 1 ms from a fixed epoch.
StoreEnv TestEnv(std::shared_ptr<std::atomic<int64_t>> now) {
  StoreEnv env;
  env.now_unix_ms = [now] { return now->fetch_add(1) + 1; };
  return env;
}

// The options both stores take beyond the defaults the suite opens them with.
struct StoreLimits {
  PlanRetention retention;
  int64_t max_list_page_bytes = kDefaultListPlansPageBytes;
};

class SqliteFactory {
 public:
  SqliteFactory() {
    std::string pattern = (std::filesystem::temp_directory_path() / "store_test.XXXXXX").string();
    dir_ = mkdtemp(pattern.data());
  }
  ~SqliteFactory() { std::filesystem::remove_all(dir_); }
  std::unique_ptr<Store> Make(int max_measurements_per_plan, StoreEnv env,
                              const StoreLimits& limits = {}) {
    SqliteStoreOptions options;
    options.path = dir_ + "/planner.db";
    options.max_measurements_per_plan = max_measurements_per_plan;
    options.plan_retention = limits.retention;
    options.max_list_page_bytes = limits.max_list_page_bytes;
    options.env = std::move(env);
    absl::StatusOr<std::unique_ptr<Store>> store = OpenSqliteStore(options);
    EXPECT_TRUE(store.ok()) << store.status();
    return store.ok() ? std::move(*store) : nullptr;
  }

 private:
  std::string dir_;
};

class MemoryFactory {
 public:
  std::unique_ptr<Store> Make(int max_measurements_per_plan, StoreEnv env,
                              const StoreLimits& limits = {}) {
    MemoryStoreOptions options;
    options.max_measurements_per_plan = max_measurements_per_plan;
    options.plan_retention = limits.retention;
    options.max_list_page_bytes = limits.max_list_page_bytes;
    options.env = std::move(env);
    return NewMemoryStore(options);
  }
};

template <typename Factory>
class StoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    store_ = factory_.Make(/*max_measurements_per_plan=*/1000, TestEnv(now_));
    ASSERT_NE(store_, nullptr);
  }

  std::unique_ptr<Store> MakeStore(int max_measurements_per_plan) {
    return factory_.Make(max_measurements_per_plan, TestEnv(now_));
  }
  // Replaces store_ (the same file for SqliteStore) with one opened with `limits`.
  void ReopenWith(const StoreLimits& limits) {
    store_.reset();
    store_ = factory_.Make(1000, TestEnv(now_), limits);
    ASSERT_NE(store_, nullptr);
  }

  std::string AddPlan(const std::string& id = "") {
    v1::StoredPlan plan;
    plan.set_plan_id(id);
    plan.mutable_response()->set_fits(true);
    absl::StatusOr<std::string> put = store_->PutPlan(plan);
    EXPECT_TRUE(put.ok()) << put.status();
    return put.ok() ? *put : "";
  }

  static v1::Measurement MeasurementFor(const std::string& plan_id, int64_t reserved_bytes) {
    v1::Measurement m;
    m.set_plan_id(plan_id);
    m.set_peak_reserved_bytes(reserved_bytes);
    return m;
  }

  std::shared_ptr<std::atomic<int64_t>> now_ =
      std::make_shared<std::atomic<int64_t>>(1'700'000'000'000);
  Factory factory_;
  std::unique_ptr<Store> store_;
};

using Factories = ::testing::Types<SqliteFactory, MemoryFactory>;
class FactoryNames {
 public:
  template <typename T>
  static std::string GetName(int) {
    return std::is_same_v<T, SqliteFactory> ? "Sqlite" : "Memory";
  }
};
TYPED_TEST_SUITE(StoreTest, Factories, FactoryNames);

v1::Trace ProfiledTrace() {
  v1::Trace trace;
  trace.mutable_arch()->set_name("llama-3.2-1b");
  trace.mutable_arch()->set_family("llama");
  trace.mutable_arch()->set_hidden_size(2048);
  trace.mutable_arch()->set_num_layers(16);
  trace.mutable_arch()->set_num_heads(32);
  trace.mutable_arch()->set_num_kv_heads(8);
  trace.mutable_arch()->set_intermediate_size(8192);
  trace.mutable_arch()->set_vocab_size(128256);
  trace.mutable_workload()->set_micro_batch(4);
  trace.mutable_workload()->set_seq_len(2048);
  trace.set_param_dtype(v1::DTYPE_BF16);
  trace.set_hardware_name("H200");
  trace.add_blocks()->set_saved_bytes(123);
  return trace;
}

TYPED_TEST(StoreTest, TraceRoundTripsUnderANewId) {
  v1::Trace trace = ProfiledTrace();
  trace.set_trace_id("ignored");
  absl::StatusOr<std::string> id = this->store_->PutTrace(trace);
  ASSERT_TRUE(id.ok()) << id.status();
  EXPECT_THAT(*id, StartsWith("trace-"));
  EXPECT_EQ(id->size(), std::string("trace-").size() + 16);
  absl::StatusOr<v1::Trace> got = this->store_->GetTrace(*id);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->trace_id(), *id);
  EXPECT_EQ(got->blocks(0).saved_bytes(), 123);
  EXPECT_EQ(got->arch().hidden_size(), 2048);

  absl::StatusOr<v1::Trace> missing = this->store_->GetTrace("trace-0000000000000000");
  EXPECT_TRUE(absl::IsNotFound(missing.status()));
  EXPECT_THAT(std::string(missing.status().message()), HasSubstr("trace_id"));
}

TYPED_TEST(StoreTest, FindTraceReturnsTheNewestProfiledMatch) {
  Store& store = *this->store_;
  v1::Trace key = ProfiledTrace();
  absl::StatusOr<std::optional<v1::Trace>> none = store.FindTrace(key);
  ASSERT_TRUE(none.ok()) << none.status();
  EXPECT_FALSE(none->has_value());

  v1::Trace older = ProfiledTrace();
  older.mutable_blocks(0)->set_saved_bytes(1);
  v1::Trace newer = ProfiledTrace();
  newer.mutable_blocks(0)->set_saved_bytes(2);
  v1::Trace analytic = ProfiledTrace();
  analytic.set_analytic(true);
  analytic.mutable_blocks(0)->set_saved_bytes(3);
  v1::Trace other_workload = ProfiledTrace();
  other_workload.mutable_workload()->set_seq_len(4096);
  other_workload.mutable_blocks(0)->set_saved_bytes(4);
  v1::Trace other_card = ProfiledTrace();
  other_card.set_hardware_name("H100");
  ASSERT_TRUE(store.PutTrace(older).ok());
  ASSERT_TRUE(store.PutTrace(newer).ok());
  ASSERT_TRUE(store.PutTrace(analytic).ok());
  ASSERT_TRUE(store.PutTrace(other_workload).ok());
  ASSERT_TRUE(store.PutTrace(other_card).ok());

  absl::StatusOr<std::optional<v1::Trace>> found = store.FindTrace(key);
  ASSERT_TRUE(found.ok()) << found.status();
  ASSERT_TRUE(found->has_value());
  EXPECT_EQ((*found)->blocks(0).saved_bytes(), 2);

  // Defaults spelled out, another display name, and accumulation still match.
  v1::Trace spelled = key;
  spelled.mutable_arch()->set_name("my-llama");
  spelled.mutable_arch()->set_head_dim(2048 / 32);
  spelled.mutable_workload()->set_world_size(1);
  spelled.mutable_workload()->set_grad_accum(8);
  spelled.mutable_training()->set_kind(v1::TrainingMethod::FULL);
  found = store.FindTrace(spelled);
  ASSERT_TRUE(found.ok() && found->has_value());
  EXPECT_EQ((*found)->blocks(0).saved_bytes(), 2);

  v1::Trace fp32 = key;
  fp32.set_param_dtype(v1::DTYPE_FP32);
  found = store.FindTrace(fp32);
  ASSERT_TRUE(found.ok());
  EXPECT_FALSE(found->has_value());
}

TYPED_TEST(StoreTest, FindTraceIgnoresLoraModuleOrder) {
  v1::Trace lora = ProfiledTrace();
  lora.mutable_training()->set_kind(v1::TrainingMethod::LORA);
  lora.mutable_training()->set_lora_rank(16);
  lora.mutable_training()->add_lora_target_modules("v_proj");
  lora.mutable_training()->add_lora_target_modules("q_proj");
  ASSERT_TRUE(this->store_->PutTrace(lora).ok());
  v1::Trace key = lora;
  key.mutable_training()->clear_lora_target_modules();
  key.mutable_training()->add_lora_target_modules("q_proj");
  key.mutable_training()->add_lora_target_modules("v_proj");
  absl::StatusOr<std::optional<v1::Trace>> found = this->store_->FindTrace(key);
  ASSERT_TRUE(found.ok() && found->has_value());
  key.mutable_training()->set_lora_rank(8);
  found = this->store_->FindTrace(key);
  ASSERT_TRUE(found.ok());
  EXPECT_FALSE(found->has_value());
  // A full fine-tune trace is not a LoRA one.
  found = this->store_->FindTrace(ProfiledTrace());
  ASSERT_TRUE(found.ok());
  EXPECT_FALSE(found->has_value());
}

TYPED_TEST(StoreTest, HardwareProfilesByIdAndNewestMeasuredByName) {
  Store& store = *this->store_;
  v1::HardwareProfile measured_old;
  measured_old.set_name("H200");
  measured_old.set_measured(true);
  measured_old.set_gpu_memory_bytes(1);
  v1::HardwareProfile measured_new = measured_old;
  measured_new.set_gpu_memory_bytes(2);
  v1::HardwareProfile preset_like = measured_old;
  preset_like.set_measured(false);
  preset_like.set_gpu_memory_bytes(3);
  absl::StatusOr<std::string> id_old = store.PutHardwareProfile(measured_old);
  ASSERT_TRUE(id_old.ok()) << id_old.status();
  EXPECT_THAT(*id_old, StartsWith("hw-"));
  ASSERT_TRUE(store.PutHardwareProfile(measured_new).ok());
  ASSERT_TRUE(store.PutHardwareProfile(preset_like).ok());

  absl::StatusOr<v1::HardwareProfile> got = store.GetHardwareProfile(*id_old);
  ASSERT_TRUE(got.ok());
  EXPECT_EQ(got->gpu_memory_bytes(), 1);
  absl::StatusOr<std::optional<v1::HardwareProfile>> by_name =
      store.FindHardwareProfileByName("H200");
  ASSERT_TRUE(by_name.ok() && by_name->has_value());
  EXPECT_EQ((*by_name)->gpu_memory_bytes(), 2);
  by_name = store.FindHardwareProfileByName("A100");
  ASSERT_TRUE(by_name.ok());
  EXPECT_FALSE(by_name->has_value());
  EXPECT_TRUE(absl::IsNotFound(store.GetHardwareProfile("hw-nope").status()));
}

TYPED_TEST(StoreTest, PutPlanAssignsIdAndTimeAndRejectsDuplicates) {
  Store& store = *this->store_;
  v1::StoredPlan plan;
  plan.mutable_response()->set_reason("fits");
  *plan.add_measurements() = this->MeasurementFor("x", 1);  // ignored on put
  absl::StatusOr<std::string> id = store.PutPlan(plan);
  ASSERT_TRUE(id.ok()) << id.status();
  EXPECT_THAT(*id, StartsWith("plan-"));
  absl::StatusOr<v1::StoredPlan> got = store.GetPlan(*id);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->plan_id(), *id);
  EXPECT_EQ(got->response().reason(), "fits");
  EXPECT_GT(got->created_at_unix_ms(), 1'700'000'000'000);
  EXPECT_EQ(got->measurements_size(), 0);

  v1::StoredPlan named;
  named.set_plan_id("plan-given");
  named.set_created_at_unix_ms(42);
  ASSERT_TRUE(store.PutPlan(named).ok());
  got = store.GetPlan("plan-given");
  ASSERT_TRUE(got.ok());
  EXPECT_EQ(got->created_at_unix_ms(), 42);
  absl::StatusOr<std::string> again = store.PutPlan(named);
  EXPECT_TRUE(absl::IsAlreadyExists(again.status())) << again.status();
  EXPECT_TRUE(absl::IsNotFound(store.GetPlan("plan-missing").status()));
}

TYPED_TEST(StoreTest, ListPlansPagesNewestFirstWithStableCursors) {
  Store& store = *this->store_;
  std::vector<std::string> ids;
  for (int i = 0; i < 7; ++i) ids.push_back(this->AddPlan());
  ASSERT_TRUE(store.PutMeasurement(this->MeasurementFor(ids[6], 5)).ok());

  std::vector<std::string> seen;
  std::string token;
  int pages = 0;
  do {
    absl::StatusOr<ListPlansPage> page = store.ListPlans(3, token);
    ASSERT_TRUE(page.ok()) << page.status();
    EXPECT_LE(page->plans.size(), 3u);
    for (const v1::StoredPlan& p : page->plans) {
      seen.push_back(p.plan_id());
      EXPECT_EQ(p.measurements_size(), 0);  // listings omit measurements
    }
    token = page->next_page_token;
    // Plans created while paging land before the cursor and do not shift later pages.
    if (pages == 0) this->AddPlan();
    ++pages;
  } while (!token.empty());
  EXPECT_EQ(pages, 3);
  EXPECT_EQ(seen, std::vector<std::string>(ids.rbegin(), ids.rend()));

  absl::StatusOr<ListPlansPage> all = store.ListPlans(0, "");
  ASSERT_TRUE(all.ok());
  EXPECT_EQ(all->plans.size(), 8u);  // default page size 50 covers them
  EXPECT_TRUE(all->next_page_token.empty());
}

TYPED_TEST(StoreTest, ListPlansPagesEndAtTheByteBudget) {
  v1::StoredPlan plan;
  plan.mutable_request()->mutable_arch()->set_name(std::string(1000, 'p'));
  const int64_t plan_bytes = static_cast<int64_t>(plan.ByteSizeLong()) + 64;
  StoreLimits limits;
  limits.max_list_page_bytes = 3 * plan_bytes + 200;  // three plans (ids and times included)
  this->ReopenWith(limits);
  Store& store = *this->store_;
  std::vector<std::string> ids;
  for (int i = 0; i < 8; ++i) ids.push_back(*store.PutPlan(plan));
  v1::StoredPlan huge;
  huge.mutable_request()->mutable_arch()->set_name(std::string(20000, 'h'));
  ids.push_back(*store.PutPlan(huge));

  std::vector<std::string> seen;
  std::vector<size_t> sizes;
  std::string token;
  do {
    absl::StatusOr<ListPlansPage> page = store.ListPlans(kMaxListPlansPageSize, token);
    ASSERT_TRUE(page.ok()) << page.status();
    sizes.push_back(page->plans.size());
    for (const v1::StoredPlan& p : page->plans) seen.push_back(p.plan_id());
    token = page->next_page_token;
  } while (!token.empty() && sizes.size() < 20);
  // A plan over the budget still comes back, alone, so paging always advances.
  EXPECT_EQ(sizes, (std::vector<size_t>{1, 3, 3, 2}));
  EXPECT_EQ(seen, std::vector<std::string>(ids.rbegin(), ids.rend()));
}

TYPED_TEST(StoreTest, RetentionKeepsTheNewestPlansAndEveryMeasuredOne) {
  StoreLimits limits;
  limits.retention.max_plans = 5;
  limits.retention.max_age_seconds = 0;
  limits.retention.check_every_puts = 1;
  this->ReopenWith(limits);
  Store& store = *this->store_;
  std::vector<std::string> ids;
  ids.push_back(this->AddPlan());
  ASSERT_TRUE(store.PutMeasurement(this->MeasurementFor(ids[0], 1)).ok());
  for (int i = 1; i < 9; ++i) ids.push_back(this->AddPlan());

  EXPECT_TRUE(store.GetPlan(ids[0]).ok()) << "measured plans are kept";
  for (int i = 1; i <= 3; ++i) {
    EXPECT_TRUE(absl::IsNotFound(store.GetPlan(ids[i]).status())) << i;
  }
  for (int i = 4; i < 9; ++i) EXPECT_TRUE(store.GetPlan(ids[i]).ok()) << i;
  EXPECT_EQ(store.Counters().plans_expired, 3);
  absl::StatusOr<ListPlansPage> page = store.ListPlans(0, "");
  ASSERT_TRUE(page.ok());
  EXPECT_EQ(page->plans.size(), 6u);
}

TYPED_TEST(StoreTest, RetentionExpiresPlansOlderThanTheMaximumAge) {
  StoreLimits limits;
  limits.retention.max_plans = 0;
  limits.retention.max_age_seconds = 3600;
  limits.retention.check_every_puts = 2;
  this->ReopenWith(limits);
  Store& store = *this->store_;
  const int64_t now_ms = this->now_->load();
  v1::StoredPlan old_plan;
  old_plan.set_created_at_unix_ms(now_ms - 2 * 3600 * 1000);
  const std::string old_id = *store.PutPlan(old_plan);
  EXPECT_TRUE(store.GetPlan(old_id).ok()) << "not checked before the second put";
  v1::StoredPlan recent;
  recent.set_created_at_unix_ms(now_ms - 1800 * 1000);
  const std::string recent_id = *store.PutPlan(recent);
  EXPECT_TRUE(absl::IsNotFound(store.GetPlan(old_id).status()));
  EXPECT_TRUE(store.GetPlan(recent_id).ok());
  EXPECT_EQ(store.Counters().plans_expired, 1);
}

TYPED_TEST(StoreTest, ListPlansRejectsBadArgumentsByName) {
  Store& store = *this->store_;
  for (int bad : {-1, kMaxListPlansPageSize + 1}) {
    absl::StatusOr<ListPlansPage> page = store.ListPlans(bad, "");
    EXPECT_TRUE(absl::IsInvalidArgument(page.status())) << bad;
    EXPECT_THAT(std::string(page.status().message()), HasSubstr("page_size"));
  }
  EXPECT_TRUE(store.ListPlans(kMaxListPlansPageSize, "").ok());
  for (const char* bad : {"garbage!", "cGxhbnMudjE6LTE", "bm90IGEgdG9rZW4"}) {
    absl::StatusOr<ListPlansPage> page = store.ListPlans(10, bad);
    EXPECT_TRUE(absl::IsInvalidArgument(page.status())) << bad;
    EXPECT_THAT(std::string(page.status().message()), HasSubstr("page_token"));
  }
}

TYPED_TEST(StoreTest, MeasurementsAttachToTheirPlanNewestFirst) {
  Store& store = *this->store_;
  const std::string plan = this->AddPlan();
  const std::string other = this->AddPlan();
  std::set<std::string> ids;
  for (int i = 1; i <= 3; ++i) {
    absl::StatusOr<std::string> id = store.PutMeasurement(this->MeasurementFor(plan, i));
    ASSERT_TRUE(id.ok()) << id.status();
    EXPECT_THAT(*id, StartsWith("meas-"));
    ids.insert(*id);
  }
  EXPECT_EQ(ids.size(), 3u);
  v1::Measurement timed = this->MeasurementFor(other, 9);
  timed.set_measured_at_unix_ms(77);
  ASSERT_TRUE(store.PutMeasurement(timed).ok());

  absl::StatusOr<v1::StoredPlan> got = store.GetPlan(plan);
  ASSERT_TRUE(got.ok());
  ASSERT_EQ(got->measurements_size(), 3);
  EXPECT_EQ(got->measurements(0).peak_reserved_bytes(), 3);
  EXPECT_EQ(got->measurements(2).peak_reserved_bytes(), 1);
  EXPECT_GT(got->measurements(0).measured_at_unix_ms(), 0);  // stamped by the store's clock
  got = store.GetPlan(other);
  ASSERT_TRUE(got.ok());
  ASSERT_EQ(got->measurements_size(), 1);
  EXPECT_EQ(got->measurements(0).measured_at_unix_ms(), 77);
  absl::StatusOr<int64_t> count = store.CountMeasurements();
  ASSERT_TRUE(count.ok());
  EXPECT_EQ(*count, 4);
}

TYPED_TEST(StoreTest, MeasurementForUnknownPlanIsRejected) {
  Store& store = *this->store_;
  absl::StatusOr<std::string> unknown = store.PutMeasurement(this->MeasurementFor("plan-x", 1));
  EXPECT_TRUE(absl::IsNotFound(unknown.status())) << unknown.status();
  EXPECT_THAT(std::string(unknown.status().message()), HasSubstr("plan_id"));
  absl::StatusOr<std::string> empty = store.PutMeasurement(this->MeasurementFor("", 1));
  EXPECT_TRUE(absl::IsInvalidArgument(empty.status())) << empty.status();

  // A batch is all-or-nothing.
  const std::string plan = this->AddPlan();
  std::vector<v1::Measurement> batch = {this->MeasurementFor(plan, 1),
                                        this->MeasurementFor("plan-x", 2)};
  EXPECT_TRUE(absl::IsNotFound(store.PutMeasurements(batch).status()));
  absl::StatusOr<int64_t> count = store.CountMeasurements();
  ASSERT_TRUE(count.ok());
  EXPECT_EQ(*count, 0);
  batch.pop_back();
  absl::StatusOr<std::vector<std::string>> ids = store.PutMeasurements(batch);
  ASSERT_TRUE(ids.ok()) << ids.status();
  EXPECT_EQ(ids->size(), 1u);
}

TYPED_TEST(StoreTest, GetPlanReturnsAtMostTheNewestMeasurements) {
  this->store_ = this->MakeStore(/*max_measurements_per_plan=*/4);
  const std::string plan = this->AddPlan();
  std::vector<v1::Measurement> batch;
  for (int i = 0; i < 10; ++i) batch.push_back(this->MeasurementFor(plan, i));
  ASSERT_TRUE(this->store_->PutMeasurements(batch).ok());
  absl::StatusOr<v1::StoredPlan> got = this->store_->GetPlan(plan);
  ASSERT_TRUE(got.ok());
  ASSERT_EQ(got->measurements_size(), 4);
  EXPECT_EQ(got->measurements(0).peak_reserved_bytes(), 9);
  EXPECT_EQ(got->measurements(3).peak_reserved_bytes(), 6);
}

TYPED_TEST(StoreTest, CalibrationSamplesNewestFirstPerKey) {
  Store& store = *this->store_;
  const CalibrationKey h200{"H200", DType::kBFloat16, "llama"};
  const CalibrationKey h200_fp32{"H200", DType::kFloat32, "llama"};
  for (int i = 0; i < 5; ++i) {
    // Inserted out of time order: the store orders by measured time.
    CalibrationSample s{100 + i, 10, 200 + i, 1000 - i, i == 4};
    s.exact_bytes = 40 + i;
    ASSERT_TRUE(store.PutCalibrationSample(h200, s).ok());
  }
  ASSERT_TRUE(store.PutCalibrationSample(h200_fp32, {1, 1, 1, 5000, false}).ok());
  absl::StatusOr<std::vector<CalibrationSample>> recent = store.RecentCalibrationSamples(h200, 3);
  ASSERT_TRUE(recent.ok()) << recent.status();
  ASSERT_EQ(recent->size(), 3u);
  EXPECT_EQ((*recent)[0].measured_at_unix_ms, 1000);
  EXPECT_EQ((*recent)[0].raw_model_bytes, 100);
  EXPECT_EQ((*recent)[0].exact_bytes, 40);
  EXPECT_EQ((*recent)[2].measured_at_unix_ms, 998);
  EXPECT_EQ((*recent)[2].exact_bytes, 42);
  recent = store.RecentCalibrationSamples(h200, 100);
  ASSERT_TRUE(recent.ok());
  ASSERT_EQ(recent->size(), 5u);
  EXPECT_TRUE(recent->back().oom);
  EXPECT_EQ(recent->back().fixed_bytes, 10);
  recent = store.RecentCalibrationSamples({"H100", DType::kBFloat16, "llama"}, 10);
  ASSERT_TRUE(recent.ok());
  EXPECT_TRUE(recent->empty());
  EXPECT_TRUE(absl::IsInvalidArgument(store.RecentCalibrationSamples(h200, 0).status()));
}

TYPED_TEST(StoreTest, CalibrationUpsertGetAndFilter) {
  Store& store = *this->store_;
  auto make = [](std::string hw, v1::DType dtype, std::string family, double factor) {
    v1::Calibration c;
    c.set_hardware_name(hw);
    c.set_param_dtype(dtype);
    c.set_model_family(family);
    c.set_method("full");
    c.set_optimizer("adamw");
    c.set_fragmentation_factor(factor);
    return c;
  };
  ASSERT_TRUE(store.PutCalibration(make("H200", v1::DTYPE_BF16, "llama", 1.1)).ok());
  ASSERT_TRUE(store.PutCalibration(make("H200", v1::DTYPE_BF16, "llama", 0.97)).ok());
  ASSERT_TRUE(store.PutCalibration(make("H200", v1::DTYPE_FP32, "llama", 1.0)).ok());
  ASSERT_TRUE(store.PutCalibration(make("A100", v1::DTYPE_BF16, "qwen3", 1.2)).ok());
  EXPECT_TRUE(absl::IsInvalidArgument(
      store.PutCalibration(make("H200", v1::DTYPE_UNSPECIFIED, "llama", 1))));

  absl::StatusOr<std::optional<v1::Calibration>> got =
      store.GetCalibration({"H200", DType::kBFloat16, "llama"});
  ASSERT_TRUE(got.ok() && got->has_value());
  EXPECT_EQ((*got)->fragmentation_factor(), 0.97);
  EXPECT_GT((*got)->updated_at_unix_ms(), 0);
  got = store.GetCalibration({"H200", DType::kFloat16, "llama"});
  ASSERT_TRUE(got.ok());
  EXPECT_FALSE(got->has_value());

  absl::StatusOr<std::vector<v1::Calibration>> all = store.ListCalibrations({});
  ASSERT_TRUE(all.ok());
  ASSERT_EQ(all->size(), 3u);
  EXPECT_EQ((*all)[0].hardware_name(), "A100");  // ordered by hardware, dtype, family
  EXPECT_EQ((*all)[1].param_dtype(), v1::DTYPE_FP32);
  EXPECT_EQ((*all)[2].param_dtype(), v1::DTYPE_BF16);
  absl::StatusOr<std::vector<v1::Calibration>> h200 = store.ListCalibrations({"H200", {}, ""});
  ASSERT_TRUE(h200.ok());
  EXPECT_EQ(h200->size(), 2u);
  absl::StatusOr<std::vector<v1::Calibration>> bf16 =
      store.ListCalibrations({"", DType::kBFloat16, ""});
  ASSERT_TRUE(bf16.ok());
  EXPECT_EQ(bf16->size(), 2u);
  absl::StatusOr<std::vector<v1::Calibration>> qwen = store.ListCalibrations({"", {}, "qwen3"});
  ASSERT_TRUE(qwen.ok());
  ASSERT_EQ(qwen->size(), 1u);
  EXPECT_EQ((*qwen)[0].fragmentation_factor(), 1.2);
}

// [Calibration keys]: method and optimizer are part of the key, for calibrations and samples.
TYPED_TEST(StoreTest, MethodAndOptimizerKeySeparateCalibrationsAndSamples) {
  Store& store = *this->store_;
  auto make = [](std::string method, std::string optimizer, double factor) {
    v1::Calibration c;
    c.set_hardware_name("H200");
    c.set_param_dtype(v1::DTYPE_BF16);
    c.set_model_family("llama");
    c.set_method(method);
    c.set_optimizer(optimizer);
    c.set_fragmentation_factor(factor);
    return c;
  };
  ASSERT_TRUE(store.PutCalibration(make("full", "adamw", 1.1)).ok());
  ASSERT_TRUE(store.PutCalibration(make("lora", "adamw", 1.3)).ok());
  ASSERT_TRUE(store.PutCalibration(make("full", "adamw8bit", 1.4)).ok());
  ASSERT_TRUE(store.PutCalibration(make("", "", 0.9)).ok());
  const CalibrationKey full{"H200", DType::kBFloat16, "llama", "full", "adamw"};
  const CalibrationKey lora{"H200", DType::kBFloat16, "llama", "lora", "adamw"};
  const CalibrationKey eight{"H200", DType::kBFloat16, "llama", "full", "adamw8bit"};
  const CalibrationKey legacy{"H200", DType::kBFloat16, "llama", "", ""};
  EXPECT_EQ((*store.GetCalibration(full))->fragmentation_factor(), 1.1);
  EXPECT_EQ((*store.GetCalibration(lora))->fragmentation_factor(), 1.3);
  EXPECT_EQ((*store.GetCalibration(eight))->fragmentation_factor(), 1.4);
  EXPECT_EQ((*store.GetCalibration(legacy))->fragmentation_factor(), 0.9);
  EXPECT_EQ((*store.GetCalibration(lora))->method(), "lora");
  absl::StatusOr<std::vector<v1::Calibration>> all = store.ListCalibrations({});
  ASSERT_TRUE(all.ok());
  ASSERT_EQ(all->size(), 4u);
  EXPECT_EQ((*all)[0].method(), "");  // ordered by ..., method, optimizer
  EXPECT_EQ((*all)[1].optimizer(), "adamw");
  EXPECT_EQ((*all)[2].optimizer(), "adamw8bit");
  EXPECT_EQ((*all)[3].method(), "lora");

  ASSERT_TRUE(store.PutCalibrationSample(full, {100, 7, 130, 1, false}).ok());
  ASSERT_TRUE(store.PutCalibrationSample(lora, {100, 7, 150, 2, false}).ok());
  ASSERT_TRUE(store.PutCalibrationSample(lora, {100, 7, 160, 3, false}).ok());
  absl::StatusOr<std::vector<CalibrationSample>> of_full = store.RecentCalibrationSamples(full, 5);
  ASSERT_TRUE(of_full.ok());
  ASSERT_EQ(of_full->size(), 1u);
  EXPECT_EQ((*of_full)[0].measured_bytes, 130);
  absl::StatusOr<std::vector<CalibrationSample>> of_lora = store.RecentCalibrationSamples(lora, 5);
  ASSERT_TRUE(of_lora.ok());
  EXPECT_EQ(of_lora->size(), 2u);
  absl::StatusOr<std::vector<CalibrationSample>> of_eight = store.RecentCalibrationSamples(eight, 5);
  ASSERT_TRUE(of_eight.ok());
  EXPECT_TRUE(of_eight->empty());
}

TYPED_TEST(StoreTest, ConcurrentWritersLoseNothing) {
  Store& store = *this->store_;
  const std::string plan = this->AddPlan();
  constexpr int kThreads = 4;
  constexpr int kEach = 25;
  std::vector<std::thread> threads;
  std::vector<std::vector<std::string>> ids(kThreads);
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < kEach; ++i) {
        absl::StatusOr<std::string> id = store.PutMeasurement(this->MeasurementFor(plan, i));
        if (id.ok()) ids[t].push_back(*id);
        (void)store.ListPlans(10, "");  // readers interleaved with writers
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  std::set<std::string> unique;
  for (const auto& list : ids) unique.insert(list.begin(), list.end());
  EXPECT_EQ(unique.size(), static_cast<size_t>(kThreads * kEach));
  absl::StatusOr<int64_t> count = store.CountMeasurements();
  ASSERT_TRUE(count.ok());
  EXPECT_EQ(*count, kThreads * kEach);
}

}  // namespace
}  // namespace memplan
