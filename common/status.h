// Status helpers missing from Debian's Abseil 20220623 (no RETURN_IF_ERROR / ASSIGN_OR_RETURN).
#pragma once

#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

#define MEMPLAN_CONCAT_INNER_(a, b) a##b
#define MEMPLAN_CONCAT_(a, b) MEMPLAN_CONCAT_INNER_(a, b)

// Returns the status from the enclosing function when `expr` is not OK.
#define RETURN_IF_ERROR(expr)                          \
  do {                                                 \
    ::absl::Status memplan_status_ = (expr);           \
    if (!memplan_status_.ok()) return memplan_status_; \
  } while (0)

// `ASSIGN_OR_RETURN(auto x, Foo());` declares x from a StatusOr or returns its error.
#define ASSIGN_OR_RETURN(lhs, expr) \
  MEMPLAN_ASSIGN_OR_RETURN_IMPL_(MEMPLAN_CONCAT_(memplan_statusor_, __LINE__), lhs, expr)
#define MEMPLAN_ASSIGN_OR_RETURN_IMPL_(tmp, lhs, expr) \
  auto tmp = (expr);                                   \
  if (!tmp.ok()) return std::move(tmp).status();       \
  lhs = std::move(tmp).value()
