"""Draft acceptance: prompts cut from held-out files, and greedy speculative decoding with the
draft model and with prompt lookup, checked against plain greedy decoding."""

from __future__ import annotations

import torch
from tqdm.auto import tqdm


def heldout_prompts(texts: dict, tokenizer, n=16, context_chars=1500, max_tokens=256):
    """Prompts cut from held-out files, in name order: for each file, the text up to the end of
    the first ``def`` line (top level or in a class) at or after ``context_chars`` characters,
    without its newline (as the tokenizer saw such lines in training, the newline belongs to
    the next line's indentation), the last ``max_tokens`` tokens of it. The model then writes
    that function's body.
    Returns ``[(name, ids)]`` for the first ``n`` files that have such a line."""
    import re

    out = []
    for name in sorted(texts):
        text = texts[name]
        found = re.compile(r"^(    )?def .*:\n", re.M).search(text, context_chars)
        if found is None:
            continue
        ids = tokenizer.encode(text[: found.end() - 1]).ids[-max_tokens:]
        out.append((name, ids))
        if len(out) == n:
            break
    return out


@torch.no_grad()
def measure_acceptance(
    target,
    draft,
    prompts,
    n_new=64,
    k=4,
    strategy="replay",
    check_strategies=("snapshot", "recompute"),
    check_prompts=4,
    progress=False,
) -> dict:
    """Greedy speculative decoding of every prompt with the draft model and with prompt lookup
    (k drafts per round, verified greedily by ``target``) under ``strategy``, beside plain
    greedy decoding; the first ``check_prompts`` prompts again under each of
    ``check_strategies``. Returns accepted / proposed per drafter and strategy, whether every
    output equals greedy's tokens, and the greedy continuations (EOS not treated specially).
    ``prompts``: ``[(name, ids)]``."""
    from replaylab.decoding import ModelDrafter, PromptLookupDrafter, greedy, speculative

    device = next(target.parameters()).device
    rows, continuations = [], {}
    strategies = (strategy, *check_strategies)
    for i, (name, ids) in enumerate(tqdm(prompts, disable=not progress, desc="prompts")):
        prompt = torch.tensor([ids], device=device)
        ref = greedy(target, prompt, n_new, "snapshot").tokens
        continuations[name] = ref[0].tolist()
        for s in strategies if i < check_prompts else (strategy,):
            for drafter_name, drafter in (
                ("draft model", ModelDrafter(draft, s)),
                ("prompt lookup", PromptLookupDrafter()),
            ):
                run = speculative(target, prompt, n_new, drafter, k=k, cache=s)
                rows.append(
                    dict(
                        prompt=name,
                        strategy=s,
                        drafter=drafter_name,
                        proposed=run.proposed,
                        accepted=run.accepted,
                        identical=bool(torch.equal(run.tokens, ref)),
                    )
                )
    summary = {}
    for drafter_name in ("draft model", "prompt lookup"):
        for s in strategies:
            sel = [r for r in rows if r["drafter"] == drafter_name and r["strategy"] == s]
            proposed = sum(r["proposed"] for r in sel)
            accepted = sum(r["accepted"] for r in sel)
            summary[f"{drafter_name} / {s}"] = dict(
                prompts=len(sel),
                proposed=proposed,
                accepted=accepted,
                acceptance=accepted / proposed if proposed else float("nan"),
                identical_to_greedy=all(r["identical"] for r in sel),
            )
    return dict(
        k=k,
        n_new=n_new,
        prompts=len(prompts),
        summary=summary,
        rows=rows,
        greedy=continuations,
    )
