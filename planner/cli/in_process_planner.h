// The planner inside the `memplan` process, for `plan`, `admit` and `presets` without --planner:
// the daemon's engine (planner/service/planner_stack.h) registered on a gRPC server that listens
// on no port, reached through an in-process channel, so the answer is the daemon's. It reads the
// planner's SQLite database when there is one (calibration, measured hardware profiles, profiled
// traces) and never writes it: plans made here stay in memory. Not thread-safe to create;
// the channel is.
#pragma once

#include <memory>
#include <string>

#include "absl/status/statusor.h"

namespace grpc {
class Channel;
class Server;
}  // namespace grpc

namespace memplan {
class PlannerStack;
class Store;
}  // namespace memplan

namespace memplan::cli {

// memplan-planner's default --db, read when it exists.
inline constexpr char kDefaultPlannerDb[] = "./memplan-planner.db";

struct InProcessPlannerOptions {
  std::string db_path = kDefaultPlannerDb;  // empty: no database
  // The path was named by the user (--db): a missing file is an error rather than no database.
  bool db_required = false;
};

class InProcessPlanner {
 public:
  // NOT_FOUND for a required database that is missing; the store's errors (a file of another
  // schema version, not a memplan database) name the file.
  static absl::StatusOr<std::unique_ptr<InProcessPlanner>> Start(
      const InProcessPlannerOptions& options);
  ~InProcessPlanner();  // shuts the server down, then the engine, then closes the file
  InProcessPlanner(const InProcessPlanner&) = delete;
  InProcessPlanner& operator=(const InProcessPlanner&) = delete;

  std::shared_ptr<grpc::Channel> channel() const { return channel_; }
  // Where calibration came from, for the note on stderr: the database path, or empty for none.
  const std::string& db_path() const { return db_path_; }

 private:
  InProcessPlanner() = default;

  std::string db_path_;
  std::unique_ptr<Store> store_;
  std::unique_ptr<PlannerStack> stack_;
  std::unique_ptr<grpc::Server> server_;
  std::shared_ptr<grpc::Channel> channel_;
};

}  // namespace memplan::cli
