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
# Needs what scripts/bootstrap.sh installs, or, on an offline GPU host, the Debian packages
# carried in as .deb files: MEMPLAN_GPU_HOST_DEBS=.gpu-debs builds through scripts/gpu-host-build.sh
# against the host's own LibTorch (the agent-asan figures in docs/benchmarks.md come from there).
# TSan: Debian's Abseil is not instrumented; common/sanitize/tsan_absl_sync.cc makes its Mutex
# visible, and scripts/tsan.supp names what remains (each entry with its reason).
# Environment: MEMPLAN_JOBS (build parallelism, default nproc), MEMPLAN_TEST_JOBS (ctest -j, default 2).
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
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
  dir=build-$kind
  configure=(-DCMAKE_BUILD_TYPE=Debug -DMEMPLAN_WERROR=ON -DMEMPLAN_SANITIZE="$sanitize"
    -DMEMPLAN_BUILD_AGENT="$agent" -DMEMPLAN_BUILD_BENCHMARKS=OFF)
  if [[ -n ${MEMPLAN_GPU_HOST_DEBS:-} ]]; then
    say "building $dir on this GPU host (-fsanitize=$sanitize, -Werror)"
    MEMPLAN_HOST_CMAKE_ARGS="${configure[*]}" bash scripts/gpu-host-build.sh "$MEMPLAN_GPU_HOST_DEBS" "$dir"
    source "$dir/env.sh"
  else
    if ! command -v protoc >/dev/null || { [[ $agent == ON ]] && [[ ! -e .venv/bin/python3 ]]; }; then
      echo "sanitize.sh: run scripts/bootstrap.sh first (it installs the packages and the Torch venv)" >&2
      exit 2
    fi
    export CCACHE_BASEDIR=$PWD CCACHE_NOHASHDIR=1
    if [[ ! -f $dir/CMakeCache.txt ]]; then
      say "configuring $dir (-fsanitize=$sanitize, -Werror)"
      cmake -S . -B "$dir" -G Ninja "${configure[@]}" >/dev/null
    fi
    say "building $dir with $jobs jobs"
    cmake --build "$dir" -j "$jobs"
  fi
  say "running ctest -R '$tests' under $sanitize"
  # detect_leaks stays on for the planner; LibTorch's own static allocations leak by design.
  # The agent's build runs its CPU suites only: the GPUs are hidden (its GPU tests skip), and the
  # shadow gap stays unprotected because the CUDA driver maps memory there when LibTorch probes it.
  leaks=1 asan_extra=''
  [[ $agent == ON ]] && leaks=0 asan_extra=:protect_shadow_gap=0
  # MEMPLAN_ORACLE_DRAWS: the brute-force search oracle runs 300 of its 3500 draws (the same
  # first ones); at -O0 under ASan all of them outlast the test's 600 s limit on 2 cores.
  (cd "$dir" &&
    if [[ $agent == ON ]]; then export CUDA_VISIBLE_DEVICES=''; fi &&
    MEMPLAN_ORACLE_DRAWS=300 \
    ASAN_OPTIONS="halt_on_error=1:abort_on_error=0:detect_leaks=$leaks:strict_string_checks=1$asan_extra" \
    UBSAN_OPTIONS="halt_on_error=1:print_stacktrace=1" \
    TSAN_OPTIONS="halt_on_error=1:exitcode=66:second_deadlock_stack=1:suppressions=$root/scripts/tsan.supp" \
    ctest --output-on-failure --timeout 900 -j "$test_jobs" -R "$tests")
done
say "sanitizer builds clean: ${kinds[*]}"
