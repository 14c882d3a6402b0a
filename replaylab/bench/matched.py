"""The lossless engine against mamba-ssm on the same weights (GPU): replaylab in mamba-ssm's
block layout, every mixer followed by an MLP ("M-M-*-M-", Nemotron-H 8B shapes), beside
mamba-ssm's ``MambaLMHeadModel`` whose gated MLPs hold the same bytes, decoded with
``generate(cg=True)``.

Per engine arm and batch: decode tokens/s (the user's loop of ``step`` + argmax, graphs
warmed, ``n_steps`` timed, median of ``repeats``; every arm's engine is built and warmed first,
then their timed runs take turns, so drift between runs hits the arms alike, and
``over_first_arm_paired_median`` is the median of each run over the first arm's run beside it)
and the two-term roofline share
max(bytes / copy bandwidth, FLOPs / matrix rate) over the step time, both rates measured in the
same run. The arms are the lossless default (``matmul="row_invariant"``, ``kernels.matmul``'s
sliced-K launches), the same product with the launch it replaced (``previous_launch_for``), and
cuBLAS (``matmul="torch"``, not row-invariant). Speculation rows (synthetic drafter, per-sequence
acceptance) give speculative tokens/s over plain decode, and whether every sequence's tokens
equal its greedy ones bit for bit; the strategy "replay-ring" is replay with a log ring of
L + k rows (``DecodeEngine(log_capacity=)``), whose rounds keep all k drafts before a fold.
"""

from __future__ import annotations

import statistics

import torch

from replaylab.bench.families import decode_seconds, timed_speculation
from replaylab.bench.serve import (
    admit_all,
    greedy_ragged,
    matrix_rate_tflops,
    matrix_weights,
    random_prompts,
)
from replaylab.model import PRESETS, HybridConfig, HybridLM
from replaylab.serving import DecodeEngine

__all__ = ["MATCHED", "run_matched", "matched_summary"]

# mamba-ssm's block layout at Nemotron-H 8B shapes: a relu2 MLP of 32,256 holds the bytes of
# mamba-ssm's gated MLP of 21,504 (2 x 32,256 = 3 x 21,504 rows of 4,096)
MATCHED = dict(PRESETS["8b-layers"], pattern="M-M-*-M-", intermediate_size=32256)
MAMBA_SSM_INTERMEDIATE = 21504

SPEC_STRATEGIES = ("replay", "snapshot", "recompute", "replay-ring")

ARMS = {  # name: (matmul, launch policy or None for the default)
    "row_invariant": ("row_invariant", None),
    "row_invariant_previous_launch": ("row_invariant", "previous"),
    "torch": ("torch", None),
}


def run_matched(
    batches=(1, 8, 64, 128, 256),
    n_steps=32,
    repeats=3,
    arms=tuple(ARMS),
    spec_batches=(1, 8, 32, 128),
    spec_strategies=("replay", "snapshot"),
    k=4,
    acceptance=0.8,
    log_length=16,
    mamba_ssm=True,
    config=None,
    device="cuda",
    progress=True,
    launches=None,
    drafter="list",
):
    """Every row of the module docstring; ``spec_batches`` are decoded too (plain decode is
    the denominator of each speculation row), speculated under the first of ``arms``. ``config`` (a dict of ``HybridConfig`` fields,
    default ``MATCHED``) and ``device="cpu"`` make a smoke run: no roofline, no peer.
    ``launches`` (a table from ``bench.matmul.best_launches``) replaces ``launch_for``'s
    launches in the row-invariant arm, and the previous-launch arm then runs ``launch_for``'s.
    ``drafter`` ("list", "batched" or "device") is ``timed_speculation``'s, or a tuple of
    them: the first gives the row's speculation, each other one its ``other_drafters`` entry,
    timed after it on the same engine."""
    drafters = (drafter,) if isinstance(drafter, str) else tuple(drafter)
    if "device" in drafters and (
        device != "cuda" or any(not s.startswith("replay") for s in spec_strategies)
    ):
        raise ValueError(
            f"drafter: 'device' rounds need replay with its kernels (a CUDA device, spec "
            f"strategies replay or replay-ring); got device={device!r}, spec_strategies="
            f"{tuple(spec_strategies)}"
        )
    from tqdm.auto import tqdm

    from replaylab.bench.matmul import table_policy
    from replaylab.bench.timing import copy_bandwidth_gbs
    from replaylab.costmodel import decode_step_bytes
    from replaylab.kernels.matmul import launch_for, previous_launch_for, use_launches

    for a in arms:
        if a not in ARMS:
            raise ValueError(f"arms: expected names of {tuple(ARMS)}, got {a!r}")
    for s in spec_strategies:
        if s not in SPEC_STRATEGIES:
            raise ValueError(f"spec_strategies: expected names of {SPEC_STRATEGIES}, got {s!r}")
    config = config or MATCHED
    cfg = HybridConfig(**config)
    cuda = device == "cuda"
    dtype = torch.bfloat16 if cuda else torch.float32
    model = HybridLM(cfg, seed=0).to(device, dtype).eval()
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    embed = model.model.embeddings.weight
    step_weights = weights - embed.numel() * embed.element_size()  # a step reads B rows of it
    bandwidth = max(copy_bandwidth_gbs() for _ in range(3)) * 1e9 if cuda else None
    rate = max(matrix_rate_tflops() for _ in range(3)) * 1e12 if cuda else None
    flops_per_token = 2 * matrix_weights(model)
    all_batches = sorted(set(batches) | set(spec_batches))
    max_len = 40 + log_length + 2 + n_steps * repeats + 2 * n_steps + k + 8

    def policy_of(arm):
        policy = ARMS[arm][1]
        if launches:  # the table against today's launches
            return launch_for if policy == "previous" else table_policy(launches)
        return previous_launch_for if policy == "previous" else None

    def warm_engine(arm, strategy, batch, prompts):
        with use_launches(policy_of(arm)):  # the graphs are captured under the arm's launches
            ring = {}
            if strategy == "replay-ring":  # spare rows for a whole verify: k, at most L
                ring = dict(log_capacity=log_length + min(k, log_length), max_verify=k + 1)
            engine = DecodeEngine(
                model, batch, max_len, strategy.removesuffix("-ring"), log_length,
                matmul=ARMS[arm][0], **ring,
            )  # fmt: skip
            tok = admit_all(engine, prompts).argmax(-1, keepdim=True)
            for _ in range(log_length + 2):  # capture both graphs (with and without a fold)
                tok = engine.step(tok, check=False)[:, -1].argmax(-1, keepdim=True)
        return engine, tok

    def decode_row(arm, strategy, batch, runs):
        steps_per_s = statistics.median(runs)
        context = 24 + log_length + 2 + n_steps * repeats // 2
        moved = decode_step_bytes(
            cfg, "replay" if strategy.startswith("replay") else "snapshot", batch, context,
            log_length, step_weights,
        )  # fmt: skip
        row = dict(arm=arm, strategy=strategy, batch=batch)
        row["decode_tokens_per_s"] = batch * steps_per_s
        row["decode_runs_tokens_per_s"] = [batch * r for r in runs]
        if cuda:
            byte_s, flop_s = moved / bandwidth, flops_per_token * batch / rate
            row["roofline"] = dict(
                bytes=moved,
                byte_seconds=byte_s,
                flop_seconds=flop_s,
                binds="bytes" if byte_s >= flop_s else "flops",
                share=max(byte_s, flop_s) * steps_per_s,
            )
        return row

    def speculation(row, engine, prompts):
        ref, _ = greedy_ragged(engine, prompts, 2 * n_steps)
        first, *others = drafters
        row.update(timed_speculation(engine, prompts, ref, k, acceptance, True, first))
        row["speculation_over_decode"] = (
            row["speculative_tokens_per_s"] / row["decode_tokens_per_s"]
        )
        for other in others:
            timed = timed_speculation(engine, prompts, ref, k, acceptance, True, other)
            timed["speculation_over_decode"] = (
                timed["speculative_tokens_per_s"] / row["decode_tokens_per_s"]
            )
            row.setdefault("other_drafters", {})[other] = timed

    def _engine_rows(strategy, batch):
        """The rows of one engine: its arms' decode in turn, then the first arm's speculation."""
        out = []
        prompts = random_prompts(batch, cfg.vocab_size, seed=7)
        arms_here = arms if strategy == "replay" else arms[:1]
        engines = {a: warm_engine(a, strategy, batch, prompts) for a in arms_here}
        runs = {a: [] for a in arms_here}
        for _ in range(repeats):  # the arms in turn, so drift between runs hits them alike
            for arm, (engine, tok) in engines.items():
                with use_launches(policy_of(arm)):
                    seconds, tok = decode_seconds(engine, tok, n_steps)
                engines[arm] = (engine, tok)
                runs[arm].append(1 / seconds)
        for arm in arms_here:
            row = decode_row(arm, strategy, batch, runs[arm])
            if arm != arms[0]:  # each run over the first arm's run beside it
                paired = [r / f for r, f in zip(runs[arm], runs[arms[0]])]
                row["over_first_arm_paired_median"] = statistics.median(paired)
            if arm == arms[0] and batch in spec_batches:
                with use_launches(policy_of(arm)):
                    speculation(row, engines[arm][0], prompts)
            out.append(row)
        del engines
        torch.cuda.empty_cache()
        return out

    rows = []
    jobs = [("replay", b) for b in all_batches]
    jobs += [(s, b) for s in spec_strategies if s != "replay" for b in spec_batches]
    try:  # a SIGINT (the device call's time limit) keeps the engines already done
        for strategy, batch in tqdm(jobs, desc="engines", disable=not progress):
            rows += _engine_rows(strategy, batch)
        stopped = None
    except KeyboardInterrupt:
        engines = len({(r["strategy"], r["batch"]) for r in rows})
        stopped = f"interrupted after {engines} of {len(jobs)} engines"
    peer = []
    peer_weights = None
    if mamba_ssm and cuda and not stopped:
        from replaylab.bench.engine import _mamba_ssm_baseline
        from replaylab.bench.peers import use_mamba_ssm_kernels_in_transformers

        if use_mamba_ssm_kernels_in_transformers():
            peer_cfg = HybridConfig(**dict(MATCHED, intermediate_size=MAMBA_SSM_INTERMEDIATE))
            peer, peer_weights = _mamba_ssm_baseline(peer_cfg, batches, n_steps, 32)
        else:
            peer = [dict(provider="mamba-ssm generate(cg=True)", error="mamba_ssm not importable")]
    return dict(
        kind="matched",
        stopped=stopped,
        config=config,
        weights_bytes=weights,
        mamba_ssm_weights_bytes=peer_weights,
        copy_bandwidth_gbs=bandwidth / 1e9 if cuda else None,
        matrix_rate_tflops=rate / 1e12 if cuda else None,
        n_steps=n_steps,
        repeats=repeats,
        k=k,
        acceptance=acceptance,
        log_length=log_length,
        launches={
            f"{n}x{k}": [dict(max_rows=bound, **l._asdict()) for bound, l in buckets]
            for (n, k), buckets in (launches or {}).items()
        },
        previous_launch="launch_for (TUNED)" if launches else "previous_launch_for",
        rows=rows,
        mamba_ssm=peer,
    )


def matched_summary(result):
    """Decode tokens/s per arm and batch beside mamba-ssm, then speculation over decode."""
    peer = {
        r["batch"]: r["batch"] / r["seconds_per_token"]["median"]
        for r in result["mamba_ssm"]
        if "seconds_per_token" in r
    }
    plain = [r for r in result["rows"] if r["strategy"] == "replay"]
    batches = sorted({r["batch"] for r in plain})
    lines = ["replay decode, tokens/s  " + "  ".join(f"{b:>8}" for b in batches)]
    for arm in dict.fromkeys(r["arm"] for r in plain):
        by = {r["batch"]: r for r in plain if r["arm"] == arm}
        lines.append(
            f"{arm[:24]:<24} " + "  ".join(f"{by[b]['decode_tokens_per_s']:8.0f}" for b in batches)
        )
    lines.append(
        f"{'mamba-ssm cg=True':<24} " + "  ".join(f"{peer.get(b, 0):8.0f}" for b in batches)
    )
    default = {r["batch"]: r for r in plain if r["arm"] == plain[0]["arm"]}
    torch_ = {r["batch"]: r for r in plain if r["arm"] == "torch"}
    lines.append(
        f"{'default / mamba-ssm':<24} "
        + "  ".join(
            f"{default[b]['decode_tokens_per_s'] / peer[b]:7.2f}x" if b in peer else "       -"
            for b in batches
        )
    )
    lines.append(
        f"{'default / torch':<24} "
        + "  ".join(
            f"{default[b]['decode_tokens_per_s'] / torch_[b]['decode_tokens_per_s']:7.2f}x"
            if b in torch_
            else "       -"
            for b in batches
        )
    )
    for arm in dict.fromkeys(r["arm"] for r in plain if "over_first_arm_paired_median" in r):
        by = {r["batch"]: r["over_first_arm_paired_median"] for r in plain if r["arm"] == arm}
        lines.append(
            f"{(arm + ' / first, paired')[:24]:<24} "
            + "  ".join(f"{by[b]:7.3f}x" if b in by else "       -" for b in batches)
        )
    if all("roofline" in default[b] for b in batches):
        lines.append(
            f"{'default roofline share':<24} "
            + "  ".join(f"{default[b]['roofline']['share']:8.0%}" for b in batches)
        )
    for r in result["rows"]:
        if "speculation_over_decode" in r:
            lines.append(
                f"speculation {r['strategy']:<8} batch {r['batch']:>3}: "
                f"{r['speculation_over_decode']:.2f}x decode, equal greedy "
                f"{r['speculative_equal_greedy']}, acceptance {r['measured_acceptance']:.2f}"
                f" ({r['drafter']})"
            )
            for name, o in r.get("other_drafters", {}).items():
                lines.append(
                    f"{'':>33}{o['speculation_over_decode']:.2f}x decode, equal greedy "
                    f"{o['speculative_equal_greedy']}, acceptance "
                    f"{o['measured_acceptance']:.2f} ({name})"
                )
    return lines
