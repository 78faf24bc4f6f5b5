// A Store that reads a base store it never writes: every write goes to an overlay store, and a
// read asks the overlay first, then the base. Lets a process plan over the planner's database
// (its calibration, measured hardware profiles and profiled traces) without changing the file;
// the `memplan` CLI answers in-process through it (planner/cli/in_process_planner.h).
// Thread-safe when both stores are.
#pragma once

#include <memory>

#include "planner/store/store.h"

namespace memplan {

// Reads of one item (Get*, Find*) take the overlay's answer when it has one. ListPlans lists the
// overlay's plans only (what this process planned); ListCalibrations merges both, the overlay's
// entry winning for a key; CountMeasurements adds both. CheckIntegrity and Counters are the
// base's. A measurement of a plan only the base holds is NOT_FOUND (the overlay has no plan).
std::unique_ptr<Store> NewOverlayStore(std::unique_ptr<Store> base, std::unique_ptr<Store> overlay);

}  // namespace memplan
