"""The trained pair of ``data/models`` speculating in the serving engine at several batches:
greedy decode, a ``decoding.ModelDrafter`` per sequence (the teaching cache's draft model) and
one ``serving.BatchModelDrafter`` (the draft model in its own replay engine, drafting every
sequence in k batched steps), side by side in one run on one device, in two parts: a static
batch (``speculate_batch``: every sequence waits for the slowest) and a continuous stream
(a ``Scheduler``: a finished request's slot goes to the next).

Prompts: held-out windows of ``prompt_tokens`` tokens (spread over
``data/models/heldout.txt.gz``), ``n_new`` tokens each. A row reports output tokens/s (whole
run: prefill, drafting, verify; median of ``repeats`` after one warm-up), acceptance (accepted
/ proposed drafts), whether every sequence's tokens equal the decode row's, and for the batched
drafter the draft engine's steps per run. On a GPU both engines run their CUDA graphs; the
per-sequence drafter runs the teaching cache step by step.

Glossary: B batch, k drafts per round, L the engines' log length.
"""

from __future__ import annotations

import gzip
import time

import torch

from replaylab.bench.timing import spread

__all__ = ["run_draft_model_bench", "draft_model_summary"]


def heldout_prompts(tokenizer, batch, length):
    """``batch`` windows of ``length`` tokens spread evenly over the held-out text (the i-th
    starts at i / batch of it), (batch, length)."""
    from replaylab.results import DATA_DIR

    text = gzip.open(DATA_DIR / "models" / "heldout.txt.gz", "rt").read()
    ids = torch.tensor(tokenizer.encode(text).ids)
    starts = torch.arange(batch) * ((ids.numel() - length) // batch)
    return torch.stack([ids[s : s + length] for s in starts.tolist()])


def run_draft_model_bench(
    device="cpu", batches=(1, 8), n_new=48, k=4, prompt_tokens=64, log_length=16, repeats=3,
    stream_factor=4, log=print,
):  # fmt: skip
    """Rows per (batch, part, mode). Part "static": B sequences through ``speculate_batch``
    (or ``greedy``), every sequence waiting for the slowest; part "continuous": ``stream_factor``
    x B requests through a ``Scheduler`` with at most B running, a finished request's slot
    taken by the next (no static-batch tail). Modes: "decode", "ModelDrafter" (one per
    sequence) and "BatchModelDrafter". float32 on a CPU, bfloat16 on a GPU."""
    from replaylab.generate import load_checkpoint, load_tokenizer
    from replaylab.results import DATA_DIR
    from replaylab.serving import BatchModelDrafter, DecodeEngine

    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    root = DATA_DIR / "models"
    target = load_checkpoint(root / "replaylab-code-10m", device=device, dtype=dtype)
    draft = load_checkpoint(root / "replaylab-code-draft", device=device, dtype=dtype)
    tokenizer = load_tokenizer(root / "replaylab-code-10m")
    max_len = prompt_tokens + n_new + k + 2
    rows = []

    def timed(run, tokens):
        """(the last run's result, tokens/s per timed run as ``spread``)."""
        rates, out = [], None
        for i in range(repeats + 1):
            if device == "cuda":
                torch.cuda.synchronize()
            t0 = time.perf_counter()
            out = run()
            if device == "cuda":
                torch.cuda.synchronize()
            if i:
                rates.append(tokens / (time.perf_counter() - t0))
        return out, spread(rates)

    for B in batches:
        engine = DecodeEngine(target, B, max_len, "replay", log_length, max_verify=k + 1)
        batched = BatchModelDrafter(
            DecodeEngine(draft, B, max_len, "replay", log_length, max_verify=k + 1)
        )
        static = heldout_prompts(tokenizer, B, prompt_tokens).to(device)
        stream = heldout_prompts(tokenizer, stream_factor * B, prompt_tokens).to(device)
        for part, prompts in (("static", static), ("continuous", stream)):
            runner = _static if part == "static" else _continuous
            reference = None
            for mode in ("decode", "ModelDrafter", "BatchModelDrafter"):
                batched.reset()
                steps = batched.engine.stats.steps
                run = runner(engine, prompts, n_new, k, mode, draft, batched, B)
                (tokens, proposed, accepted), rate = timed(run, len(prompts) * n_new)
                row = dict(batch=B, part=part, mode=mode, requests=len(prompts), k=k)
                row["tokens_per_s"] = rate
                if mode == "decode":
                    reference = tokens
                else:
                    row.update(
                        acceptance=round(accepted / max(1, proposed), 4),
                        proposed=proposed,
                        same_tokens_as_decode=all(
                            torch.equal(a, b) for a, b in zip(tokens, reference)
                        ),
                    )
                if mode == "BatchModelDrafter":
                    row["draft_steps_per_run"] = (batched.engine.stats.steps - steps) // (
                        repeats + 1
                    )
                rows.append(row)
        log(f"batch {B}: done")
    return dict(
        kind="draft-model",
        device=device,
        dtype=str(dtype).removeprefix("torch."),
        n_new=n_new,
        k=k,
        prompt_tokens=prompt_tokens,
        log_length=log_length,
        stream_factor=stream_factor,
        threads=torch.get_num_threads(),
        rows=rows,
    )


def _static(engine, prompts, n_new, k, mode, draft, batched, B):
    """A run of ``speculate_batch`` (``greedy`` for "decode") over ``prompts`` (B, T0):
    returns a function giving (tokens per sequence, proposed, accepted)."""
    from replaylab.decoding import ModelDrafter

    def run():
        if mode == "decode":
            return list(engine.greedy(prompts, n_new)), 0, 0
        if mode == "ModelDrafter":
            drafter = [ModelDrafter(draft, "replay") for _ in range(len(prompts))]
        else:
            batched.reset()
            drafter = batched
        pending = engine.prefill(prompts).argmax(-1)
        tokens, proposed, accepted = engine.speculate_batch(
            list(prompts), pending, n_new, drafter, k
        )
        return [t.cpu() for t in tokens], sum(proposed), sum(accepted)

    return run


def _continuous(engine, prompts, n_new, k, mode, draft, batched, B):
    """A run of a ``Scheduler`` over ``prompts`` (N, T0), all arriving at once, at most B
    running: returns a function giving (tokens per request in order, proposed, accepted)."""
    from replaylab.decoding import ModelDrafter
    from replaylab.serving import Request, Scheduler

    def run():
        for s in engine.slots:
            engine.retire(s)
        batched.reset()
        own = mode == "ModelDrafter"
        sched = Scheduler(
            engine,
            k=0 if mode == "decode" else k,
            max_running=B,
            drafter=batched if mode == "BatchModelDrafter" else None,
        )
        requests = [
            Request(i, p, n_new, drafter=ModelDrafter(draft, "replay") if own else None)
            for i, p in enumerate(prompts)
        ]
        done = sorted(sched.run(requests), key=lambda r: r.id)
        tokens = [torch.tensor(r.tokens) for r in done]
        return tokens, sum(r.proposed for r in done), sum(r.accepted for r in done)

    return run


def draft_model_summary(result) -> list[str]:
    """A markdown table: per batch, part and mode, tokens/s, over the part's decode row,
    acceptance, tokens equal to decode's."""
    lines = [
        "| batch | part | mode | tokens/s | over decode | acceptance | equals decode |",
        "|---|---|---|---|---|---|---|",
    ]
    base = {
        (r["batch"], r["part"]): r["tokens_per_s"]["median"]
        for r in result["rows"]
        if r["mode"] == "decode"
    }
    for r in result["rows"]:
        rate = r["tokens_per_s"]["median"]
        lines.append(
            f"| {r['batch']} | {r['part']} | {r['mode']} | {rate:,.0f} | "
            f"{rate / base[(r['batch'], r['part'])]:.2f}x | {r.get('acceptance', '-')} | "
            f"{r.get('same_tokens_as_decode', '-')} |"
        )
    return lines
