#!/usr/bin/env bash
# Sanitizer builds with warnings as errors, and the suites that run under them.
#   scripts/sanitize.sh [asan] [tsan] [agent-asan]     (default: asan tsan)
#     asan        planner side (no LibTorch) with -fsanitize=address,undefined: ctest -R 'planner|common'
#     tsan        planner side with -fsanitize=thread: ctest -R 'planner|common'
#     agent-asan  the agent with -fsanitize=address: its CPU suites (ctest -R agent; slow to build)
# Every build is -DMEMPLAN_WERROR=ON -DCMAKE_BUILD_TYPE=Debug (the sanitizers' line numbers stay
# exact) in build-<name>/. Any sanitizer report fails the run: halt_on_error for ASan/UBSan, and
# TSan's exitcode. Also reachable from the test command: MEMPLAN_SANITIZE_JOBS="asan tsan"
# scripts/test.sh runs this after the ordinary suites.
# Needs what scripts/bootstrap.sh installs.
# Environment: MEMPLAN_JOBS (build parallelism, default nproc), MEMPLAN_TEST_JOBS (ctest -j, default 2).
set -euo pipefail
cd "$(dirname "$0")/.."
jobs=${MEMPLAN_JOBS:-$(nproc)}
test_jobs=${MEMPLAN_TEST_JOBS:-2}
say() { printf '\033[1m[memplan sanitize]\033[0m %s\n' "$*"; }

kinds=("$@")
((${#kinds[@]})) || kinds=(asan tsan)
for kind in "${kinds[@]}"; do
  case $kind in
    asan) sanitize=address,undefined agent=OFF tests='planner|common' ;;
    tsan) sanitize=thread agent=OFF tests='planner|common' ;;
    agent-asan) sanitize=address agent=ON tests='agent' ;;
    *) echo "sanitize.sh: unknown build '$kind' (allowed: asan, tsan, agent-asan)" >&2; exit 2 ;;
  esac
  if ! command -v protoc >/dev/null || { [[ $agent == ON ]] && [[ ! -e .venv/bin/python3 ]]; }; then
    echo "sanitize.sh: run scripts/bootstrap.sh first (it installs the packages and the Torch venv)" >&2
    exit 2
  fi
  dir=build-$kind
  export CCACHE_BASEDIR=$PWD CCACHE_NOHASHDIR=1
  if [[ ! -f $dir/CMakeCache.txt ]]; then
    say "configuring $dir (-fsanitize=$sanitize, -Werror)"
    cmake -S . -B "$dir" -G Ninja -DCMAKE_BUILD_TYPE=Debug -DMEMPLAN_WERROR=ON \
      -DMEMPLAN_SANITIZE="$sanitize" -DMEMPLAN_BUILD_AGENT="$agent" -DMEMPLAN_BUILD_BENCHMARKS=OFF \
      >/dev/null
  fi
  say "building $dir with $jobs jobs"
  cmake --build "$dir" -j "$jobs"
  say "running ctest -R '$tests' under $sanitize"
  # detect_leaks stays on for the planner; LibTorch's own static allocations leak by design.
  leaks=1; [[ $agent == ON ]] && leaks=0
  # MEMPLAN_ORACLE_DRAWS: the brute-force search oracle runs 300 of its 3500 draws (the same
  # first ones); at -O0 under ASan all of them outlast the test's 600 s limit on 2 cores.
  (cd "$dir" &&
    MEMPLAN_ORACLE_DRAWS=300 \
    ASAN_OPTIONS="halt_on_error=1:abort_on_error=0:detect_leaks=$leaks:strict_string_checks=1" \
    UBSAN_OPTIONS="halt_on_error=1:print_stacktrace=1" \
    TSAN_OPTIONS="halt_on_error=1:exitcode=66:second_deadlock_stack=1" \
    ctest --output-on-failure --timeout 900 -j "$test_jobs" -R "$tests")
done
say "sanitizer builds clean: ${kinds[*]}"
