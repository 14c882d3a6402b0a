#!/usr/bin/env bash
# The project's commands. Each sets up a project-local virtual environment (.venv, reused
# while pyproject.toml and this script are unchanged) and then:
#   ./run.sh lab         opens the notebooks in JupyterLab
#   ./run.sh notebooks   executes every notebook headless and writes HTML to build/html/
#   ./run.sh test        runs the whole test suite, notebooks included (nbval)
#   ./run.sh book        builds the notebooks as committed (outputs included, nothing executed)
#                        into a static site with navigation and search: build/book/index.html
# Packages come from requirements.lock, the exact versions the suite passed with (refresh it with
# tools/lock.sh); REPLAYLAB_UNLOCKED=1 installs the newest releases pyproject.toml allows instead,
# to try drift on purpose (in a .venv of its own: REPLAYLAB_VENV=.venv-unlocked).
# TORCH_SPEC picks the torch build (default torch==2.13.0, the CPU build of these machines);
# on a GPU machine set it to the CUDA build you want, e.g. TORCH_SPEC=torch: that torch brings
# its own triton and CUDA packages, and the lock's triton pin is then left out.
set -euo pipefail
cd "$(dirname "$0")"
VENV=${REPLAYLAB_VENV:-.venv}
TORCH_DEFAULT=torch==2.13.0
TORCH_SPEC=${TORCH_SPEC:-$TORCH_DEFAULT}
MAMBA_SSM=mamba-ssm==2.3.2.post1
UV=uv==0.13.9
UNLOCKED=${REPLAYLAB_UNLOCKED:-0}
PY=$VENV/bin/python

quiet_pip() {  # pip, without the local index's "location is ignored" noise
  "$PY" -m pip --disable-pip-version-check "$@" 2> >(grep -v "is ignored: it is neither a file" >&2)
}

setup() {
  [ -x "$PY" ] || python3 -m venv "$VENV"
  local key stamp=$VENV/.replaylab-setup
  key=$(cat pyproject.toml run.sh requirements.lock | sha256sum | cut -c1-16)-$TORCH_SPEC-$UNLOCKED
  [ "$(cat "$stamp" 2>/dev/null)" = "$key" ] && return 0
  echo "setting up $VENV (a few minutes the first time)..."
  quiet_pip install -q "$TORCH_SPEC" "$UV"  # pip: its configuration may point at a local torch wheel
  if [ "$UNLOCKED" = 1 ]; then
    echo "REPLAYLAB_UNLOCKED=1: the newest releases pyproject.toml allows, not requirements.lock"
    "$VENV/bin/uv" pip install -q --python "$PY" -U "$TORCH_SPEC" -e ".[notebooks,test,book]" \
      -r tools/lock-build.in
  else
    local lock=requirements.lock
    if [ "$TORCH_SPEC" != "$TORCH_DEFAULT" ]; then  # keep the triton that this torch pins
      lock=$VENV/requirements-no-triton.lock
      grep -v '^triton==' requirements.lock >"$lock"
    fi
    "$VENV/bin/uv" pip install -q --python "$PY" --no-deps -r "$lock"
    "$VENV/bin/uv" pip install -q --python "$PY" --no-deps -e .
  fi
  # mamba-ssm is the test oracle: source only; its PyTorch references need no CUDA build
  MAMBA_FORCE_BUILD=TRUE MAMBA_SKIP_CUDA_BUILD=TRUE \
    quiet_pip install -q --no-build-isolation --no-deps "$MAMBA_SSM"
  echo "$key" >"$stamp"
}

cmd=${1:-help}
[ $# -gt 0 ] && shift
case "$cmd" in
  lab)
    setup
    root=(); [ "$(id -u)" = 0 ] && root=(--allow-root)  # containers often run as root
    exec "$VENV/bin/jupyter" lab notebooks/ "${root[@]}" "$@" ;;
  notebooks)
    setup
    mkdir -p build/html
    # plotly.js embedded in the pages, so they work offline
    REPLAYLAB_OFFLINE_HTML=1 "$VENV/bin/jupyter" nbconvert --to html --execute --output-dir build/html \
      --ExecutePreprocessor.store_widget_state=False --ExecutePreprocessor.timeout=600 \
      notebooks/[0-9]*.ipynb "$@"
    echo "HTML written to build/html/" ;;
  book)
    setup
    exec "$PY" tools/build_book.py "$@" ;;
  test)
    setup
    # two workers (pytest-xdist), a file at a time each (a notebook's cells stay in one kernel),
    # in the order of the collection (tests/conftest.py puts the slowest files first), one torch
    # thread each unless OMP_NUM_THREADS says otherwise
    export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
    exec "$PY" -m pytest tests --nbval-lax notebooks -p no:cacheprovider \
      -n "${REPLAYLAB_TEST_WORKERS:-2}" --dist loadfile --no-loadscope-reorder "$@" ;;
  *)
    sed -n '2,10p' "$0" | sed 's/^# \{0,1\}//'
    [ "$cmd" = help ] || exit 2 ;;
esac
