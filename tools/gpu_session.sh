#!/usr/bin/env bash
# One device call of this session's GPU measurements (see data/README.md for what each writes):
#   bash tools/gpu_session.sh tests|ssd-speed|mamba1|snapshot-kernels|mamba2-pin|pin-check|conv|hit|step-sweep|gdn-inputs|serve|ragged|gdn|tune|families|stream|workloads|final|probe|graphs|profile|matmul|lossless|drafts|hf-suite|hf-families|hf-bench|probe-suite|prefill|prefill-kernels|ttft|host|spec|buckets|retune|rounds|adaptive|host-probe|host-rounds|admissions|fair|streams|suite|suite-stream (on the GPU machine, $OUT set)
# Installs the carried wheels (.whl: notebook packages, ruff, the peers; the suite's set: tools/gpu_suite_wheels.sh) into a scratch folder.
set -uo pipefail
mode=${1:?a mode: see the list above}
# the package itself, editable, as in a user's install (replaylab/kernels links to kernels/);
# where that cannot build, PYTHONPATH below still imports it from the checkout
python3 -m pip install -q --no-deps --no-build-isolation -e . >/tmp/pip-e.log 2>&1 \
  || tail -3 /tmp/pip-e.log
# WHEELS=.whl-gpu for the suite: no fla (transformers 5.17 routes its torch gated-delta rule
# to fla when fla imports, on the tests' CPU tensors), no ruff (its test skips), with debugpy
# and jedi (ipykernel needs them to run the notebooks)
# installed once per wheel set: a second mode on the same machine with the same WHEELS reuses it
if [ ! -d "${WHEELS:-.whl}" ]; then  # git ignores the wheel folders: they travel only in run's carry
  echo "WARNING: ${WHEELS:-.whl} is missing here (name it in run's carry); the image's packages run"
fi
if [ "$(cat /tmp/site/.wheels 2>/dev/null)" != "${WHEELS:-.whl}" ]; then
  rm -rf /tmp/site
  MAMBA_FORCE_BUILD=TRUE MAMBA_SKIP_CUDA_BUILD=TRUE python3 -m pip install -q --no-index --no-deps \
    --no-build-isolation --target /tmp/site ${WHEELS:-.whl}/* >/tmp/pip.log 2>&1 \
    && echo "${WHEELS:-.whl}" >/tmp/site/.wheels || tail -5 /tmp/pip.log
fi
export PYTHONPATH=/tmp/site:$PWD PATH=/tmp/site/bin:$PATH
# the copy on the GPU machine has no git history: the results name the commit they ran
export REPLAYLAB_COMMIT=${COMMIT:-}
stamp() {
  echo "# $*"
  echo "# $(nvidia-smi --query-gpu=name --format=csv,noheader), $(python3 -c 'import torch, triton; print(f"torch {torch.__version__}, triton {triton.__version__}")'), $(python3 -c 'import transformers; print(f"transformers {transformers.__version__}")' 2>/dev/null || echo "transformers: none importable"), $(date -u +%FT%TZ), tree of commit ${COMMIT:-unknown}"
}
case "$mode" in
  tests)
    cmd="python3 -m pytest -q -rf -p no:cacheprovider tests/test_matmul.py tests/test_kernels.py tests/test_decode_kernels.py tests/test_engine.py"
    { stamp "$cmd"; timeout 170 $cmd; } >"$OUT/gpu_engine_tests.log" 2>&1
    tail -4 "$OUT/gpu_engine_tests.log"
    timeout 390 python3 -m replaylab.bench serve --out "$OUT/bench_serve.json" \
      --phases lossless,prefill,logit_error --batches 1,8,64 2>&1 | tail -40 ;;
  ragged)  # ragged decode, then the whole suite in what is left (SIGINT: pytest summarises)
    timeout 210 python3 -m replaylab.bench serve --out "$OUT/bench_serve_ragged.json" \
      --phases ragged --ragged-batches 1,8,64,128 --spec-batches 8,64,128 \
      --other-batches 1,128 2>&1 | tail -30
    cmd="python3 -m pytest tests -q -rf -p no:cacheprovider --ignore=tests/test_browser.py"
    { stamp "$cmd"; timeout -s INT 320 $cmd; } >"$OUT/gpu_tests.log" 2>&1
    tail -30 "$OUT/gpu_tests.log" ;;
  gdn)  # the Gated DeltaNet replay kernels: tests, then the bench against fla
    cmd="python3 -m pytest -q -rf -p no:cacheprovider tests/test_gdn_kernels.py"
    { stamp "$cmd"; timeout 120 $cmd; } >"$OUT/gpu_gdn_tests.log" 2>&1
    tail -4 "$OUT/gpu_gdn_tests.log"
    timeout 400 python3 -m replaylab.bench gdn-kernels --out "$OUT/bench_gdn_kernels.json" \
      ${GDN_ARGS:-} 2>&1 | tail -30 ;;
  tune)  # kernel tests of the families, the GDN launch sweep, the Mamba-1 bench
    cmd="python3 -m pytest -q -rf -p no:cacheprovider tests/test_gdn_kernels.py tests/test_mamba1_kernels.py"
    { stamp "$cmd"; timeout 150 $cmd; } >"$OUT/gpu_family_kernel_tests.log" 2>&1
    tail -4 "$OUT/gpu_family_kernel_tests.log"
    timeout 200 python3 -m replaylab.bench gdn-kernels --out "$OUT/bench_gdn_sweep.json" \
      --batches 128 --log-lens 16 --sweep 2>&1 | tail -12
    timeout 200 python3 -c "import json; from replaylab.bench.mamba1_kernels import run, summary; r = run(); json.dump(r, open('$OUT/bench_mamba1_kernels.json', 'w'), indent=1, default=str); print(chr(10).join(summary(r)))" 2>&1 | tail -30 ;;
  families)  # the families' replay kernels in the engine: their tests, then the per-family
    # engine bench (FAMILIES_ARGS: e.g. --presets qwen3.5-9b-layers --batches 8,128)
    # (FAMILIES_ARGS='--fused on': the fused path too where it serves the preset; Bamba's tests run first)
    fam=tests/test_engine_families.py
    cmd="python3 -m pytest -q -rf -p no:cacheprovider tests/test_engine_family_kernels.py tests/test_bench_families.py $fam::test_bamba_on_the_fused_path_follows_the_teaching_cache $fam::test_bamba_on_the_fused_path_speculates_its_own_greedy_tokens_bit_for_bit tests/test_decode_kernels.py"
    { stamp "$cmd"; timeout 120 $cmd; } >"$OUT/gpu_engine_family_tests.log" 2>&1
    tail -4 "$OUT/gpu_engine_family_tests.log"
    timeout 420 python3 -m replaylab.bench engine-families --out "$OUT/bench_engine_families.json" \
      ${FAMILIES_ARGS:-} 2>&1 | tail -70 ;;
  stream)  # the request stream (STREAM_S seconds at most)
    timeout -s INT ${STREAM_S:-300} python3 -m replaylab.bench serve-stream --preset 8b-layers \
      --out "$OUT/bench_serve_stream.json" ${STREAM_ARGS:-} 2>&1 | tail -40 ;;
  workloads)  # the prefix-sharing request streams (issue 38, item 3), one workload per file
    # (WS_S seconds each at most; WS_ARGS: e.g. "--modes decode,synthetic")
    for w in ${WORKLOADS:-multi_turn system_prompts few_shot agents}; do
      timeout -s INT ${WS_S:-140} python3 -m replaylab.bench workload-stream --preset gpu \
        --workloads "$w" --out "$OUT/bench_workload_stream_gpu_$w.json" ${WS_ARGS:-} 2>&1 | tail -4
    done ;;
  fair)  # WHEELS=.whl-gpu2, issue 38's fair rerun in one call: each workload's plain decode on
    # engines built for it (one round, the streams of 6b344e2's files; FAIR_WS_S seconds each at
    # most), then the whole suite in what is left of FAIR_S seconds since this script started
    # (the installs included; the suite's own install and gzip need the rest of the 600)
    for w in ${WORKLOADS:-few_shot multi_turn system_prompts agents}; do
      timeout -s INT ${FAIR_WS_S:-85} python3 -m replaylab.bench workload-stream --preset gpu \
        --workloads "$w" --modes decode --strategies replay,snapshot \
        --out "$OUT/bench_workload_stream_gpu_${w}_decode.json" 2>&1 | tail -3
    done
    left=$(( ${FAIR_S:-540} - SECONDS ))
    if [ "$left" -ge 60 ]; then SUITE_S=$left bash "$0" suite; else echo "no time left for the suite ($left s)"; fi ;;
  streams)  # issue 38, the call after "fair": bench serve-stream under a budget that binds
    # (STREAM_ARGS; the default 0.25 GiB holds about a quarter of its 40 requests' snapshot
    # slots built for plain decode, 26 MB each in data/slot_bytes_8b_layers.json, and 3 of those
    # built for k = 4; its committed run's 3 GiB bound none), then few-shot's plain decode over
    # three rounds (30 requests)
    timeout -s INT ${STREAM_S:-250} python3 -m replaylab.bench serve-stream --preset 8b-layers \
      --out "$OUT/bench_serve_stream.json" ${STREAM_ARGS:---budget-gib 0.25} 2>&1 | tail -30
    timeout -s INT ${WS_S:-250} python3 -m replaylab.bench workload-stream --preset gpu \
      --workloads few_shot --modes decode --strategies replay,snapshot --rounds 3 \
      --out "$OUT/bench_workload_stream_gpu_few_shot_decode_rounds3.json" 2>&1 | tail -4 ;;
  suite-stream)  # WHEELS=.whl-gpu2: the whole suite (SUITE_S, 300), issue 38's batch-32
    # prefill against its roofline (tools/prefill_batch_roofline.py, PREFILL_S), then bench
    # serve-stream under 0.25 GiB (its batch-1 pass timed warm since 2026-12-08) in what is left
    # of SUITE_STREAM_S (540) since this script started; the bench writes what it has when cut
    SUITE_S=${SUITE_S:-300} bash "$0" suite
    timeout -k 20 -s INT ${PREFILL_S:-90} python3 tools/prefill_batch_roofline.py \
      "$OUT/prefill_batch_roofline.json" 2>&1 | tail -8
    left=$(( ${SUITE_STREAM_S:-540} - SECONDS ))
    if [ "$left" -ge 60 ]; then
      timeout -k 20 -s INT $left python3 -m replaylab.bench serve-stream --preset 8b-layers \
        --out "$OUT/bench_serve_stream.json" ${STREAM_ARGS:---budget-gib 0.25} 2>&1 | tail -30
    else echo "no time left for the stream ($left s)"; fi ;;
  final)  # WHEELS=.whl-gpu, fla wheels in .whl-fla (installed beside, for the bench only):
    # the GPU tests of what changed, then the engine per family, time to first token with a
    # prefix hit, and whether a slot's bits depend on its batch; each writes under $OUT
    export OMP_NUM_THREADS=1
    { stamp "pytest -n 8 --dist loadfile: the family engine, interleaved admission, TTFT and family bench smoke tests, the batch-invariance GPU test, the reruns of the Bamba, generate and notebook-11 tests"
      timeout -s INT ${TESTS_S:-80} python3 -m pytest -q -rf -p no:cacheprovider -n 8 --dist loadfile \
        tests/test_engine_family_kernels.py tests/test_engine_admission.py tests/test_prefix_ttft.py \
        tests/test_bench_families.py tests/test_model.py tests/test_generate.py \
        tests/test_decode_kernels.py tests/test_notebook_solutions.py \
        -k "family or admission or ttft or bench_families or bamba or serving_engine or batch_it_runs_in or 11_beyond or Admission or interleav or chunks or scheduler"
    } >"$OUT/gpu_tests_final.log" 2>&1
    tail -6 "$OUT/gpu_tests_final.log"
    unset OMP_NUM_THREADS
    python3 -m pip install -q --no-index --no-deps --target /tmp/site-fla .whl-fla/* >/dev/null 2>&1
    PYTHONPATH=/tmp/site-fla:$PYTHONPATH timeout -s INT ${FAMILIES_S:-120} python3 -m replaylab.bench \
      engine-families --out "$OUT/bench_engine_families.json" ${FAMILIES_ARGS:-} 2>&1 | tail -40
    timeout -s INT ${TTFT_S:-75} python3 -m replaylab.bench prefix --engine --ttft --preset gpu \
      --out "$OUT/bench_prefix_ttft_gpu.json" ${TTFT_ARGS:-} 2>&1 | tail -14
    timeout -s INT ${INVARIANCE_S:-50} python3 tools/batch_invariance.py "$OUT/batch_invariance.json" 2>&1 | tail -8 ;;
  probe)  # WHEELS=.whl-gpu: the row-invariance and family kernel tests, where Jamba-class
    # replay parts from single steps, and whether the reference path holds in CUDA graphs
    export OMP_NUM_THREADS=1
    cmd="python3 -m pytest -q -rf -p no:cacheprovider -n 8 --dist loadfile --junitxml=$OUT/gpu_probe_tests.xml tests/test_mamba1_kernels.py tests/test_engine_row_invariance.py tests/test_engine_family_kernels.py tests/test_matmul.py"
    { stamp "$cmd"; timeout -s INT ${TESTS_S:-150} $cmd; } >"$OUT/gpu_probe_tests.log" 2>&1
    tail -5 "$OUT/gpu_probe_tests.log"
    unset OMP_NUM_THREADS
    timeout -s INT ${PROBE_S:-90} python3 tools/row_invariance_probe.py "$OUT/row_invariance_probe_jamba.json" \
      --presets jamba-1.5-mini-layers --batches 8,32 --strategies replay --matmul row_invariant 2>&1 | tail -12
    timeout -s INT ${GRAPH_S:-200} python3 tools/graph_probe.py "$OUT/graph_probe.json" ${GRAPH_ARGS:-} 2>&1 | tail -20 ;;
  graphs)  # WHEELS=.whl-gpu, fla in .whl-fla: the engine tests that CUDA graphs change on the
    # reference path, then the family bench with graphs (FAMILIES_ARGS), fla beside
    export OMP_NUM_THREADS=1
    cmd="python3 -m pytest -q -rf -p no:cacheprovider -n 8 --dist loadfile --junitxml=$OUT/gpu_graph_tests.xml tests/test_engine_family_kernels.py tests/test_engine_families.py tests/test_engine.py tests/test_bench_families.py tests/test_engine_row_invariance.py tests/test_engine_admission.py tests/test_scheduler.py tests/test_cache_contract.py"
    { stamp "$cmd"; timeout -s INT ${TESTS_S:-120} $cmd; } >"$OUT/gpu_graph_tests.log" 2>&1
    tail -5 "$OUT/gpu_graph_tests.log"
    unset OMP_NUM_THREADS
    python3 -m pip install -q --no-index --no-deps --target /tmp/site-fla .whl-fla/* >/dev/null 2>&1
    PYTHONPATH=/tmp/site-fla:$PYTHONPATH timeout -s INT ${FAMILIES_S:-330} python3 -m replaylab.bench \
      engine-families --out "$OUT/bench_engine_families.json" ${FAMILIES_ARGS:-} 2>&1 | tail -60 ;;
  profile)  # WHEELS=.whl-fla: the profiles behind the missed targets. Nsight Compute over the GDN
    # fold, the replay steps and the peers (tools/ncu_probe.py); a speculation round's phases.
    # (The fold's launch sweep with a same-bytes copy beside it: tools/tune_families.py, `tune`.)
    echo "ncu: $(command -v ncu)"
    timeout -s INT ${NCU_S:-100} ncu --clock-control none --profile-from-start off --csv --page details \
      --print-units base -k 'regex:_probe_copy_kernel|_fold_kernel|_replay_step_kernel|fused_recurrent|_selective_scan_update_kernel' \
      --section SpeedOfLight --section MemoryWorkloadAnalysis --section Occupancy \
      --section WarpStateStats --section ComputeWorkloadAnalysis --section LaunchStats \
      --log-file "$OUT/ncu_kernels.csv" python3 tools/ncu_probe.py "$OUT/ncu_labels.json" \
      >"$OUT/ncu_probe.log" 2>&1
    echo "ncu rc $?"; tail -12 "$OUT/ncu_probe.log"
    python3 tools/ncu_probe.py --summary "$OUT/ncu_kernels.csv" "$OUT/ncu_labels.json" "$OUT/ncu_summary.json" 2>&1 | tail -12
    timeout -s INT ${SPEC_S:-110} python3 tools/spec_round_profile.py "$OUT/spec_round_profile.json" 2>&1 | tail -16
    timeout -s INT ${HOST_S:-30} python3 tools/spec_host_probe.py "$OUT/spec_host_probe_gpu.json" 2>&1 | tail -6 ;;
  matmul)  # the row-invariant product: its GPU tests, then the launch sweep (MATMUL_ARGS)
    cmd="python3 -m pytest -q -rf -p no:cacheprovider tests/test_matmul.py"
    { stamp "$cmd"; timeout 120 $cmd; } >"$OUT/gpu_matmul_tests.log" 2>&1
    tail -4 "$OUT/gpu_matmul_tests.log"
    timeout -s INT ${MATMUL_S:-420} python3 -m replaylab.bench matmul --out "$OUT/bench_matmul_sweep.json" \
      --sweep ${MATMUL_ARGS:-} 2>&1 | tail -40 ;;
  buckets)  # WHEELS=.whl-pin: launches chosen by the row count (issue 36, item 1): the product's and the
    # engine's row-invariance GPU tests (PART=tests), then (PART=bench) the product at every row count
    # against cuBLAS and the previous one-launch table (previous_launch_for), then the matched engine's
    # arms in one process (the default, the previous table, cuBLAS) against mamba-ssm (MATCHED_ARGS)
    rm -rf /tmp/site/huggingface_hub*  # .whl-pin's hub refuses the image's transformers
    if [ "${PART:-all}" != bench ]; then
      cmd="python3 -m pytest -q -rf -p no:cacheprovider tests/test_matmul.py tests/test_engine_row_invariance.py"
      { stamp "$cmd"; timeout -s INT ${TESTS_S:-300} $cmd; } >"$OUT/gpu_matmul_rows_tests.log" 2>&1
      tail -4 "$OUT/gpu_matmul_rows_tests.log"
    fi
    [ "${PART:-all}" = tests ] && exit 0
    timeout -s INT ${MATMUL_S:-150} python3 -m replaylab.bench matmul --out "$OUT/bench_matmul_rows.json" \
      --rows 1,2,4,8,16,32,64,128,256,320,640,1280 2>&1 | tail -34
    timeout -s INT ${MATCHED_S:-300} python3 -m replaylab.bench matched --out "$OUT/bench_matched_rows.json" \
      ${MATCHED_ARGS:-} 2>&1 | tail -24 ;;
  host-probe)  # issue 36: the scheduler's host work a speculation round on this machine's host
    # (CPU only, forward stubbed; tools/spec_host_probe.py), the floor under its rounds here
    OMP_NUM_THREADS=1 timeout -s INT ${PROBE_S:-120} python3 tools/spec_host_probe.py \
      "$OUT/spec_host_probe_scheduler_gpu_host.json" --drafters scheduler --batches 8,32,128 \
      --label "${COMMIT:-unknown}" 2>&1 | tail -6 ;;
  admissions)  # WHEELS=.whl-gpu2: issues 36 / 38, an iteration's admissions in one prefill
    # (DecodeEngine(batched_admission=True), opt-in until this runs): its GPU tests, then bench
    # spec-steady without and with it on this tree, taking turns (ADMIT_PASSES passes), so
    # admitting_s and the whole run's rate sit side by side
    export OMP_NUM_THREADS=1
    if [ "${ADMIT_TESTS:-1}" != 0 ]; then  # ADMIT_TESTS=0: the suite ran them in this call
      cmd="python3 -m pytest -q -rf -p no:cacheprovider tests/test_batched_admission.py"
      { stamp "$cmd"; timeout 120 $cmd; } >"$OUT/gpu_tests_batched_admission.log" 2>&1
      tail -3 "$OUT/gpu_tests_batched_admission.log"
    fi
    for pass in $(seq ${ADMIT_PASSES:-2}); do
      for arm in alone together; do
        flag=""; [ $arm = together ] && flag=--batched-admission
        timeout -s INT ${SPEC_S:-150} python3 -m replaylab.bench spec-steady --preset matched \
          --batches ${SPEC_BATCHES:-8,32,128} --other-k ${OTHER_K:-3} --n-new ${N_NEW:-128} $flag \
          --out "$OUT/bench_spec_steady_admissions_${arm}_$pass.json" 2>&1 | tail -4
      done
    done ;;
  host-rounds)  # WHEELS=.whl-gpu2: issue 36, the host's part of a scheduler round, on the previous
    # tree (PREV: a folder holding its replaylab/ and kernels/) and this one, taking turns
    # (ROUNDS_PASSES passes): bench spec-steady (k = 4 and OTHER_K, N_NEW tokens a request);
    # then each tree's iteration phases (tools/iteration_phases.py), host probe and prompt lookup probe
    export OMP_NUM_THREADS=1
    for pass in $(seq ${ROUNDS_PASSES:-2}); do
      for tree in previous this; do
        path=$PWD; commit=${COMMIT:-}
        [ $tree = previous ] && { path=$PWD/${PREV:?a folder with the previous tree}; commit=${PREV_COMMIT:-}; }
        REPLAYLAB_COMMIT=$commit PYTHONPATH=/tmp/site:$path timeout -s INT ${SPEC_S:-150} python3 -P -m replaylab.bench spec-steady \
          --preset matched --batches ${SPEC_BATCHES:-8,32,128} --other-k ${OTHER_K:-3} --n-new ${N_NEW:-128} \
          --out "$OUT/bench_spec_steady_${tree}_$pass.json" 2>&1 | tail -5
      done
    done
    for tree in previous this; do
      path=$PWD; commit=${COMMIT:-}
      [ $tree = previous ] && { path=$PWD/$PREV; commit=${PREV_COMMIT:-}; }
      REPLAYLAB_COMMIT=$commit PYTHONPATH=/tmp/site:$path timeout -s INT ${PHASES_S:-120} python3 -P tools/iteration_phases.py \
        "$OUT/iteration_phases_$tree.json" --batches ${SPEC_BATCHES:-8,32,128} --k 4 2>&1 | tail -6
      PYTHONPATH=/tmp/site:$path timeout -s INT ${PROBE_S:-60} python3 -P tools/spec_host_probe.py \
        "$OUT/spec_host_probe_scheduler_gpu_host_$tree.json" --drafters scheduler --batches 8,32,128 \
        --label "$commit" 2>&1 | tail -4
      # prompt lookup's host rounds on this host (the numpy path since 52b856e)
      PYTHONPATH=/tmp/site:$path timeout -s INT ${PROBE_S:-60} python3 -P tools/prompt_lookup_probe.py \
        "$OUT/prompt_lookup_probe_gpu_host_$tree.json" --label "$commit" 2>&1 | tail -6
    done ;;
  rounds)  # WHEELS=.whl-gpu2: speculation rounds on the device beside the host's (issue 36, item
    # 3): bench matched's replay speculation with one BatchSyntheticDrafter, host rounds then
    # device rounds on each engine, over plain decode on the same engine (ROUNDS_ARGS); then
    # the suite in what is left (SUITE_FILES: its files, default tests/; SUITE_ARGS: its ignores)
    timeout -s INT ${ROUNDS_S:-200} python3 -m replaylab.bench matched --batches 8,32,128 \
      --spec-batches 8,32,128 --arms row_invariant --spec-strategies replay,replay-ring \
      --drafter batched,device --no-mamba-ssm --out "$OUT/bench_matched_device_rounds.json" \
      ${ROUNDS_ARGS:-} 2>&1 | tail -16
    export OMP_NUM_THREADS=1
    cmd="python3 -m pytest ${SUITE_FILES:-tests} -q -rf -p no:cacheprovider --ignore=tests/test_browser.py -n ${SUITE_WORKERS:-15} --dist loadfile --durations=30 --junitxml=$OUT/gpu_tests.xml ${SUITE_ARGS:-}"
    { stamp "$cmd"; timeout -s INT ${SUITE_S:-340} $cmd; } >"$OUT/gpu_tests.log" 2>&1
    tail -30 "$OUT/gpu_tests.log" ;;
  adaptive)  # WHEELS=.whl-gpu2: issue 36, speculation at serving batch sizes: bench spec-steady
    # (every slot busy) with k = 4, k = 1 and 2, and the scheduler choosing each round's k
    # (adaptive_k), side by side on one engine per batch; with ROUNDS_S, the device rounds
    # beside the host's (the rounds mode's bench); then the GPU tests of the scheduler's
    # speculation, the drafters and the device rounds (SUITE_FILES; SUITE_FILES=none: no tests)
    timeout -s INT ${SPEC_S:-300} python3 -m replaylab.bench spec-steady --preset matched \
      --batches ${SPEC_BATCHES:-8,32,128} --other-k ${OTHER_K:-1,2} --adaptive --n-new ${N_NEW:-64} --repeats ${REPEATS:-1} \
      --out "$OUT/bench_spec_steady_adaptive.json" 2>&1 | tail -16
    if [ -n "${ROUNDS_S:-}" ]; then
      timeout -s INT $ROUNDS_S python3 -m replaylab.bench matched --batches 8,32,128 \
        --spec-batches 8,32,128 --arms row_invariant --spec-strategies replay,replay-ring \
        --drafter batched,device --no-mamba-ssm --out "$OUT/bench_matched_device_rounds.json" 2>&1 | tail -16
    fi
    [ "${SUITE_FILES:-}" = none ] && exit 0
    export OMP_NUM_THREADS=1
    cmd="python3 -m pytest ${SUITE_FILES:-tests/test_adaptive_k.py tests/test_bench_spec_steady.py tests/test_device_rounds.py tests/test_drafters.py} -q -rf -p no:cacheprovider -n ${SUITE_WORKERS:-4} --dist loadfile --junitxml=$OUT/gpu_tests.xml"
    { stamp "$cmd"; timeout -s INT ${SUITE_S:-120} $cmd; } >"$OUT/gpu_tests.log" 2>&1
    tail -8 "$OUT/gpu_tests.log" ;;
  retune)  # WHEELS=.whl-pin: issue 36, item 1's re-sweep. PART=sweep: every candidate launch of
    # the matched model's weights (in-loop launches timed themselves, 320 rows), then the table
    # best_launches chooses from it against TUNED (launch_for) and cuBLAS at every row count.
    # PART=matched: the matched engine with that table against TUNED, in one process
    # (SWEEP: the sweep's JSON, carried in the working tree; MATCHED_ARGS)
    [ "${WHEELS:-.whl}" = .whl-pin ] && rm -rf /tmp/site/huggingface_hub*  # its hub refuses the image's transformers
    if [ "${PART:-sweep}" = sweep ]; then
      timeout -s INT ${SWEEP_S:-400} python3 -m replaylab.bench matmul --sweep --presets 8b-layers \
        --out "$OUT/bench_matmul_sweep_inloop.json" 2>&1 | tail -8
      timeout -s INT ${MATMUL_S:-120} python3 -m replaylab.bench matmul --presets 8b-layers \
        --launches "$OUT/bench_matmul_sweep_inloop.json" --out "$OUT/bench_matmul_retuned.json" 2>&1 | tail -20
    else
      timeout -s INT ${MATCHED_S:-400} python3 -m replaylab.bench matched --launches "${SWEEP:?}" \
        --out "$OUT/bench_matched_retuned.json" ${MATCHED_ARGS:-} 2>&1 | tail -24
    fi ;;
  lossless)  # the row-invariant product against cuBLAS and its previous launch, then the
    # lossless engine against mamba-ssm on the same weights (MATCHED_ARGS)
    timeout -s INT ${MATMUL_S:-150} python3 -m replaylab.bench matmul --out "$OUT/bench_matmul.json" \
      --rows 1,8,64,128,256,640,1280 2>&1 | tail -32
    timeout -s INT ${MATCHED_S:-360} python3 -m replaylab.bench matched --out "$OUT/bench_matched.json" \
      ${MATCHED_ARGS:-} 2>&1 | tail -20 ;;
  drafts)  # WHEELS=.whl-gpu2 (the suite's set): the batched drafters on the GPU (issue 36, item 3): their tests,
    # then the trained pair with BatchModelDrafter (DRAFT_ARGS), then the matched engine's
    # speculation with one BatchSyntheticDrafter beside the previous rows (MATCHED_ARGS)
    export OMP_NUM_THREADS=1
    cmd="python3 -m pytest -q -rf -p no:cacheprovider tests/test_drafters.py tests/test_bench_draft_model.py tests/test_scheduler.py"
    { stamp "$cmd"; timeout -s INT ${TESTS_S:-150} $cmd; } >"$OUT/gpu_drafter_tests.log" 2>&1
    tail -4 "$OUT/gpu_drafter_tests.log"
    timeout -s INT ${DRAFT_S:-200} python3 -m replaylab.bench draft-model --device cuda \
      --out "$OUT/bench_draft_model_gpu.json" ${DRAFT_ARGS:---batches 1,8,32,64} 2>&1 | tail -16
    timeout -s INT ${MATCHED_S:-200} python3 -m replaylab.bench matched --drafter batched \
      --out "$OUT/bench_matched_batched_drafter.json" ${MATCHED_ARGS:---no-mamba-ssm} 2>&1 | tail -20 ;;
  hf-suite)  # WHEELS=.whl-gpu2 (transformers 5.25 and its hub, tokenizers, safetensors, kernels
    # as the lock pins them; no plotly, debugpy or jedi: the carry's 64 MiB): transformers'
    # assisted generation under replaylab.hf, then the suite (SUITE_ARGS: its ignores)
    timeout -s INT ${HF_S:-110} python3 -m replaylab bench hf-cache --device cuda \
      --presets 8b-layers --out "$OUT/bench_hf_cache_gpu.json" 2>&1 | tail -16
    export OMP_NUM_THREADS=1
    cmd="python3 -m pytest tests -q -rf -p no:cacheprovider --ignore=tests/test_browser.py -n ${SUITE_WORKERS:-8} --dist loadfile --durations=30 --junitxml=$OUT/gpu_tests.xml ${SUITE_ARGS:-}"
    { stamp "$cmd"; timeout -s INT ${SUITE_S:-400} $cmd; } >"$OUT/gpu_tests.log" 2>&1
    tail -30 "$OUT/gpu_tests.log" ;;
  hf-families)  # WHEELS=.whl-bench (transformers 5.25 stack and mamba-ssm, no notebook stack),
    # fla in .whl-fla (beside, for the family bench only): the GPU tests of replaylab.hf and
    # the families' replay kernels, transformers' assisted generation under replaylab.hf at
    # three families' published layer shapes, then the engine per family with fla beside
    export OMP_NUM_THREADS=1
    cmd="python3 -m pytest -q -rf -p no:cacheprovider -n 6 --dist loadfile tests/test_hf_cache.py tests/test_mamba1_kernels.py tests/test_gdn_kernels.py"
    { stamp "$cmd"; timeout -s INT ${TESTS_S:-70} $cmd; } >"$OUT/gpu_hf_tests.log" 2>&1
    tail -4 "$OUT/gpu_hf_tests.log"
    unset OMP_NUM_THREADS
    timeout -s INT ${HF_S:-280} python3 -m replaylab bench hf-cache --device cuda \
      --presets 8b-layers,qwen3.5-9b-layers,jamba-1.5-mini-layers --out "$OUT/bench_hf_cache_gpu.json" 2>&1 | tail -30
    python3 -m pip install -q --no-index --no-deps --target /tmp/site-fla .whl-fla/* >/dev/null 2>&1
    PYTHONPATH=/tmp/site-fla:$PYTHONPATH timeout -s INT ${FAMILIES_S:-200} python3 -m replaylab.bench \
      engine-families --out "$OUT/bench_engine_families.json" ${FAMILIES_ARGS:-} 2>&1 | tail -40 ;;
  hf-bench)  # WHEELS=.whl-bench: bench hf-cache alone (HF_ARGS)
    timeout -s INT ${HF_S:-500} python3 -m replaylab bench hf-cache --device cuda \
      --presets 8b-layers,qwen3.5-9b-layers,jamba-1.5-mini-layers --out "$OUT/bench_hf_cache_gpu.json" \
      ${HF_ARGS:-} 2>&1 | tr '\r' '\n' | tail -40 ;;
  probe-suite)  # WHEELS=.whl-gpu2: the Gated DeltaNet prefill's corrected updates, token loop
    # against the chunked form side by side (tools/gdn_prefill_probe.py), Jamba-class decode
    # beside mamba-ssm's update, then the suite
    timeout -s INT ${PROBE_S:-110} python3 tools/gdn_prefill_probe.py "$OUT/gdn_prefill_probe.json" 2>&1 | tail -8
    # Jamba-class decode: the engine's snapshot and replay beside mamba-ssm's update (ssu rows)
    timeout -s INT ${FAMILIES_S:-100} python3 -m replaylab.bench engine-families \
      --presets jamba-1.5-mini-layers --strategies snapshot,replay --batches ${SSU_BATCHES:-8,32,128} \
      --graphs on --n-spec 0 --out "$OUT/bench_engine_families_ssu.json" 2>&1 | tail -12
    export OMP_NUM_THREADS=1
    cmd="python3 -m pytest tests -q -rf -p no:cacheprovider --ignore=tests/test_browser.py -n ${SUITE_WORKERS:-15} --dist loadfile --durations=30 --junitxml=$OUT/gpu_tests.xml ${SUITE_ARGS:-}"
    { stamp "$cmd"; timeout -s INT ${SUITE_S:-380} $cmd; } >"$OUT/gpu_tests.log" 2>&1
    tail -30 "$OUT/gpu_tests.log" ;;
  prefill)  # WHEELS=.whl-min: whether a dead graph collected inside a capture invalidates it
    # (torch's capture, replaylab's), replay's cold prefill beside snapshot's with the folds
    # chained and fold by fold (tools/replay_prefill_probe.py), then time to first token cold
    # and with prefix hits, on the grid (2,048 shared tokens) and off it (2,000)
    for c in torch replaylab; do timeout 60 python3 tools/graph_gc_probe.py $c 2>&1 | tail -1; done \
      | tee "$OUT/graph_gc_probe.jsonl"
    timeout -s INT ${PROBE_S:-150} python3 tools/replay_prefill_probe.py "$OUT/replay_prefill_probe.json" 2>&1 | tail -8
    timeout -s INT ${TTFT_S:-100} python3 -m replaylab.bench prefix --engine --ttft --preset gpu \
      --out "$OUT/bench_prefix_ttft_gpu.json" 2>&1 | tail -8
    timeout -s INT ${TTFT_S:-100} python3 -m replaylab.bench prefix --engine --ttft --preset gpu \
      --shared-tokens 2000 --out "$OUT/bench_prefix_ttft_offgrid_gpu.json" 2>&1 | tail -8 ;;
  prefill-kernels)  # WHEELS=.whl-gpu2: the prompt-scan kernels (issue 38, item 1): their GPU tests,
    # the scans alone per family, the engine's admissions per arm, TTFT with and without them
    export OMP_NUM_THREADS=1
    cmd="python3 -m pytest -q -rf -p no:cacheprovider -n 8 tests/test_ssd_chunked_kernel.py tests/test_gdn_scan_kernel.py tests/test_s6_scan_kernel.py tests/test_engine_prefix.py"
    if [ "${TESTS_S:-90}" != 0 ]; then  # TESTS_S=0: after the suite, which runs them
      { stamp "$cmd"; timeout -s INT ${TESTS_S:-90} $cmd; } >"$OUT/gpu_prefill_kernel_tests.log" 2>&1
      tail -4 "$OUT/gpu_prefill_kernel_tests.log"
    fi
    unset OMP_NUM_THREADS
    timeout -s INT ${SCAN_S:-120} python3 tools/prompt_scan_bench.py "$OUT/prompt_scan_bench.json" \
      --lengths ${SCAN_LENGTHS:-256,2048} 2>&1 | grep -v "^ " | tail -20
    timeout -s INT ${PROBE_S:-120} python3 tools/replay_prefill_probe.py "$OUT/prefill_kernel_probe.json" \
      --lengths 2048 --suffixes 48 --arms "torch scan,default,fused kernels" 2>&1 | tail -12
    for p in ${PROBE_FAMILIES:-}; do  # GDN / Mamba-1 layouts: their prompt kernels are opt-in
      timeout -s INT ${FAMILY_PROBE_S:-90} python3 tools/replay_prefill_probe.py \
        "$OUT/prefill_kernel_probe_$p.json" --preset $p --lengths 2048 --suffixes 48 \
        --arms "default,triton scan" 2>&1 | tail -8
    done
    for k in ${TTFT_ARMS-off on}; do  # TTFT_ARMS= skips the TTFT runs
      timeout -s INT ${TTFT_S:-70} python3 -m replaylab.bench prefix --engine --ttft --preset gpu \
        --shared-tokens 2000 --fused --prefill-kernels $k \
        --out "$OUT/bench_prefix_ttft_offgrid_prefill_${k}_gpu.json" 2>&1 | tail -5
    done ;;
  conv)  # issue 38: WHEELS=.whl-gpu2a (the stamp imports transformers), PREV: the tree before
    # kernels.conv joined the prompt path. The conv's host and device time per call
    # (tools/conv_host_probe.py), the kernel's and the prefix hits' GPU tests, then TTFT on
    # PREV and this tree (the ttft mode below)
    timeout -s INT ${PROBE_S:-60} python3 tools/conv_host_probe.py "$OUT/conv_host_probe.json" 2>&1 | tail -10
    export OMP_NUM_THREADS=1
    cmd="python3 -m pytest -q -rf -p no:cacheprovider -n ${TESTS_WORKERS:-6} --dist load tests/test_conv_kernel.py tests/test_engine_prefix.py tests/test_prefix_ttft.py tests/test_ssd_chunked_kernel.py"
    { stamp "$cmd"; timeout -s INT ${TESTS_S:-90} $cmd; } >"$OUT/gpu_conv_tests.log" 2>&1
    tail -4 "$OUT/gpu_conv_tests.log"
    unset OMP_NUM_THREADS
    TTFT_ROUNDS=${TTFT_ROUNDS:-1} PROFILE_S=${PROFILE_S:-0} bash "$0" ttft ;;
  ttft)  # issue 38: TTFT off the grid on the previous tree (PREV: a folder holding its replaylab/
    # and kernels/; name it in run's carry where git ignores it, as .prev) and this one in turn
    # (TTFT_ROUNDS; the previous tree first in odd rounds, this one in even), fused path with
    # the prompt kernels; then this tree's cold and hit admissions under torch.profiler and
    # cProfile (tools/prefill_profile.py)
    for round in $(seq ${TTFT_ROUNDS:-2}); do
      order="previous this"; [ $((round % 2)) = 0 ] && order="this previous"
      for tree in $order; do
        path=$PWD; commit=${COMMIT:-}
        [ $tree = previous ] && { path=$PWD/${PREV:?a folder with the previous tree}; commit=${PREV_COMMIT:-}; }
        REPLAYLAB_COMMIT=$commit PYTHONPATH=/tmp/site:$path timeout -s INT ${TTFT_S:-60} python3 -P -m replaylab.bench \
          prefix --engine --ttft --preset gpu --shared-tokens 2000 --fused --prefill-kernels on \
          --strategies ${TTFT_STRATEGIES:-replay,snapshot} --out "$OUT/ttft_${tree}_$round.json" 2>&1 | tail -3 | head -2
      done
    done
    [ "${PROFILE_S:-120}" = 0 ] || timeout -s INT ${PROFILE_S:-120} python3 tools/prefill_profile.py \
      "$OUT/prefill_profile.json" --fused --prefill-kernels on --hit 2000 --suffix 48 2>&1 \
      | grep -v "^  *[0-9.]* ms dev" | tail -60 ;;
  hit)  # issue 38: WHEELS=.whl-pin (the tests' packages beside the image's torch and triton),
    # PREV: the tree before the prefix hit's host trims. The prefill path's GPU tests, then the ttft mode's rounds and
    # profile (TTFT_ROUNDS=2: the previous tree first, then this one first)
    export OMP_NUM_THREADS=1
    cmd="python3 -m pytest -q -rf -p no:cacheprovider -n ${TESTS_WORKERS:-6} --dist load tests/test_engine_prefix.py tests/test_prefix_ttft.py tests/test_conv_kernel.py tests/test_engine_admission.py tests/test_prefill_host_trims.py tests/test_ssd_chunked_kernel.py tests/test_engine.py tests/test_engine_families.py"
    { stamp "$cmd"; timeout -s INT ${TESTS_S:-120} $cmd; } >"$OUT/gpu_hit_tests.log" 2>&1
    tail -4 "$OUT/gpu_hit_tests.log"
    unset OMP_NUM_THREADS
    TTFT_ROUNDS=${TTFT_ROUNDS:-2} bash "$0" ttft ;;
  ssd-speed)  # WHEELS=.whl-bench (mamba-ssm, its peer), PREV: the previous tree's folder:
    # the Mamba-2 prompt kernel's launches beside PREV's and mamba-ssm's, its GPU tests, then
    # TTFT on both trees (the ttft mode's rounds, TTFT_ROUNDS=1 by default here)
    timeout -s INT ${PROBE_S:-240} python3 tools/ssd_chunked_probe.py --speed \
      --previous "${PREV:?a folder with the previous tree}/kernels/ssd_chunked.py" \
      --out "$OUT/ssd_chunked_speed.json" 2>&1 | cut -c1-190 | tail -${PROBE_LINES:-56}
    export OMP_NUM_THREADS=1
    cmd="python3 -m pytest -q -rf -p no:cacheprovider -n 8 tests/test_ssd_chunked_kernel.py tests/test_engine_prefix.py"
    { stamp "$cmd"; timeout -s INT ${TESTS_S:-150} $cmd; } >"$OUT/gpu_ssd_tests.log" 2>&1
    tail -4 "$OUT/gpu_ssd_tests.log"
    unset OMP_NUM_THREADS
    TTFT_ROUNDS=${TTFT_ROUNDS:-1} PROFILE_S=0 bash "$0" ttft ;;
  mamba1)  # issue 37, Mamba-1: WHEELS=.whl-bench (mamba-ssm), PREV: the previous tree's folder:
    # the Mamba-1 kernel and engine GPU tests, the kernels beside selective_state_update, then
    # the Jamba-class engine on this tree (snapshot / recompute through state_update, replay,
    # mamba-ssm's update in the snapshot step) and on PREV (snapshot / recompute's token loop)
    export OMP_NUM_THREADS=1
    cmd="python3 -m pytest -q -rf -p no:cacheprovider -n 8 tests/test_mamba1_kernels.py tests/test_engine_family_kernels.py tests/test_bench_families.py"
    { stamp "$cmd"; timeout -s INT ${TESTS_S:-100} $cmd; } >"$OUT/gpu_mamba1_tests.log" 2>&1
    tail -4 "$OUT/gpu_mamba1_tests.log"
    unset OMP_NUM_THREADS
    timeout -s INT ${KERNELS_S:-80} python3 -c "import json; from replaylab.bench.mamba1_kernels import run, summary; r = run(Ls=(16,)); json.dump(r, open('$OUT/bench_mamba1_kernels.json', 'w'), indent=1, default=str); print(chr(10).join(summary(r)))" 2>&1 | tail -14
    fam="--presets jamba-1.5-mini-layers --batches ${M1_BATCHES:-8,32,128} --graphs on"
    for tree in ${M1_TREES:-this previous}; do
      path=$PWD; commit=${COMMIT:-}; extra="--strategies snapshot,recompute,replay --time-budget-s ${M1_THIS_S:-200}"
      [ $tree = previous ] && { path=$PWD/${PREV:?a folder with the previous tree}; commit=${PREV_COMMIT:-}; extra="--strategies snapshot,recompute --no-ssu --time-budget-s ${M1_PREV_S:-110}"; }
      REPLAYLAB_COMMIT=$commit PYTHONPATH=/tmp/site:$path timeout -s INT ${M1_TIMEOUT_S:-300} python3 -P -m replaylab.bench \
        engine-families $fam $extra --out "$OUT/bench_engine_families_jamba_${tree}.json" 2>&1 | tail -16
    done ;;
  snapshot-kernels)  # issue 37: WHEELS=.whl-gpu2 (the suite's set), FLA=.whl-fla (installed
    # beside, for the bench only): Qwen3.5- and Bamba-class snapshot through the state_update
    # kernels beside the token loop (--step-kernels off), replay and fla's recurrent step, all
    # on this tree; then the suite (SUITE_* as in the suite mode)
    python3 -m pip install -q --no-index --no-deps --target /tmp/site-fla ${FLA:-.whl-fla}/* >/dev/null 2>&1
    fam="--presets ${SK_PRESETS:-qwen3.5-9b-layers,bamba-9b-layers} --batches ${SK_BATCHES:-8,32,128} --graphs on --no-ssu"
    for arm in off on; do
      extra="--strategies snapshot --no-fla --step-kernels off --time-budget-s ${SK_OFF_S:-70}"
      [ $arm = on ] && extra="--strategies snapshot,replay --time-budget-s ${SK_ON_S:-150}"
      PYTHONPATH=/tmp/site:/tmp/site-fla:$PWD timeout -s INT ${SK_TIMEOUT_S:-240} python3 -m replaylab.bench \
        engine-families $fam $extra --out "$OUT/bench_engine_families_snapshot_kernels_$arm.json" 2>&1 | tail -14
    done
    bash "$0" suite ;;
  mamba2-pin)  # issue 37: WHEELS=.whl-gpu2, PREV: the previous tree's folder (Mamba-2's step
    # launch tuned per batch): the step-kernel and lossless GPU tests, then the Bamba-class
    # engine under snapshot, side by side in one call: the token loop (this tree,
    # --step-kernels off), state_update at the launch tuned per batch (PREV) and pinned (this)
    : "${PREV:?a folder with the previous tree, relative to this one}"
    export OMP_NUM_THREADS=1
    cmd="python3 -m pytest -q -rf -p no:cacheprovider -n ${TESTS_WORKERS:-12} --dist load tests/test_engine_families.py tests/test_engine_family_kernels.py tests/test_decode_kernels.py"
    { stamp "$cmd"; timeout -s INT ${TESTS_S:-200} $cmd; } >"$OUT/gpu_step_kernel_tests.log" 2>&1
    tail -6 "$OUT/gpu_step_kernel_tests.log"
    unset OMP_NUM_THREADS
    fam="--presets bamba-9b-layers --batches ${PIN_BATCHES:-8,32,128} --graphs on --strategies snapshot"
    for arm in token_loop tuned pinned; do
      path=$PWD; commit=${COMMIT:-}; extra="--fused on --time-budget-s ${PIN_S:-70}"
      [ $arm = token_loop ] && extra="--step-kernels off --time-budget-s ${PIN_S:-70}"
      [ $arm = tuned ] && { path=$PWD/$PREV; commit=${PREV_COMMIT:-}; }
      REPLAYLAB_COMMIT=$commit PYTHONPATH=/tmp/site:$path timeout -s INT ${PIN_TIMEOUT_S:-110} python3 -P -m replaylab.bench \
        engine-families $fam $extra --out "$OUT/bench_engine_families_bamba_step_${arm}.json" 2>&1 | tail -8
    done
    if [ -n "${PROFILE:-}" ]; then
      timeout -s INT ${PROFILE_S:-110} python3 tools/spec_round_profile.py \
        "$OUT/spec_round_profile_bamba_snapshot_b128.json" --preset bamba-9b-layers --batch 128 --strategy snapshot 2>&1 | tail -14
    fi ;;
  pin-check)  # issues 36/37: WHEELS=.whl-pin (the suite's set less transformers, to fit the
    # carry beside fla and PREV; the log's stamp then fails on the image's transformers),
    # FLA=.whl-fla, PREV: the tree before the pin. The batch-invariance GPU tests across batch 32, the matched
    # model's speculation with every slot busy on PREV and this tree, then the snapshot steps'
    # launch sweep (tools/step_launch_sweep.py)
    export OMP_NUM_THREADS=1
    cmd="python3 -m pytest -q -rf -p no:cacheprovider -n ${TESTS_WORKERS:-4} --dist load tests/test_decode_kernels.py -k do_not_depend"
    { stamp "$cmd"; timeout -s INT ${TESTS_S:-150} $cmd; } >"$OUT/gpu_batch_invariance_tests.log" 2>&1
    tail -6 "$OUT/gpu_batch_invariance_tests.log"
    unset OMP_NUM_THREADS
    for tree in previous this; do
      path=$PWD; commit=${COMMIT:-}
      [ $tree = previous ] && { path=$PWD/${PREV:?a folder with the previous tree}; commit=${PREV_COMMIT:-}; }
      REPLAYLAB_COMMIT=$commit PYTHONPATH=/tmp/site:$path timeout -s INT ${SPEC_S:-130} python3 -P -m replaylab.bench spec-steady \
        --preset matched --strategies ${SPEC_STRATEGIES:-snapshot,replay} --batches ${SPEC_BATCHES:-32,128} \
        --out "$OUT/bench_spec_steady_pin_${tree}.json" 2>&1 | tail -6
    done
    python3 -m pip install -q --no-index --no-deps --target /tmp/site-fla ${FLA:-.whl-fla}/* >/dev/null 2>&1
    PYTHONPATH=/tmp/site:/tmp/site-fla:$PWD timeout -s INT ${SWEEP_S:-150} python3 tools/step_launch_sweep.py "$OUT/step_launch_sweep.json" ${GDN_BUDGET_S:-80} 2>&1 | tail -14 ;;
  step-sweep)  # issue 37: WHEELS=.whl-gpu2, FLA=.whl-fla: the snapshot steps' launches
    # (tools/step_launch_sweep.py), then where a Bamba-class snapshot round's time goes at
    # batch 128 (tools/spec_round_profile.py --strategy snapshot)
    python3 -m pip install -q --no-index --no-deps --target /tmp/site-fla ${FLA:-.whl-fla}/* >/dev/null 2>&1
    PYTHONPATH=/tmp/site:/tmp/site-fla:$PWD timeout -s INT ${SWEEP_S:-200} python3 tools/step_launch_sweep.py "$OUT/step_launch_sweep.json" ${GDN_BUDGET_S:-120} 2>&1 | tail -14
    timeout -s INT ${PROFILE_S:-150} python3 tools/spec_round_profile.py "$OUT/spec_round_profile_bamba_snapshot_b128.json" \
      --preset bamba-9b-layers --batch ${PROFILE_BATCH:-128} --strategy snapshot 2>&1 | tail -14 ;;
  host)  # issue 36, item 2: a user's step + argmax loop over its graphs replayed alone, on the
    # previous tree (PREV: a folder holding its replaylab/ and kernels/) and this one, alternating
    for round in $(seq ${HOST_ROUNDS:-2}); do
      PYTHONPATH=/tmp/site:$PWD/${PREV:?a folder with the previous tree} timeout -s INT ${HOST_S:-60} \
        python3 tools/step_host_probe.py "$OUT/step_host_probe_previous_$round.json" \
        --label "previous (${PREV_COMMIT:-})" --batches ${HOST_BATCHES:-1,8,64,128,256} 2>&1 | tail -6
      timeout -s INT ${HOST_S:-60} python3 tools/step_host_probe.py "$OUT/step_host_probe_this_$round.json" \
        --label "this tree" --batches ${HOST_BATCHES:-1,8,64,128,256} 2>&1 | tail -6
    done ;;
  spec)  # issue 36 item 3 / issue 37: speculation on the previous tree (PREV) and this one, in
    # turn: the matched model with every slot busy (spec-steady; this tree also with replay's
    # ring of L + k), then Qwen3.5-class replay (engine-families)
    for tree in previous this; do
      # -P: python -m would put the working directory (this tree) before PYTHONPATH
      path=$PWD; commit=${COMMIT:-}
      [ $tree = previous ] && { path=$PWD/${PREV:?a folder with the previous tree}; commit=${PREV_COMMIT:-}; }
      for ring in L ${SPEC_RINGS-L+k}; do
        [ $tree = previous ] && [ $ring != L ] && continue
        REPLAYLAB_COMMIT=$commit PYTHONPATH=/tmp/site:$path timeout -s INT ${SPEC_S:-120} python3 -P -m replaylab.bench spec-steady \
          --preset matched --batches ${SPEC_BATCHES:-8,32,128} --ring $ring \
          --out "$OUT/bench_spec_steady_${tree}_ring_$ring.json" 2>&1 | tail -4
      done
      [ "${SPEC_FAMILIES:-1}" = 0 ] && continue  # SPEC_FAMILIES=0: the matched model only
      PYTHONPATH=/tmp/site:$path timeout -s INT ${SPEC_FAMILY_S:-120} python3 -P -m replaylab.bench engine-families \
        --presets qwen3.5-9b-layers --strategies replay --batches ${SPEC_BATCHES:-8,32,128} --graphs on \
        --no-fla --out "$OUT/bench_families_spec_$tree.json" 2>&1 | tail -8
    done ;;
  gdn-inputs)  # issue 37: the fused Gated DeltaNet layer with its one-launch inputs
    # (kernels/gdn_inputs.py) against the previous tree (PREV), Qwen3.5-class replay decode, in
    # turn; then this tree with speculation under every strategy (bf16 at real widths: equal
    # greedy?). Before any suite: a suite stopped by its limit leaves workers on the GPU
    for tree in previous this; do
      path=$PWD; commit=${COMMIT:-}
      [ $tree = previous ] && { path=$PWD/${PREV:?a folder with the previous tree}; commit=${PREV_COMMIT:-}; }
      REPLAYLAB_COMMIT=$commit PYTHONPATH=/tmp/site:$path timeout -s INT ${FAM_S:-90} python3 -P -m replaylab.bench \
        engine-families --presets qwen3.5-9b-layers --strategies replay --batches ${FAM_BATCHES:-8,32,64} \
        --graphs on --fused on --n-spec 0 --no-fla --out "$OUT/families_fused_gdn_$tree.json" 2>&1 | tail -6
    done
    timeout -s INT ${FAM_SPEC_S:-150} python3 -P -m replaylab.bench engine-families --presets qwen3.5-9b-layers \
      --strategies snapshot,recompute,replay --batches 32 --graphs on --fused on --no-fla \
      --out "$OUT/families_fused_gdn_spec_this.json" 2>&1 | tail -12 ;;
  suite)  # WHEELS=.whl-gpu2 (tools/gpu_suite_wheels.sh); pytest-xdist workers (SUITE_WORKERS, 8) stealing
    # tests from each other (SUITE_DIST; loadfile left test_decode_kernels.py, 5 minutes, as the tail)
    export OMP_NUM_THREADS=1  # many workers, one torch thread each (16 each swamp 16 cores)
    # the tests that read or run the notebooks: CPU content, with no notebook stack carried
    # (tools/gpu_suite_wheels.sh); SUITE_ARGS adds to these
    ignores=""
    for f in ${GPU_IGNORES:-test_browser test_book test_notebook_solutions test_notebook_scripts test_quiz test_caveats test_diagrams test_engine_data test_prefix_teaching test_static_figures test_widgets}; do
      ignores="$ignores --ignore=tests/$f.py"
    done
    cmd="python3 -m pytest tests -q -rf -p no:cacheprovider$ignores -n ${SUITE_WORKERS:-8} --dist ${SUITE_DIST:-worksteal} --durations=30 --junitxml=$OUT/gpu_tests.xml ${SUITE_ARGS:-}"
    { stamp "$cmd"; timeout -k 20 -s INT ${SUITE_S:-540} $cmd; } >"$OUT/gpu_tests.log" 2>&1
    tail -40 "$OUT/gpu_tests.log"
    gzip -9 -n "$OUT/gpu_tests.xml"  # data/ keeps junit reports gzipped (the carry's limit)
    cp "$(python3 -c 'import transformers.models.bamba.modeling_bamba as m; print(m.__file__)')" "$OUT/" ;;
esac
