# %% [markdown]
# # 00 · Tour
#
# ## What this sequence covers
# Hybrid language models interleave attention layers (a KV cache that grows per token and can be
# cut anywhere) with state-space layers (a fixed-size state that every token overwrites).
# Branching workloads — speculative decoding, beam search, best-of-n, tree search — need to go
# back to earlier positions, which the state cannot do by itself. The notebooks build the
# mechanism from the recurrence up and measure three ways out: **snapshot** (copy states),
# **recompute** (re-run the model from checkpoints), **replay** (keep one checkpoint and a log of
# scan inputs, and *fold* the log on demand: apply the recurrence to the checkpoint over the
# logged inputs; the terms are defined under **Notation and terms** below). The tree-search demo is in **03, section 3c**.
#
# | notebook | question | minutes |
# |---|---|---|
# | 00 Tour | what is here, and which path do I take? | 35 |
# | 01 The two memories | why is the recurrent state the awkward one? | 20 |
# | 02 The selective scan | what exactly is the state, and how is it computed? | 25 |
# | 03 Branching strategies | one cache API, three strategies: same tokens, what costs? | 50 |
# | 04 Snapshot | what do copies cost, and what should a budget evict? | 30 |
# | 05 Recompute vs replay | the same restore, different work | 50 |
# | 06 The replay kernel | the GPU kernel, built as a ladder of six Triton puzzles, and its H200 numbers | 125 |
# | 07 Speculative decoding | acceptance, draft length and rollback, predicted and measured | 25 |
# | 08 Intervals and budgets | the optimum interval, sequences per budget, live eviction | 30 |
# | 09 Measuring | what to measure when state storage changes (time per token, peak memory, rollback cost), live; replay's amortised kernel cost and the engine on an H200; where replay wins | 30 |
# | 10 The trained model | real text, a real draft model, real acceptance | 30 |
# | 11 Beyond Mamba-2 | Mamba-1 and Gated DeltaNet under the same strategies | 85 |
# | 12 Recap | an auto-graded quiz over 01-11; where to go next in vLLM and SGLang | 85 |
# | 13 Serving | how does a server batch requests that come and go, under one byte budget? | 100 |
# | 14 Prefix caching | why does a hybrid's prefix cache miss where a transformer's hits, and how does replay resume anywhere? | 100 |
# | 15 Appendix: reading the measurements | *optional, after the sequence:* the rest of the H200 runs read in depth (provenance, the teaching path, fusion, concurrency, the cost model's floor, the caveats, a roofline) | 50 |
# | **total** | | **870 (14 h 30 min)** |
#
# **How the minutes were set.** Executing a notebook is the small part: every one runs top to
# bottom in seconds on a 2-core CPU (timed with `jupyter nbconvert --to notebook --execute`, one
# notebook at a time; `notebooks/INSTRUCTORS.md` has the measurements and the date). The minutes
# are reading the text and code at a steady pace plus the exercises (about 5 minutes for a
# question with one answer, 10-15 for writing a store, a kernel or a fold), rounded up to 5. The whole
# sequence, a three-day workshop and two shorter paths (3 hours, 1 day) with set-up and breaks:
# **Time budgets and two short paths** below.
#
# **Time:** about 35 minutes (this notebook).
#
# ## Time budgets and two short paths
#
# The minutes in the table are the whole sequence: **870 minutes of reading and exercises (14 h 30
# min)**, a three-day workshop (day 1: 00-06, 335 minutes; day 2: 07-12, 285 minutes; day 3: 13-14, 200 minutes; the appendix,
# 15, 50 minutes, optional) before set-up and breaks. Two shorter paths through the same notebooks follow; each notebook's exercise text
# says which exercises a path skips (marked *optional*).
#
# **Set-up (both paths): 15 minutes, best done before the session.** `./run.sh lab` creates
# `.venv` (it downloads CPU torch and the packages, most of the time) and opens JupyterLab; then
# run this notebook's two code cells. An estimate, not a measurement: a slow network takes longer.
#
# ### The 3-hour path: the mechanism and the numbers
#
# | block | notebooks and sections | exercises | minutes |
# |---|---|---|---:|
# | set-up | as above | | 15 |
# | 1 | 00: *What this sequence covers* and the notation table (its terms return in blocks 5 and 7) | | 8 |
# | 2 | 01 sections 2 and 4: a state is overwritten; why branching hurts it | none (1-2 optional) | 6 |
# | 3 | 03: *The three strategies on one branching sequence*, sections 1 and 2, and the first two cells of section 4 (a layer's `scan` call, which block 4's exercise uses) | none (the rest of section 4 and 1-2 optional) | 9 |
# | 4 | 05 sections 1 and 3, the first paragraph of 4, then section 5 | **write the replay log** (section 5) | 26 |
# | break | | | 10 |
# | 5 | 06 section 1 (one read of the checkpoint) and section 5: its terms, one table and one sentence (5b, the measurements in depth, optional) | none (the puzzles and 1-3 optional) | 6 |
# | 6 | 07 sections 1 and 2: tokens per round; the explorer | none (1-2 optional) | 12 |
# | 7 | 09 section 4: the engine table and where replay wins (its kernel table repeats 06's) | none (1-2 optional) | 11 |
# | 8 | 12 section 1: the sequence in one page | the quiz optional | 4 |
# | | questions, discussion, slack (what the timed walk leaves of the 3 hours) | | 73 |
# | **total** | | | **180 (3 h)** |
#
# Optional on this path: 02, 04, 08, 10, 11, 13, 14 and the appendix 15 whole; 03's sections 2b, 3, 3b, 3c and 4 (but its first two cells); 05's
# sections 2 and 4; 06's sections 2 (the Triton puzzles), 3, 4 and 5b; every exercise but 05's replay log.
# The block minutes come from a timed walk of this path on 2026-12-04 (`notebooks/INSTRUCTORS.md`,
# *Short paths*, gives what was measured and the rule); the last row holds the rest of the three
# hours.
#
# ### The 1-day path: build every strategy, skip the later days' depth
#
# | time | notebooks and sections | exercises | minutes |
# |---|---|---|---:|
# | before | set-up | | 15 |
# | 9:00 | 00; 01; 02 | 01: 1-2; 02: 1 (2 optional) | 55 |
# | 9:55 | 03, every section | section 4, the snapshot store (1-2 optional) | 40 |
# | 10:35 | break | | 15 |
# | 10:50 | 04 sections 1-3 | none (section 4 and 1-2 optional) | 15 |
# | 11:05 | 05, every section | sections 4-5, the recompute store and the replay log; 1 (2 optional) | 45 |
# | 11:50 | lunch | | 60 |
# | 12:50 | 06 sections 1, 2 and 5 (3-4 optional) | puzzles 1, 2, 4 and 6 (3, 5 and 1-3 optional) | 65 |
# | 13:55 | 07, every section | 1 (2 optional) | 20 |
# | 14:15 | break | | 15 |
# | 14:30 | 09, every section | none (1-2 optional) | 25 |
# | 14:55 | 12, the quiz and where to go next | the quiz's 11 questions on this path (those on 08 and 11 optional), 5 minutes each | 70 |
# | 16:05 | questions, slack | | 10 |
# | 16:15 | end | | |
# | **total** | 335 minutes of notebooks, 90 of breaks and lunch, 15 of set-up, 10 of slack | | **450 (7 h 30 min)** |
#
# Optional on this path: 08, 10, 11, 13, 14 and the appendix 15 whole (the later days' material:
# intervals and budgets, the trained model, other layer families, serving, prefix caching, the
# measurements read in depth), and the parts named in the table.
#
# ## Learning objectives
#
# **00 Tour (35 min)**
# * Name the three strategies and the question each notebook answers.
# * Check the set-up: the library's modules import, and whether Triton kernels run through the
#   interpreter here.
# * Pick the set-up below (without or with a GPU) and a time budget (the whole sequence, 3 hours
#   or 1 day).
#
# **01 The two memories (20 min)**
# * Truncate, share and fork a KV cache, and say why each is bookkeeping.
# * Show that a recurrent state cannot go back without a copy, a re-run or a log.
# * Compute KV and state bytes per sequence for published hybrids, and how many tokens of KV one
#   state copy weighs.
#
# **02 The selective scan (25 min)**
# * Write the Mamba-2 step: decay, outer-product write, read-out, skip.
# * Check that step-by-step decoding equals the sequence scan bitwise, and that a scan resumed from
#   a checkpoint equals one pass.
# * Compare replaylab's scan with mamba-ssm's references and a float64 run.
#
# **03 Branching strategies (50 min)**
# * Run speculative decoding, beam search, best-of-n and tree search (tree search section) through
#   one cache API under snapshot, recompute and replay, with identical tokens.
# * Read what each strategy holds and how many tokens it re-runs when drafts are rejected.
# * Write a snapshot store for one Mamba-2 layer.
#
# **04 Snapshot (30 min)**
# * Measure what snapshots hold while speculating and how that grows with the draft length.
# * Compare LRU and cost-aware eviction under a byte budget.
# * Write the cost-aware eviction choice; compute one snapshot's bytes from the config.
#
# **05 Recompute vs replay (50 min)**
# * Measure restore work by distance from a checkpoint, for recompute and for replay.
# * Count one state against one log entry for Nemotron-H 8B and find the break-even log length.
# * Write a recompute store and a replay log for one Mamba-2 layer.
#
# **06 The replay kernel (125 min)**
# * Derive a new token's output from the checkpoint and the log with one read of the state.
# * Climb a ladder of six Triton kernels (copy, reduction, state update, output, fold, replay
#   step), each checked and scored by counted traffic, and timed where there is a GPU.
# * Read the H200 measurements and quote decode as step + fold(L)/L, not the step alone.
#
# **07 Speculative decoding (25 min)**
# * Compute tokens per round from the acceptance rate and the draft length.
# * Explore the predicted speedup and rollback cost of each strategy; set predictions beside a
#   live run and beside the trained draft model's acceptance.
#
# **08 Intervals and budgets (30 min)**
# * Compare a fixed checkpoint interval with Griewank's optimum at equal memory.
# * Count how many sequences each strategy fits in a memory budget.
# * Evict a kept state live and rebuild it exactly.
#
# **09 Measuring (30 min)**
# * Measure decode-only time per token, peak memory per sequence and what a rejected draft costs.
# * Read replay's kernel cost amortised (step + fold(L)/L) and the CUDA-graphed engine's tokens/s
#   and roofline fractions against the run's one copy bandwidth; say where replay wins, per
#   workload and batch.
# * Put a number on the first caveat: the state's share of a sequence's memory as attention grows.
#
# **10 The trained model (30 min)**
# * Read what training bought: held-out loss against a bigram baseline.
# * Compare prompt lookup's acceptance with a draft model's, and check the text is the same under
#   every strategy.
# * Write prompt lookup.
#
# **11 Beyond Mamba-2 (85 min)**
# * Compare the Mamba-2, Mamba-1 and Gated DeltaNet updates and how each gets outputs from one
#   read of a checkpoint.
# * Count state bytes against log-entry bytes at published shapes; find where Gated DeltaNet
#   replay stops paying.
# * Write the chunked (WY / UT) fold of a delta rule.
#
# **12 Recap (85 min)**
# * Answer an auto-graded quiz over 01-11 whose answers the library computes at grading time.
# * Map snapshot, recompute's interval, replay's log length, budgets and draft length onto what
#   vLLM and SGLang expose for hybrid models.
#
# **13 Serving (100 min)**
# * Step a ragged batch and roll each slot back by its own keep; write the rollback cursor.
# * Count what a slot holds per strategy; write the FCFS admission rule under one byte budget.
# * Serve a Poisson stream whose tokens equal each request alone; read time to first token, time
#   per output token, the sustainable rate and the speculation crossover.
# * Write a draft slot's provisional room, the choice of each round's k from measured round
#   times, and a round's accepted drafts in numpy.
#
# **14 Prefix caching (100 min)**
# * Say why a hybrid's prefix cache misses where a transformer's hits: KV rows at every token, a
#   recurrent state only where it was saved.
# * Write the radix-tree lookup over token ids on a block grid, and the state at any position
#   from a grid checkpoint and the logged inputs after it.
# * Serve four request workloads under replay, align (snapshot) and recompute, read each
#   request's hit report, and compare hit rates with an attention-only model's by block size
#   and byte budget.
# * Read a stream of requests under one byte budget on a GPU: how many requests each strategy
#   runs at once, and which bound of the objective stops each one's rate.
#
# **15 Appendix: reading the measurements, optional (50 min)**
# * Read each H200 run with its provenance and its own copy bandwidth: the teaching path, what
#   fusing the engine bought, token agreement, batched speculation, how many sequences fit, a
#   second shape.
# * Set the cost model's memory-bound floor beside the measured steps and explain the gaps.
# * Put numbers on the caveats (attention's share, log length, workload) and on a roofline for
#   Nemotron-H 8B.
#
# ## Two set-ups: without or with a GPU
#
# **Without a GPU (a laptop).** `./run.sh lab` sets up `.venv` (CPU torch) and opens this folder
# in JupyterLab; `./run.sh notebooks` executes everything and writes HTML to `build/html/`;
# `./run.sh test` runs the tests and these notebooks under nbval. Models are tiny and run on the
# CPU. `import replaylab` switches Triton's interpreter on (`TRITON_INTERPRET=1`) when there is no
# CUDA device, so the Triton kernels run as Python on CPU tensors, and notebook 06 can count the
# bytes your kernels load and store. The GPU numbers (06, the H200 preset of 07, 09, 12, 15) are read
# from `data/bench_*.json`, each printed with the device, date and command that made it.
# `python -m replaylab.bench kernels` refuses to run here and says where the committed results are.
#
# **With a GPU.** `TORCH_SPEC=torch ./run.sh lab` installs a CUDA build of torch instead. What
# changes, and only this:
# * `import replaylab` leaves the interpreter off, so Triton kernels compile for the GPU. In 06 the
#   puzzles' inputs are put on the GPU (`puzzles.make_case`): values are checked, traffic is not
#   counted (start Jupyter with `TRITON_INTERPRET=1` to count it again). 06's section 4 and the
#   check of its exercise 2 put their tensors on the same device (`exercises.kernel_device()`).
# * The notebooks' models and caches stay on the CPU (no cell moves them to the GPU), so the live
#   timings of 03, 05, 09 and 11 are still CPU timings. A replay cache uses the Triton kernels only
#   when its tensors are on a CUDA device (`strategies/replay.py`).
# * Live GPU numbers come from re-measuring; each command rewrites its file in `data/` and the
#   notebooks then show your measurements:
#   `python -m replaylab.bench kernels` (`data/bench_kernels.json`: 06, 09 section 4, 12, 15);
#   `replaylab bench sweep` (`data/bench_kernels_sweep.json`: 06's launch table);
#   `python -m replaylab.bench kernels --batches 1,32,128 --log-lens 16,64 --ts 4,8 --no-fold --out data/bench_kernels_verify.json` (06's verify kernel);
#   `python -m replaylab.bench decode --preset 8b-layers --batches 1,8,32,64 --n-new 64` (`data/bench_decode.json`: 15 section 2; the same with `--out data/bench_decode_hf_kernels.json` where transformers has mamba-ssm's kernels, 15's second run);
#   `python -m replaylab.bench engine` (`data/bench_engine.json`: 09's engine table, where replay
#   wins in 05, 06 and 09, the H200 preset's copy bandwidth in 07, 09 and 15, 12);
#   `python -m replaylab.bench serve --phases ragged` (`data/bench_serve_ragged.json`: where replay
#   wins with every slot at its own position, 05, 06, 09; 13).
#   Saved outputs of the cells that print measurements will then differ: re-execute the notebooks
#   before committing new results. Some runs 13 and 15 read (`bench spec-steady`, `bench
#   matched`, `bench matmul`) are kept per commit, the commit in the file's name (for example
#   `data/bench_spec_steady_k_n192_h100_a0f4d0b.json`): a new run writes a new file, and the
#   cell that reads the old one shows the old numbers until you change its path.

# %%
# NBVAL_CHECK_OUTPUT
import importlib
import os
import pkgutil

import torch

import replaylab
import replaylab.kernels

# every module of the library, the Triton kernels included (kernels/ is a folder without
# __init__.py, which walk_packages does not enter); an import that fails stops here, with its error
modules = [m.name for m in pkgutil.walk_packages(replaylab.__path__, "replaylab.")]
modules += [f"replaylab.kernels.{m.name}" for m in pkgutil.iter_modules(replaylab.kernels.__path__)]
modules = [m for m in modules if not any(part.startswith("_") for part in m.split("."))]
for name in modules:
    importlib.import_module(name)
print("every module imported, in:", ", ".join(sorted({m.split(".")[1] for m in modules})))

# %%
# NBVAL_IGNORE_OUTPUT
print("GPU:", torch.cuda.get_device_name() if torch.cuda.is_available() else "none (CPU only)")
print("torch", torch.__version__)
# what `import replaylab` set (on, only where there is no CUDA device), or what you set yourself
print("kernels run through Triton's interpreter here:", os.environ.get("TRITON_INTERPRET") == "1")


# %% [markdown]
# ## Notation and terms
#
# One symbol, one meaning, in every notebook (a subscript $t$ is a token position). The third
# column lists the notebooks whose text uses the symbol; `tests/test_notebook_scripts.py` parses
# this table and fails if a symbol turns up in another notebook's equations or if one of the
# meanings it replaced comes back.
#
# | symbol | meaning | notebooks |
# |---|---|---|
# | $t$, $s$, $u$ | token positions | all |
# | $p$ | a position to return to or resume at (05: $p = c + j$; 14: where a prefix match ends) | 05, 07, 14 |
# | $c$ | a checkpoint's position; $S_c$ the state kept there | 02-08, 11, 14 |
# | $j$ | tokens since the checkpoint that the current state has taken in: replay's cursor, the log entries folded | 02, 05, 11, 14 |
# | $k_{\mathrm{acc}}$ | the drafts accepted in one speculative round, $0 \le k_{\mathrm{acc}} \le k$ (a round keeps $k_{\mathrm{acc}} + 1$ tokens) | 03, 07, 08, 13 |
# | $S_t$ | the recurrent state after token $t$ | all |
# | $H, P, N, G$ | Mamba-2: heads, channels per head, state size, groups sharing $B, C$ | 01-09, 11, 13, 14 |
# | $x_t, B_t, C_t$ | scan inputs: $x_t \in \mathbb{R}^P$ per head, $B_t, C_t \in \mathbb{R}^N$ per group | 01-11, 14 |
# | $dt_t$, $\Delta_t$ | the raw step and its softplus, $\Delta_t = \operatorname{softplus}(dt_t + dt_{\mathrm{bias}})$ with a per-head bias (`dt_bias`) | 02-11, 14 |
# | $A$ | the decay rate (negative; per head in Mamba-2, per channel and state entry in Mamba-1) | 01-11, 14 |
# | $a_t$ | the decay of one token, $a_t = e^{\Delta_t A}$ | 02, 05, 06, 11 |
# | $D$ | the skip weight, $y_t = S_t C_t + D x_t$ | 02, 03, 06, 11 |
# | $d_{\mathrm{in}}$ | Mamba-1 (Jamba): channels of the layer; its state is $(d_{\mathrm{in}}, N)$ | 11 |
# | $W$ | the conv window: the last $d_{\mathrm{conv}} - 1$ inputs of each conv channel (`d_conv` in the config) | 13 |
# | $K, V$ | Gated DeltaNet: key and value widths; state $(H, K, V)$ (a KV cache's keys and values are written out, never $K$ and $V$) | 11 |
# | $q_t, k_t, v_t$; $\alpha_t, \beta_t$ | Gated DeltaNet: query, key, value vectors (always with their token's subscript); decay and step | 11 |
# | $M$ | the strictly lower-triangular matrix of the chunked WY / UT form, $(I + M)\,U = \dots$ | 11 |
# | $m$ | tokens per chunk in that form | 11 |
# | $L$ | replay's log length: the log is folded into a new checkpoint every $L$ tokens | 05-13, 15 |
# | $k$ | drafts per speculative round (verified with the pending token: $k+1$ tokens) | 03, 06, 07, 09, 11, 13, 15 |
# | $\alpha$ | (no subscript) the chance that a draft is accepted, once the drafts before it were | 07, 13 |
# | $T$ | tokens in one call (a verify step has $T = k + 1$) | 06, 09, 11, 13 |
# | $b$ | the batch: in a kernel, the sequence a program works on (program `(b, h)`: sequence $b$, head $h$); in a loop over measured runs, the batch size | 06, 09, 11, 15 |
# | $n_{\mathrm{blk}}$ | a prefix cache's block size: tokens per node of its tree (`block_size`) | 14 |
# | $g$ | a grid point of that cache, a multiple of $n_{\mathrm{blk}}$; $S_g$ the state kept there | 14 |
#
# Terms, each also defined where a notebook first uses it:
# * **snapshot / recompute / replay** — the three strategies: copy the state at each point you may
#   return to; keep sparse checkpoints and re-run the model from one; keep one checkpoint and a
#   *log* of each layer's scan inputs since it.
# * **fold** — replaying logged inputs into a state: $\mathrm{fold}(S_c, \mathrm{log}[:j])$ applies
#   the recurrence for the $j$ logged tokens to the checkpoint $S_c$ and gives $S_{c+j}$. A replay
#   cache folds its full log into a new checkpoint every $L$ tokens.
# * **amortised** — a cost spread over the steps that share it: replay's decode step costs
#   step + fold($L$)/$L$, since every $L$-th step must also fold.
# * **roofline** — the fastest a step can run: the bytes it must move over the measured copy
#   bandwidth (and its FLOPs over a matrix rate: the cost model's H200 preset takes the
#   datasheet's, labelled "datasheet" where it is printed; notebook 13 prints the rate one H200
#   run measured, `data/bench_serve_ragged.json`); a *roofline fraction* is that bound
#   over the measured time.
# * **CUDA graph** — a recorded sequence of GPU kernel launches replayed with one call, so the
#   host's per-launch cost (microseconds each) disappears from a decode step.
# * **`ssu`** — mamba-ssm's `selective_state_update`: the usual decode kernel, which reads and
#   writes the state every token; the baseline of 06 and 09.
# * **tf32x3** — a way to do fp32 matrix products on tensor cores: each operand is split into a
#   TF32 part and a remainder, and three TF32 products recover close to fp32 accuracy.

# %% [markdown]
# ## The library map
# * `scan` — reference selective scans (Mamba-2, Mamba-1), the oracle for everything else.
# * `model`, `mamba2`, `mamba1`, `gated_deltanet` — a hybrid LM mirroring transformers'
#   NemotronH, Bamba, Jamba, Qwen3-Next and Qwen3.5 (loads their weights); each layer family is a
#   mixer that owns its state spec.
# * `recurrent` — the recurrent-layer interface: what a layer's memory is and how it folds.
# * `replay_ops` — replay in plain PyTorch for the families without a Triton kernel (Mamba-1,
#   Gated DeltaNet): the fold and the outputs from the checkpoint.
# * `kv`, `cache`, `strategies` — the KV cache, the hybrid cache API, one module per state
#   strategy (snapshot, recompute, replay) behind one store interface.
# * `decoding` — greedy, speculative, beam, best-of-n, tree search, written against the cache.
# * `serving` — the fast path: preallocated pools and CUDA-graphed steps (`DecodeEngine`), `Request`,
#   `rollback_cursor`, `Scheduler` (continuous batching under one byte budget, FCFS).
# * `train`, `training` — the trained pair in `data/models/` (`replaylab train`): the recipe;
#   the corpus, tokenizer and training loop.
# * `prefix` — a prefix cache for the teaching cache: a tree of blocks holding KV, states and (replay)
#   logs, so a request resumes from a shared prefix at any position (`replaylab bench prefix`;
#   notebook 14).
# * `kernels` (`replaylab.kernels.mamba2`; `replaylab.kernels.mamba1` for Jamba's Mamba-1;
#   `replaylab.kernels.gdn` for Gated DeltaNet) — Triton `replay_step` and `fold`.
# * `costmodel` — analytic predictions.
# * `bench`, `results` — the benchmark harness (`replaylab bench ...`) and the committed GPU
#   results in `data/`.
# * `generate`, `cli` — `replaylab generate CHECKPOINT --prompt-ids ...`: speculative decoding of
#   transformers' NemotronH and Bamba checkpoints under any of the three strategies. Whether
#   transformers itself speculates on them depends on its version: up to 5.24
#   `generate(assistant_model=...)` refuses ("assisted generation is not supported with
#   stateful models"); from 5.25 (the version the project's lock pins) it accepts it and keeps
#   a recorded recurrent state per draft token (`LinearAttentionCacheLayerMixin
#   .activate_past_recording`, then `crop`), which is the snapshot strategy.
# * `hf` — `ReplayCache(model)`, `RecomputeCache(model)`: replay and recompute as transformers'
#   own cache layers, for its `generate` (notebook 10, section 6).
# * `shapes`, `families`, `checks`, `testing` (oracles for tests and notebooks), `validation` —
#   support.
# * `teaching` — what these notebooks run beside the library, never imported by it: the checks
#   (`exercises`, `exercises_families`, `exercises_text`, `exercises_serving`,
#   `exercises_prefix`), the Triton puzzles of 06 (`puzzles`), notebook 12's graded recap
#   (`quiz`), the interactive explorers (`widgets`), live CPU measurements (`experiments`), and
#   the figures (`plotting`, `plotting_serving`, `plotting_prefix`, `diagrams`, `timeline`).
#
# ## References
# Each notebook lists its own. The public work this sequence builds on:
# * T. Dao, A. Gu, *Transformers are SSMs* (Mamba-2, 2024); A. Gu, T. Dao, *Mamba* (2023).
# * "ReplaySSM: Cache SSM Inputs, Not State" (Dao AI Lab with NVIDIA, 2026): replay of logged
#   scan inputs in vLLM; vLLM pull requests #48018, #49847 and #49887 add it.
# * A. Griewank, A. Walther, *Algorithm 799: revolve* (ACM TOMS, 2000): the optimal
#   checkpointing schedule for going back through a chain of states (notebook 08).
# * Marconi (MLSys 2025): which recurrent states a prefix cache should keep under a budget.
# * J. Wang et al., *The Mamba in the Llama* (2024): speculative decoding of hybrids by
#   recomputing accepted steps from cached inputs.
