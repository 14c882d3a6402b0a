"""Speculation at serving batch sizes with no static-batch tail (issue 36): a ``Scheduler``
keeps every slot busy (a finished request's slot takes the next waiting one), so speculative
and plain decode are compared on the iterations where all ``batch`` slots run and nothing is
admitted, not on a fixed batch whose slower sequences finish alone.

Per strategy and batch, ``requests_per_slot * batch`` requests wait at time 0, each with a
random prompt and its own number of tokens (``n_new`` times a factor in [0.5, 1.5], so the
slots fall out of step). The plain run (k = 0) gives every request's greedy tokens; the
speculative run (k drafts a round from one ``BatchSyntheticDrafter``-style drafter proposing
those tokens, each right with probability ``acceptance``) must give them again, bit for bit
(with ``--ring L+k`` too: rows past the fold grid are computed from a folded scratch state).
Each run is warmed first (its CUDA graphs captured). Per run: ``steady_tokens_per_s``, the
tokens over the seconds of the full, admission-free iterations that captured no graph;
``tokens_per_s`` over the whole run; the share of time in steady iterations, and the seconds
of the iterations that admitted requests and that captured graphs.
"""

from __future__ import annotations

import statistics
from collections import Counter

import torch

from replaylab.bench.serve import random_prompts
from replaylab.serving import AdaptiveK, BatchSyntheticDrafter, DecodeEngine, Request, Scheduler
from replaylab.serving.validate import as_int

__all__ = [
    "run_spec_steady", "spec_steady_summary", "PromptKeyedDrafter", "model_for",
    "waiting_requests", "serve_all", "steady_timing",
]  # fmt: skip


class PromptKeyedDrafter:
    """A batched drafter for a scheduler's rows (engine slots, which change tenant): row g's
    request is found by its prompt (the first ``prompt_len[i]`` ids of its context), then
    ``BatchSyntheticDrafter`` proposes from that request's reference. ``references``: per
    request, its prompt then its greedy tokens; prompts must differ.

    Where the prompts' first m ids (m the shortest prompt) tell them apart, as random prompts'
    do, the rows are looked up at once by a hash of those ids, and a row's whole prompt is
    confirmed in one comparison the first round a request is seen in it and whenever its
    context is not longer than the round before (a context only grows while its request holds
    the row, and a new tenant starts over; a request search a row cost about 20 µs a row on
    the host each round, charged to speculation); else one by one."""

    def __init__(self, prompts, references, acceptance, seed=0):
        self.keys = {tuple(p.tolist()): i for i, p in enumerate(prompts)}
        self.lengths = sorted({p.numel() for p in prompts})
        clash = len(self.keys) != len(prompts) or any(
            tuple(p[:n].tolist()) in self.keys
            for p in prompts
            for n in self.lengths
            if n < p.numel()
        )
        if clash:
            raise ValueError("prompts: expected prompts none of which starts another one")
        self.inner = BatchSyntheticDrafter(references, acceptance, seed=seed)
        self.m = self.lengths[0]
        gen = torch.Generator().manual_seed(seed)
        self.weights = torch.randint(1, 2**31, (self.m,), generator=gen).numpy()
        keys = (torch.stack([p[: self.m] for p in prompts]).cpu().numpy() @ self.weights).tolist()
        self.by_key = dict(zip(keys, range(len(prompts)))) if len(set(keys)) == len(keys) else None
        self.prompt_len = torch.tensor([p.numel() for p in prompts])
        self.prompts = torch.zeros(len(prompts), self.lengths[-1], dtype=torch.long)
        for i, p in enumerate(prompts):
            self.prompts[i, : p.numel()] = p.cpu()
        self.confirmed = {}  # row -> (request, length) when its whole prompt was last seen

    def propose_batch(self, contexts, lengths, rows, k, vocab_size):
        if self.by_key is None or contexts.shape[1] < self.m:
            index = [self._request(c) for c in contexts]
        else:
            keys = (
                contexts[:, : self.m].cpu().numpy() @ self.weights
            ).tolist()  # numpy: no dispatch
            index = [self.by_key.get(key) for key in keys]
            if None in index:
                raise ValueError("context: its prompt is none of the drafter's requests")
            held, n = rows.tolist(), lengths.tolist()
            new = [  # a row seen with this request and a shorter context needs no new check
                g for g, (r, i) in enumerate(zip(held, index))
                if r not in self.confirmed or self.confirmed[r][0] != i
                or self.confirmed[r][1] >= n[g]
            ]  # fmt: skip
            if new and not self._starts_with_prompts(
                contexts[new], lengths[new], [index[g] for g in new]
            ):
                raise ValueError("context: its prompt is none of the drafter's requests")
            self.confirmed.update((r, (i, m)) for r, i, m in zip(held, index, n))
        return self.inner.propose_batch(contexts, lengths, torch.tensor(index), k, vocab_size)

    def _starts_with_prompts(self, contexts, lengths, index):
        """Whether row g holds request ``index[g]``'s whole prompt (one comparison)."""
        n = self.prompt_len[index]
        if bool((n > lengths).any()):
            return False
        width = min(contexts.shape[1], self.prompts.shape[1])
        inside = torch.arange(width) < n[:, None]
        return bool(((contexts[:, :width] == self.prompts[index, :width]) | ~inside).all())

    def _request(self, context):
        for n in self.lengths:
            i = self.keys.get(tuple(context[:n].tolist()))
            if i is not None:
                return i
        raise ValueError("context: its prompt is none of the drafter's requests")


def waiting_requests(prompts, lengths):
    """``Request`` i for prompt i ((n,) ids) and ``lengths[i]`` new tokens, all waiting at
    time 0."""
    return [Request(i, p, n, arrival=0.0) for i, (p, n) in enumerate(zip(prompts, lengths))]


def serve_all(engine, requests, k, drafter, adaptive_k=False):
    """Every request through a fresh scheduler; returns (requests in id order, history)."""
    sched = Scheduler(engine, k=k, drafter=drafter, adaptive_k=adaptive_k)
    sched.run(requests)
    return sorted(sched.finished, key=lambda r: r.id), sched.history


def steady_timing(history, batch):
    """The run's timings from its ``StepRecord`` s. Steady: every slot runs, nothing is
    admitted or prefilled and no CUDA graph is captured (``steady_captures``: iterations left
    out for a capture alone). ``admitting_s`` / ``capture_s``: seconds of the iterations that
    admitted requests (each also decodes) / captured graphs; an iteration may do both. Per
    width T of the steady iterations, the median ms of the iteration, of its engine step (the
    tokens' copy to the device, the step, argmax and the predictions' copy to the host:
    ``StepRecord.step_s``; before 621fa8f the tokens' copy was outside it) and of its
    rollback."""
    if not history or history[-1].end <= history[0].start:
        raise ValueError(
            f"history: expected the records of a run that took time, got {len(history)} "
            "records" + (f" from {history[0].start} to {history[-1].end}" if history else "")
        )
    full = [h for h in history if h.running == batch and not h.admitted and not h.prefilled]
    steady = [h for h in full if not h.captures]
    total_s = history[-1].end - history[0].start
    steady_s = sum(h.end - h.start for h in steady)
    return dict(
        seconds=total_s,
        tokens_per_s=sum(h.tokens for h in history) / total_s,
        steady_tokens_per_s=sum(h.tokens for h in steady) / steady_s if steady_s else None,
        steady_iterations=len(steady),
        steady_share=steady_s / total_s,
        iterations=len(history),
        steady_widths=dict(sorted(Counter(h.T for h in steady).items())),
        steady_captures=len(full) - len(steady),
        captures=sum(h.captures for h in history),
        capture_s=sum(h.end - h.start for h in history if h.captures),
        admitting_iterations=sum(bool(h.admitted) for h in history),
        admitting_s=sum(h.end - h.start for h in history if h.admitted),
        steady_ms_by_width=_medians_ms(steady, lambda h: h.end - h.start),
        steady_step_ms_by_width=_medians_ms(steady, lambda h: h.step_s),
        steady_rollback_ms_by_width=_medians_ms(steady, lambda h: h.rollback_s),
    )


def _timed(engine, prompts, lengths, warm, k, drafter, policy=False, warm_up=True):
    """Every request (prompt i, ``lengths[i]`` new tokens) with k drafts a round, after a
    warm-up of the first ``len(warm)`` prompts with ``warm`` new tokens (its CUDA graphs
    captured) -> (the requests in id order, the run's ``steady_timing``)."""
    batch = len(warm)
    if warm_up:
        serve_all(engine, waiting_requests(prompts[:batch], warm), k, drafter, policy)
    got, history = serve_all(engine, waiting_requests(prompts, lengths), k, drafter, policy)
    return got, steady_timing(history, batch)


def _same_tokens(got, plain):
    """Whether every request's tokens are its plain run's (both in id order)."""
    return all(s.tokens == p.tokens for s, p in zip(got, plain))


def _median_ratio(passes, label):
    """The median over ``passes`` of arm ``label``'s steady rate over the same pass's plain
    decode (None where a pass had no steady iterations)."""
    ratios = [
        p["steady_tokens_per_s"][label] / p["steady_tokens_per_s"]["plain"]
        for p in passes
        if p["steady_tokens_per_s"][label] and p["steady_tokens_per_s"]["plain"]
    ]
    return statistics.median(ratios) if ratios else None


def _medians_ms(records, seconds):
    """Width T -> the median of ``seconds(record)`` over ``records`` of that width, in ms."""
    by = {}
    for h in records:
        by.setdefault(h.T, []).append(seconds(h))
    return {T: 1e3 * statistics.median(v) for T, v in sorted(by.items())}


def model_for(preset, device):
    """The bench's model: "matched" (``bench.matched.MATCHED``, Nemotron-H 8B shapes in
    mamba-ssm's block layout) or a ``bench.families`` preset; bf16 on a GPU, fp32 on CPU."""
    from replaylab.bench.families import load_preset
    from replaylab.bench.matched import MATCHED
    from replaylab.model import HybridConfig, HybridLM

    cfg = HybridConfig(**MATCHED) if preset == "matched" else load_preset(preset)[1]
    dtype = torch.bfloat16 if torch.device(device).type == "cuda" else torch.float32
    return HybridLM(cfg, seed=0).to(device, dtype).eval()


def run_spec_steady(
    model,
    batches=(8, 32, 128),
    strategies=("replay",),
    k=4,
    acceptance=0.8,
    n_new=64,
    requests_per_slot=3,
    log_length=16,
    log_capacity=None,
    seed=7,
    progress=True,
    other_k=(),
    adaptive=False,
    repeats=1,
    batched_admission=False,
):
    """Rows per (strategy, batch): the plain and the speculative run's timings, their
    steady-state ratio and whether every request's speculative tokens equal its greedy
    ones. ``log_capacity``: replay's ring (None: L; "L+k": L + the largest k). Beside them,
    in the same process and on the same engine (its max_verify the largest k + 1), each row's
    ``arms``: speculation with each k of ``other_k``, and with ``adaptive`` the scheduler
    choosing each round's k in 0 .. k (``AdaptiveK.for_engine``; its policy warmed by the
    warm-up run, as a server's would be). ``repeats``: every arm, plain decode included,
    runs that many times on the engine, the order rotated each pass (``repeats``: each
    pass's steady rates; ``median_steady_over_decode``: per arm, the median over the passes
    of its rate over that pass's plain decode; the other fields are the first pass's). Only
    the first pass warms each arm; the adaptive arm's policy keeps what it learnt from pass
    to pass, as a server's would. ``batched_admission``: the engine's (``DecodeEngine``): the
    requests an iteration admits prefill in one pass."""
    from tqdm.auto import tqdm

    vocab = model.cfg.vocab_size
    k = as_int("k", k, low=1)
    repeats = as_int("repeats", repeats, low=1)
    other_k = [as_int(f"other_k[{i}]", j, low=1) for i, j in enumerate(other_k)]
    for i, j in enumerate(other_k):
        if j == k or j in other_k[:i]:
            raise ValueError(
                f"other_k[{i}]: {j} is {'k' if j == k else 'listed twice'}; expected each "
                f"other k once and none equal to k={k}"
            )
    k_top = max((k, *other_k))
    rows = []
    jobs = [(s, b) for s in strategies for b in batches]
    for strategy, batch in tqdm(jobs, desc="spec steady", disable=not progress):
        n = requests_per_slot * batch
        g = torch.Generator().manual_seed(seed + batch)
        lengths = (n_new * (0.5 + torch.rand(n, generator=g))).round().long().clamp(min=2)
        prompts = random_prompts(n, vocab, seed=seed + batch)
        ring = log_length + k_top if log_capacity == "L+k" else log_capacity
        kw = dict(log_capacity=ring) if strategy == "replay" else {}
        max_len = max(p.numel() for p in prompts) + int(lengths.max()) + k_top + 2
        engine = DecodeEngine(
            model, batch, max_len, strategy, log_length, max_verify=k_top + 1,
            batched_admission=batched_admission, **kw,
        )  # fmt: skip
        warm = [min(int(m), log_length + k_top + 2) for m in lengths[:batch]]
        run = (engine, prompts, lengths.tolist(), warm)
        plain, plain_timing = _timed(*run, 0, None)
        row = dict(strategy=strategy, batch=batch, requests=n, log_capacity=engine.capacity)
        row["plain"] = plain_timing
        references = [torch.cat([p, torch.tensor(r.tokens)]) for p, r in zip(prompts, plain)]
        drafter = PromptKeyedDrafter(prompts, references, acceptance, seed=seed)
        spec, row["speculative"] = _timed(*run, k, drafter)
        row["speculative_equal_greedy"] = _same_tokens(spec, plain)
        row["measured_acceptance"] = sum(r.accepted for r in spec) / max(
            1, sum(r.proposed for r in spec)
        )
        steady = row["plain"]["steady_tokens_per_s"], row["speculative"]["steady_tokens_per_s"]
        row["steady_speculation_over_decode"] = steady[1] / steady[0] if all(steady) else None
        row["speculation_over_decode"] = (
            row["speculative"]["tokens_per_s"] / row["plain"]["tokens_per_s"]
        )
        arms = [(f"k={j}", j, False) for j in other_k]
        arms += [(f"adaptive, k <= {k}", k, AdaptiveK.for_engine(engine, k))] if adaptive else []
        row["arms"] = {}
        for label, j, policy in arms:
            got, arm = _timed(*run, j, drafter, policy)
            row["arms"][label] = arm
            arm["equal_greedy"] = _same_tokens(got, plain)
            if arm["steady_tokens_per_s"] and steady[0]:
                arm["steady_over_decode"] = arm["steady_tokens_per_s"] / steady[0]
            if policy:
                arm["acceptance_estimate"] = policy.acceptance
        passes = [
            ("plain", 0, None, False), (f"k={k}", k, drafter, False),
            *[(label, j, drafter, policy) for label, j, policy in arms],
        ]  # fmt: skip
        first = {"plain": steady[0], f"k={k}": steady[1]}
        first.update({label: a["steady_tokens_per_s"] for label, a in row["arms"].items()})
        row["repeats"] = [dict(order=[p[0] for p in passes], steady_tokens_per_s=first)]
        for r in range(1, repeats):  # every arm again, the order rotated by one each pass
            order = passes[r % len(passes) :] + passes[: r % len(passes)]
            rates = {}
            for label, j, d, policy in order:
                got, timing = _timed(*run, j, d, policy, warm_up=False)
                rates[label] = timing["steady_tokens_per_s"]
                if not _same_tokens(got, plain):
                    row["repeats_equal_greedy"] = False
            row["repeats"].append(dict(order=[p[0] for p in order], steady_tokens_per_s=rates))
        row.setdefault("repeats_equal_greedy", True)
        row["median_steady_over_decode"] = {
            label: _median_ratio(row["repeats"], label) for label, *_ in passes[1:]
        }
        rows.append(row)
        del engine, run  # the pools go before the next batch's engine
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    return dict(
        kind="spec_steady", k=k, other_k=list(other_k), adaptive=adaptive, repeats=repeats,
        acceptance=acceptance, n_new=n_new, batched_admission=batched_admission,
        requests_per_slot=requests_per_slot, log_length=log_length, rows=rows,
    )  # fmt: skip


def spec_steady_summary(result):
    lines = []
    for r in result["rows"]:
        ratio = r["steady_speculation_over_decode"]
        lines.append(
            f"{r['strategy']:<8} batch {r['batch']:>4} (ring {r['log_capacity']}): steady "
            f"speculation / decode {ratio:.2f}x"
            if ratio
            else "steady: none"
        )
        lines[-1] += (
            f", whole run {r['speculation_over_decode']:.2f}x, acceptance "
            f"{r['measured_acceptance']:.2f}, equal greedy {r['speculative_equal_greedy']}"
        )
        if len(r.get("repeats", ())) > 1:
            lines[-1] += ", medians over {} passes: {}".format(
                len(r["repeats"]),
                ", ".join(f"{label} {v:.2f}x" for label, v in r["median_steady_over_decode"].items() if v),
            )  # fmt: skip
        plain, spec = r["plain"], r["speculative"]
        if "admitting_s" in plain:  # (not in files before the field)
            lines[-1] += ", time admitting: plain {:.0%}, k = {} {:.0%}".format(
                plain["admitting_s"] / plain["seconds"], result["k"],
                spec["admitting_s"] / spec["seconds"],
            )  # fmt: skip
        for label, arm in r.get("arms", {}).items():
            ratio = arm.get("steady_over_decode")
            lines.append(
                f"  {label}: steady / decode "
                + (f"{ratio:.2f}x" if ratio else "none")
                + f", widths {arm['steady_widths']}, equal greedy {arm['equal_greedy']}"
                + "".join(
                    f", ms a round of width {T}: {ms:.2f} (step {arm['steady_step_ms_by_width'][T]:.2f})"
                    for T, ms in arm.get("steady_ms_by_width", {}).items()
                )
            )
    return lines
