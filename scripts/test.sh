#!/usr/bin/env bash
# The test command: sets everything up, builds, and runs every test suite.
#   scripts/test.sh [ctest args...]
set -euo pipefail
cd "$(dirname "$0")/.."
build=${MEMPLAN_BUILD_DIR:-build}
bash scripts/bootstrap.sh "$build"
printf '\033[1m[memplan]\033[0m running tests\n'
cd "$build"
ctest --output-on-failure --timeout 900 -j "${MEMPLAN_TEST_JOBS:-2}" "$@"
