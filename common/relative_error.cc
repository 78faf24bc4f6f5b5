#include "common/relative_error.h"

namespace memplan {

std::optional<double> RelativeError(int64_t predicted_bytes, int64_t measured_bytes) {
  if (measured_bytes <= 0) return std::nullopt;
  return static_cast<double>(predicted_bytes - measured_bytes) /
         static_cast<double>(measured_bytes);
}

}  // namespace memplan
