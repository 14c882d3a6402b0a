"""The trained pair of ``data/models`` speculating in the serving engine at several batches:
greedy decode, a ``decoding.ModelDrafter`` per sequence (the teaching cache's draft model) and
one ``serving.BatchModelDrafter`` (the draft model in its own replay engine, drafting every
sequence in k batched steps), side by side in one run on one device.

Per batch: B held-out prompts of ``prompt_tokens`` tokens (windows spread over
``data/models/heldout.txt.gz``), ``n_new`` tokens each. A row reports seconds per output token
(whole call: prefill, drafting, verify; median of ``repeats`` after one warm-up), acceptance
(accepted / proposed drafts over the batch), whether every sequence's tokens equal greedy's,
and for the batched drafter the draft engine's steps. On a GPU both engines run their CUDA
graphs; the per-sequence drafter runs the teaching cache step by step.

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
    log=print,
):  # fmt: skip
    """Rows per (batch, mode): mode "greedy", "per-sequence ModelDrafter" or
    "BatchModelDrafter" (see the module docstring). float32 on a CPU, bfloat16 on a GPU."""
    from replaylab.decoding import ModelDrafter
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

    def timed(run):
        times, out = [], None
        for i in range(repeats + 1):
            if device == "cuda":
                torch.cuda.synchronize()
            t0 = time.perf_counter()
            out = run()
            if device == "cuda":
                torch.cuda.synchronize()
            if i:
                times.append((time.perf_counter() - t0) / n_new)
        return out, spread(times)

    for B in batches:
        prompts = heldout_prompts(tokenizer, B, prompt_tokens).to(device)
        engine = DecodeEngine(target, B, max_len, "replay", log_length, max_verify=k + 1)
        drafts = DecodeEngine(draft, B, max_len, "replay", log_length, max_verify=k + 1)
        greedy, seconds = timed(lambda: engine.greedy(prompts, n_new))
        rows.append(dict(batch=B, mode="greedy", seconds_per_token=seconds))

        batched = BatchModelDrafter(drafts)

        def per_sequence():
            drafters = [ModelDrafter(draft, "replay") for _ in range(B)]
            pending = engine.prefill(prompts).argmax(-1)
            return engine.speculate_batch(list(prompts), pending, n_new, drafters, k)

        def one_batched():
            batched.reset()
            pending = engine.prefill(prompts).argmax(-1)
            return engine.speculate_batch(list(prompts), pending, n_new, batched, k)

        modes = {"per-sequence ModelDrafter": per_sequence, "BatchModelDrafter": one_batched}
        for mode, run in modes.items():
            (tokens, proposed, accepted), seconds = timed(run)
            same = all(torch.equal(t, g) for t, g in zip(tokens, greedy))
            row = dict(
                batch=B,
                mode=mode,
                k=k,
                seconds_per_token=seconds,
                acceptance=round(sum(accepted) / max(1, sum(proposed)), 4),
                proposed=sum(proposed),
                same_tokens_as_greedy=same,
            )
            if mode == "BatchModelDrafter":
                row["draft_engine_steps"] = batched.proposed_steps // (repeats + 1)
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
        rows=rows,
    )


def draft_model_summary(result) -> list[str]:
    """A markdown table: per batch and mode, ms per token, speedup over greedy, acceptance,
    tokens equal to greedy."""
    lines = [
        "| batch | mode | ms / token | over greedy | acceptance | equals greedy |",
        "|---|---|---|---|---|---|",
    ]
    base = {
        r["batch"]: r["seconds_per_token"]["median"]
        for r in result["rows"]
        if r["mode"] == "greedy"
    }
    for r in result["rows"]:
        s = r["seconds_per_token"]["median"]
        lines.append(
            f"| {r['batch']} | {r['mode']} | {s * 1e3:.2f} | {base[r['batch']] / s:.2f}x | "
            f"{r.get('acceptance', '-')} | {r.get('same_tokens_as_greedy', '-')} |"
        )
    return lines
