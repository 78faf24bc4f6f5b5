#!/usr/bin/env bash
# Sets up a fresh Debian 12 machine for memplan and builds it. Idempotent: a second run
# installs nothing and rebuilds only what changed.
#   scripts/bootstrap.sh [BUILD_DIR]      (default: build)
# Environment: MEMPLAN_NO_AGENT=1 skips LibTorch; MEMPLAN_JOBS sets build parallelism;
# MEMPLAN_CACHE (default ~/.cache/memplan) holds the Torch virtualenv shared by clones.
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
jobs=${MEMPLAN_JOBS:-$(nproc)}
torch_version=2.11.0
transformers_version=5.24.0
safetensors_version=0.8.0
peft_version=0.21.2
bitsandbytes_version=0.50.2

say() { printf '\033[1m[memplan]\033[0m %s\n' "$*"; }

apt_packages=(
  build-essential cmake nlohmann-json3-dev ninja-build ccache pkg-config python3-venv
  libgrpc++-dev libprotobuf-dev protobuf-compiler protobuf-compiler-grpc
  libabsl-dev libsqlite3-dev sqlite3 prometheus-cpp-dev prometheus
  libgtest-dev libgmock-dev libbenchmark-dev
  openssl curl  # certificates and HTTPS requests of the TLS and webhook tests (tests/planner/e2e)
  libssl-dev  # the admission webhook's HTTPS server (planner/webhook)
  lua5.4  # runs deploy/slurm/job_submit.lua in its test
  lua-cjson  # JSON in deploy/slurm's cli_filter.lua (and its test)
  # python/ (memplan_client): its runtime, and offline `pip install --no-build-isolation ./python`
  # (stubs come from protoc + protobuf-compiler-grpc's grpc_python_plugin; Debian's
  # python3-grpc-tools bundles protoc 3.6, which rejects proto3 `optional`)
  python3-grpcio python3-protobuf python3-setuptools python3-wheel
  libgloo-dev  # headers for c10d's ProcessGroupGloo (the wheel has none); Torch links its own Gloo
)
missing=()
for p in "${apt_packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  say "installing Debian packages: ${missing[*]}"
  sudo_cmd=(); [[ $(id -u) -eq 0 ]] || sudo_cmd=(sudo)
  "${sudo_cmd[@]}" apt-get update -qq
  DEBIAN_FRONTEND=noninteractive "${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends \
    "${missing[@]}" >/dev/null
fi

agent_flag=-DMEMPLAN_BUILD_AGENT=ON
if [[ ${MEMPLAN_NO_AGENT:-0} == 1 ]]; then
  agent_flag=-DMEMPLAN_BUILD_AGENT=OFF
else
  # LibTorch comes from the PyTorch wheel. The virtualenv lives in a per-user cache so that
  # fresh clones (CI) reuse it instead of unpacking ~4 GB again; .venv links to it.
  cache=${MEMPLAN_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/memplan}
  venv=$cache/venv-torch-$torch_version
  if ! "$venv/bin/python3" -c "import torch, sys; sys.exit(torch.__version__.split('+')[0] != '$torch_version')" 2>/dev/null; then
    say "installing torch==$torch_version into $venv (one time)"
    rm -rf "$venv"
    mkdir -p "$cache"
    python3 -m venv "$venv"
    "$venv/bin/pip" install -q --upgrade pip
    "$venv/bin/pip" install -q "torch==$torch_version"
  fi
  # The parity suite (tests/parity) compares the agent with Hugging Face transformers.
  if ! "$venv/bin/python3" -c "import transformers, safetensors, sys; sys.exit(transformers.__version__ != '$transformers_version')" 2>/dev/null; then
    say "installing transformers==$transformers_version and safetensors into $venv (one time)"
    "$venv/bin/pip" install -q "transformers==$transformers_version" "safetensors==$safetensors_version"
  fi
  # LoRA/QLoRA parity and the 8-bit optimizer's reference: peft, and bitsandbytes (NF4 and
  # AdamW8bit run on the CPU too).
  if ! "$venv/bin/python3" -c "import peft, bitsandbytes, sys; sys.exit(peft.__version__ != '$peft_version' or bitsandbytes.__version__ != '$bitsandbytes_version')" 2>/dev/null; then
    say "installing peft==$peft_version and bitsandbytes==$bitsandbytes_version into $venv (one time)"
    "$venv/bin/pip" install -q "peft==$peft_version" "bitsandbytes==$bitsandbytes_version"
  fi
  if [[ ! -e .venv ]]; then ln -s "$venv" .venv; fi
fi

# ccache: paths relative to the checkout and no working-directory hashing, so every clone on this
# machine (CI clones a fresh one each run) shares one compiler cache.
export CCACHE_BASEDIR=$PWD CCACHE_NOHASHDIR=1

if [[ ! -f $build/CMakeCache.txt ]]; then
  say "configuring $build"
  cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo "$agent_flag" >/dev/null
fi
say "building $build with $jobs jobs"
cmake --build "$build" -j "$jobs"
