// libFuzzer target for the Plan request decoder and validator (clang only, not part of CI):
//   cmake -DCMAKE_CXX_COMPILER=clang++ -DMEMPLAN_BUILD_FUZZERS=ON ... && ./plan_request_fuzzer
// Any input that parses as a PlanRequest goes through PlannerCore::Plan; a crash, or a status
// other than INVALID_ARGUMENT / NOT_FOUND, is a finding.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>

#include "google/protobuf/stubs/logging.h"
#include "memplan/v1/planner.pb.h"
#include "planner/service/planner_core.h"
#include "planner/service/search_executor.h"
#include "planner/store/store.h"

namespace {

struct Harness {
  Harness()
      : store(memplan::NewMemoryStore()),
        executor(memplan::SearchExecutor::Options{.threads = 1}),
        core(*memplan::PlannerCore::Create(*store, executor, nullptr)) {
    google::protobuf::SetLogHandler(nullptr);  // invalid UTF-8 is expected, and noisy
  }
  std::unique_ptr<memplan::Store> store;
  memplan::SearchExecutor executor;
  std::unique_ptr<memplan::PlannerCore> core;
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static Harness* harness = new Harness();
  memplan::v1::PlanRequest request;
  if (!request.ParseFromArray(data, static_cast<int>(size))) return 0;
  auto result = harness->core->Plan(request);
  if (!result.ok() && result.status().code() != absl::StatusCode::kInvalidArgument &&
      result.status().code() != absl::StatusCode::kNotFound) {
    std::fprintf(stderr, "unexpected status: %s\n", result.status().ToString().c_str());
    std::abort();
  }
  return 0;
}
