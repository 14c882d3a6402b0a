# %% [markdown]
# # 12 · Recap: what to keep, what to re-run, what to replay
#
# ## Overview
# Eleven notebooks in one page, then a quiz. The quiz is graded by `replaylab.teaching.quiz`: every
# numeric answer is computed by the library **when you grade** (a config, the cost model, a live
# run of the tiny model, or the committed H200 measurements in `data/`), every multiple-choice key
# by a short derivation or a live count. Then a map from this package's knobs to what vLLM and
# SGLang expose for hybrid models.
#
# **You will**
# * restate, for each strategy, what it keeps and what going back costs;
# * compute state bytes, tokens per round, an amortised decode cost and a roofline fraction
#   with the library, as the notebooks did;
# * find in the measurements in `data/` the answer to a design question (which log length);
# * map snapshot / recompute / replay, budgets and draft length onto the options of vLLM and
#   SGLang.
#
# **Time:** about 85 minutes (the quiz's 14 questions about 70, where to go next 15).
#
# ## Prerequisites
# Notebooks 01-11. No GPU needed: the GPU numbers come from `data/`.

# %% [markdown]
# ## Setup

# %%
import torch

from replaylab import costmodel as cm
from replaylab.teaching import quiz
from replaylab.bench.mamba2_kernels import amortised_decode
from replaylab.results import load_bench
from replaylab.shapes import PUBLISHED_SHAPES, memory_per_sequence, snapshot_in_kv_tokens

torch.manual_seed(0)
model, prompt = quiz.tiny_setup()  # the tiny hybrid of notebooks 03-09 and a fixed prompt

# %% [markdown]
# ## 1. The sequence in one page
#
# | notebook | what it showed |
# |---|---|
# | 01 | A KV cache is a list of rows: truncate, share, fork. A recurrent state is overwritten every token: going back needs a copy, a re-run or a log. |
# | 02 | The Mamba-2 step: decay, outer-product write, read-out, skip. Token by token equals the scan; a scan resumed from a checkpoint equals one pass. |
# | 03 | One cache API (`snapshot`, `restore`, `truncate_to`, `fork`, `reorder`) over three strategies; identical tokens, different bytes and re-runs. |
# | 04 | Snapshot pays in memory, one copy per draft position; a budget evicts copies, and the cost-aware policy evicts the one cheapest to rebuild. |
# | 05 | Recompute re-runs the whole model from its last checkpoint; replay folds only the SSM recurrences over logged inputs, a fraction of a state per token. |
# | 06 | A replay step reads the checkpoint once and writes no state; the fold writes it every L tokens. Decode cost is step + fold(L)/L. |
# | 07 | Tokens per round are 1 + Σ αⁱ; the strategy decides what a rejection costs. |
# | 08 | A fixed checkpoint interval against Griewank's optimum; how many sequences fit a memory budget; eviction never gives a wrong state. |
# | 09 | Measure decode only, memory per sequence, and the cost of a rejection; quote the GPU-busy and roofline fractions beside any throughput. |
# | 10 | A trained pair: real acceptance, prompt lookup, the same text under every strategy. |
# | 11 | Mamba-1 keeps the closed form elementwise; Gated DeltaNet gets one-read outputs by carrying the query backward through the log. |
#
# A few of those numbers again, computed here (none of them answers a quiz question):

# %%
# NBVAL_CHECK_OUTPUT
nemotron = PUBLISHED_SHAPES["Nemotron-H 8B"]
memory = memory_per_sequence(nemotron, 1)
print(f"Nemotron-H 8B: {memory['ssm_state'] / 2**20:.0f} MiB of fp32 state and "
      f"{memory['conv_state'] / 2**20:.1f} MiB of conv window per sequence; one copy of both "
      f"weighs as much as {snapshot_in_kv_tokens(nemotron):,.0f} tokens of KV cache")
print("tokens per round at alpha 0.8, k = 1, 2, 4, 8:",
      [round(1 + cm.expected_accepted(k, 0.8), 2) for k in (1, 2, 4, 8)])
bench = load_bench()
print(f"from data/bench_kernels.json ({bench['device']}, {bench['date'][:10]}):")
for r in amortised_decode(bench):
    if r["L"] == 16 and r["batch"] in (1, 32):
        print(f"  batch {r['batch']:3d}, L=16: replay decode (step + fold/L) is {r['speedup']:.2f}x "
              "selective_state_update")

# %% [markdown]
# ## 2. The quiz
#
# *Optional on the 3-hour path; on the 1-day path the questions on 08, 10 and 11 are optional.*
#
# The questions below cover notebooks 01-11. Numeric answers are numbers (`int` or `float`; floats are compared within a
# small relative tolerance), multiple-choice answers are letters (`"a"` to `"d"`). Compute what
# you like in the answers cell: the library, `data/`, the notebooks are all allowed; the grader
# computes every answer afresh when it runs.

# %%
# NBVAL_CHECK_OUTPUT
quiz.show_questions()

# %% [markdown]
# **Your turn.** Replace each `None` with your answer; run the grading cell below. The table shows
# your answer, whether it is right and a short explanation. Unanswered questions count as wrong.

# %% exercise="quiz_answers" tags=["exercise"]
answers = {
    "kv_vs_ssm": None,  # a letter
    "state_bytes": None,  # a number
    "scan_step": None,  # a number
    "what_is_kept": None,  # a letter
    "rerun_tokens": None,  # a number
    "one_read": None,  # a letter
    "best_log_length": None,  # a number
    "tokens_per_round": None,  # a number
    "interval_optimum": None,  # a number
    "eviction_choice": None,  # a letter
    "roofline_fraction": None,  # a number
    "gpu_busy": None,  # a letter
    "mamba1_entries": None,  # a number
    "delta_rule": None,  # a letter
}

# %%
graded = quiz.grade(answers)
graded

# %% [markdown]
# *Discussion* (model answers in `INSTRUCTORS.md` explain how each answer is computed): for the
# question you found hardest, which notebook cell would you re-run to see the answer move when you
# change one input (the batch, the acceptance, the log length)?

# %% [markdown]
# ## 3. Where to go next: the same knobs in vLLM and SGLang
#
# replaylab keeps its choices in one `CacheConfig`. Serving engines spread the same decisions over
# several options. The table maps each replaylab knob to the option we found for it, with the page
# checked; where we could not confirm an option name, the table says so. These projects move fast:
# check the current `--help` of the version you run.
#
# | replaylab | vLLM | SGLang |
# |---|---|---|
# | **snapshot** (a state copy per point you may return to) | Hybrid prefix caching keeps recurrent states at block boundaries: `enable_prefix_caching=True` with `--mamba-cache-mode` (`none`, `align`, `all`) ([automatic prefix caching](https://docs.vllm.ai/en/v0.30.0/features/automatic_prefix_caching/); the `MambaCacheMode` values in [`vllm.config.cache`](https://docs.vllm.ai/en/v0.16.0/api/vllm/config/cache/)). Its native Mamba-2 speculative path keeps one state per draft token, a snapshot per draft (as described in [vllm#49847](https://github.com/vllm-project/vllm/pull/49847)). | `MambaRadixCache` keeps states at radix-tree nodes beside the KV prefix tree ([sglang#11214](https://github.com/sgl-project/sglang/pull/11214); background in the [PyTorch blog on hybrid models in SGLang](https://pytorch.org/blog/hybrid-models-meet-sglang-more-than-full-attention)); how many state slots a running request holds is set by `--mamba-radix-cache-strategy` (e.g. `extra_buffer`, `extra_buffer_lazy`, `no_buffer`) ([hybrid model memory](https://docs.sglang.io/docs/advanced_features/hybrid_model_memory)); `--disable-radix-cache` turns prefix reuse off. |
# | **recompute**, `checkpoint_interval` | The Mamba block size is the spacing of kept states under `--mamba-cache-mode align`: a prefix hit resumes at a block boundary and the rest is recomputed; `--prefix-match-unit` and `--enable-mamba-fine-grained-prefix-cache` refine where a hit may land ([automatic prefix caching](https://docs.vllm.ai/en/v0.30.0/features/automatic_prefix_caching/)). `CacheConfig` refers to a `mamba_block_size` ([`vllm.config.cache`](https://docs.vllm.ai/en/stable/api/vllm/config/cache/)); its command-line spelling we did not confirm. | Not confirmed. A copy of SGLang's `python/sglang/srt/server_args.py` we could read has `mamba_track_interval` ("the interval to track the mamba state during decode", default 256), but we found it on no documentation page and could not tell which version that copy is. |
# | **replay**, `log_length` (L) | ReplaySSM for Mamba-2 decode was merged ([vllm#48018](https://github.com/vllm-project/vllm/pull/48018)); the name of its buffer-length option we could **not** confirm from what we could read. | `--enable-linear-replayssm` with `--linear-replayssm-cache-len` (the ring length L, default 16), for Gated DeltaNet / KDA decode ([sglang#28451](https://github.com/sgl-project/sglang/pull/28451)); it needs the `no_buffer` Mamba cache strategy, which an open issue reports hurts prefix reuse ([sglang#37834](https://github.com/sgl-project/sglang/issues/37834)). |
# | **state dtype** (replaylab's cost model counts fp32 state) | `mamba_cache_dtype` (the Mamba cache) and `mamba_ssm_cache_dtype` (the SSM state, which may differ), values `auto`, `float32`, `float16` ([`MambaDType`](https://docs.vllm.ai/en/v0.16.0/api/vllm/config/cache/); [mamba_utils](https://docs.vllm.ai/en/v0.11.2/api/vllm/model_executor/layers/mamba/mamba_utils/), [vllm#22928](https://github.com/vllm-project/vllm/pull/22928)). | `--mamba-ssm-dtype` (`float32`, `bfloat16`, `float16`; [sglang#10258](https://github.com/sgl-project/sglang/pull/10258), [sglang#18444](https://github.com/sgl-project/sglang/pull/18444)). |
# | **budgets and eviction** (`set_budget`, `eviction="lru"` / `"cost"`) | States and KV share one block pool sized by `gpu_memory_utilization` ([`vllm.config.cache`](https://docs.vllm.ai/en/stable/api/vllm/config/cache/)); the environment variable `VLLM_PREFIX_CACHE_RETENTION_INTERVAL` thins which Mamba snapshots prefix caching retains ([vllm#45845](https://github.com/vllm-project/vllm/pull/45845)). No cost-aware eviction option found. | Two pools fixed at start-up: `--mamba-full-memory-ratio` (state pool : KV pool) or `--max-mamba-cache-size` (state slots) ([hybrid model memory](https://docs.sglang.io/docs/advanced_features/hybrid_model_memory)). No cost-aware eviction option found. |
# | **speculative decoding**, draft length `k` | `speculative_config={"method": ..., "model": ..., "num_speculative_tokens": k}` ([speculative decoding](https://docs.vllm.ai/en/v0.8.2/_sources/features/spec_decode.md)). | `--speculative-algorithm` with `--speculative-num-steps`, `--speculative-eagle-topk`, `--speculative-num-draft-tokens` ([speculative decoding](https://docs.sglang.io/docs/advanced_features/speculative_decoding)). |
#
# What to take from the map:
# * Both engines' prefix caches are snapshot-like: they keep whole states at chosen positions and
#   recompute from the nearest one, which is recompute with an interval. Notebook 08's interval
#   trade-off and notebook 04's eviction question are the questions their block size, track
#   interval and pool ratio answer.
# * Replay reached both engines as a *decode* optimisation (one read, a flush every L steps).
#   Its other benefit in these notebooks, rollback as a cursor move for speculative decoding and
#   branches that share one checkpoint, depends on how each engine wires its speculative path.
# * Whatever you change, measure as notebook 09 does: decode-only time per token, memory per
#   sequence, the cost of a rejection, and the GPU-busy and roofline fractions.
#
# ## Summary
# * Snapshot keeps copies, recompute keeps checkpoints and re-runs the model, replay keeps one
#   checkpoint and a log of inputs; the tokens are the same, the bytes and the rollback work are
#   not.
# * Replay's decode step reads the checkpoint once and writes no state; its honest cost includes
#   fold(L)/L, and the best L is a measurement.
# * The same decisions appear in serving engines as prefix-cache modes, state dtypes, pool ratios
#   and speculative settings.
#
# ## References
# * ReplaySSM: cache SSM inputs, not state (Dao AI Lab with NVIDIA, 2026).
# * Griewank & Walther, *revolve* (2000); Marconi (2025) and SGLang's MambaRadixCache.
# * vLLM and SGLang documentation and pull requests, linked in the table above (checked on
#   2026-11-30).
