#include "planner/cli/in_process_planner.h"

#include <filesystem>
#include <system_error>
#include <utility>

#include "absl/memory/memory.h"
#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "grpcpp/grpcpp.h"
#include "planner/service/planner_stack.h"
#include "planner/store/overlay_store.h"
#include "planner/store/store.h"

namespace memplan::cli {
namespace {

// One search thread per CPU as in the daemon, but one handler: the CLI makes one call.
PlannerStackOptions StackOptions() {
  PlannerStackOptions options;
  options.service.handler_threads = 1;
  return options;
}

absl::StatusOr<std::unique_ptr<Store>> OpenStore(const InProcessPlannerOptions& options,
                                                 std::string* db_path) {
  std::error_code error;
  const bool exists = !options.db_path.empty() && std::filesystem::exists(options.db_path, error);
  if (!exists) {
    if (options.db_required) {
      return absl::NotFoundError(
          absl::StrCat("--db: ", options.db_path, " does not exist (it is read, never created)"));
    }
    return NewMemoryStore();
  }
  SqliteStoreOptions sqlite;
  sqlite.path = options.db_path;
  sqlite.read_only = true;
  // The planner checks its file when it opens it; a reader does not repeat that.
  sqlite.integrity_check = IntegrityCheck::kOff;
  absl::StatusOr<std::unique_ptr<Store>> file = OpenSqliteStore(sqlite);
  if (!file.ok()) {
    return absl::Status(file.status().code(),
                        absl::StrCat("reading the planner's database: ", file.status().message()));
  }
  *db_path = options.db_path;
  return NewOverlayStore(*std::move(file), NewMemoryStore());
}

}  // namespace

absl::StatusOr<std::unique_ptr<InProcessPlanner>> InProcessPlanner::Start(
    const InProcessPlannerOptions& options) {
  auto planner = absl::WrapUnique(new InProcessPlanner());
  ASSIGN_OR_RETURN(planner->store_, OpenStore(options, &planner->db_path_));
  ASSIGN_OR_RETURN(planner->stack_, PlannerStack::Create(*planner->store_, /*metrics=*/nullptr,
                                                         /*authorizer=*/nullptr, StackOptions()));
  grpc::ServerBuilder builder;  // no listening port: reachable only through InProcessChannel
  planner->stack_->AddTo(&builder);
  planner->server_ = builder.BuildAndStart();
  if (planner->server_ == nullptr) {
    return absl::InternalError("cannot start the in-process planner");
  }
  planner->channel_ = planner->server_->InProcessChannel(grpc::ChannelArguments());
  return planner;
}

InProcessPlanner::~InProcessPlanner() {
  channel_.reset();
  if (server_ != nullptr) {
    server_->Shutdown();
    server_->Wait();
  }
  server_.reset();
  stack_.reset();
  store_.reset();
}

}  // namespace memplan::cli
