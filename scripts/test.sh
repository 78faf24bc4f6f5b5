#!/usr/bin/env bash
# The test command: sets everything up, builds, and runs every test suite.
#   scripts/test.sh [ctest args...]
# MEMPLAN_SANITIZE_JOBS="asan tsan" also runs scripts/sanitize.sh's builds afterwards.
set -euo pipefail
cd "$(dirname "$0")/.."
build=${MEMPLAN_BUILD_DIR:-build}
bash scripts/bootstrap.sh "$build"
printf '\033[1m[memplan]\033[0m running tests\n'
cd "$build"
ctest --output-on-failure --timeout 900 -j "${MEMPLAN_TEST_JOBS:-2}" "$@"
# Sanitizer builds on request (scripts/sanitize.sh): MEMPLAN_SANITIZE_JOBS="asan tsan agent-asan".
if [[ -n ${MEMPLAN_SANITIZE_JOBS:-} ]]; then
  cd - >/dev/null
  read -ra sanitize_jobs <<<"$MEMPLAN_SANITIZE_JOBS"
  bash scripts/sanitize.sh "${sanitize_jobs[@]}"
fi
