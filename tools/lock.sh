#!/usr/bin/env bash
# Refresh requirements.lock: the exact versions ./run.sh installs (torch apart: TORCH_SPEC picks
# it, and on a GPU machine torch brings its own CUDA packages and triton).
#   bash tools/lock.sh                  keep every pin the lock has, add what pyproject.toml added
#   bash tools/lock.sh --upgrade        every package to the newest release pyproject.toml allows
#   bash tools/lock.sh --upgrade-package transformers   move one package, keep the rest
# (universal: one lock for every platform and Python >= 3.11)
# Then run ./run.sh test on a fresh .venv and commit the lock only if the suite passes.
set -euo pipefail
cd "$(dirname "$0")/.."
command -v uv >/dev/null || python3 -m pip install -q "uv==0.13.9"
compile() {
  uv pip compile pyproject.toml tools/lock-build.in --extra notebooks --extra test --extra book \
    --universal --python-version 3.11 --no-emit-package torch "$@" -o requirements.lock
}
# first pass: find the CUDA packages torch's Linux wheels pull in; second: leave them out
compile "$@" -q
cuda=$(grep -oE '^(nvidia-|cuda-)[a-z0-9-]+' requirements.lock | sort -u | sed 's/^/--no-emit-package /')
# shellcheck disable=SC2086
compile $cuda "$@" -q
echo "requirements.lock: $(grep -cE '^[a-z]' requirements.lock) packages"
