#!/usr/bin/env bash
# The wheels the test suite needs on the GPU machine beyond its own torch, triton and pytest
# (it has no network), at requirements.lock's versions, into DIR (default .whl-gpu2), plus the
# mamba-ssm source archive (tests compare against its references):
#   bash tools/gpu_suite_wheels.sh [DIR] [PYTHON]        # PYTHON: the project's venv python
# Carry DIR with the run (`run`'s carry; the working tree and DIR together stay under 64 MiB)
# and install it there with
#   WHEELS=DIR bash tools/gpu_session.sh suite
# Left out for room: hf_xet, which no test needs, and the notebook-format stack (jupytext,
# nbformat, jsonschema and theirs), whose tests read notebooks and skip or are ignored on the
# GPU (the suite mode's GPU_IGNORES). kernels stays: transformers 5.25's from_pretrained
# refuses to load without it, and without it the checkout's own kernels/ folder is what
# `import kernels` finds from the root (the suite of c01327c failed 40 tests so).
set -euo pipefail
dir=${1:-.whl-gpu2}; py=${2:-.venv/bin/python}
root=$(cd "$(dirname "$0")/.." && pwd)
packages=(einops huggingface-hub httpx2 httpcore2 truststore anyio h11 idna hypothesis
  sortedcontainers kernels tomlkit safetensors tokenizers tqdm transformers pyyaml)
pins=()
for p in "${packages[@]}"; do
  pin=$(grep -i "^$p==" "$root/requirements.lock" | cut -d' ' -f1) \
    || { echo "gpu_suite_wheels: $p is not in requirements.lock" >&2; exit 1; }
  pins+=("$pin")
done
mkdir -p "$dir"
"$py" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
  -d "$dir" "${pins[@]}"
# mamba-ssm ships only a source archive; its metadata step imports torch, hence --no-build-isolation
MAMBA_FORCE_BUILD=TRUE MAMBA_SKIP_CUDA_BUILD=TRUE \
  "$py" -m pip download -q --no-deps --no-binary :all: --no-build-isolation -d "$dir" mamba-ssm==2.3.2.post1
du -sh "$dir"
