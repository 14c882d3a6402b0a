"""An iteration's admissions in one prefill (``DecodeEngine(batched_admission=True)``).

Each prompt prefilled alone reads every weight once for itself. ``admit_many`` seats several
prompts at once and runs those of at most ``prefill_chunk`` tokens through
``serving.prefill.prefill_many``: their tokens concatenated for the embeddings, norms,
matrix products and MLPs, each prompt's conv, scan and attention on its own tokens. Every
product and row sum of such a prefill is row-invariant (``serving.invariant``), so a prompt's
logits and pools do not depend on the prompts beside it, and ``admit`` prefills a lone short
prompt the same way. On CPU that holds with one torch thread, where each row's product runs
alone and the sums go through Triton's interpreter (slow: the switch is meant for GPUs). A
longer prompt is prefilled alone, a chunk at a time, and the prefix cache's and interleaved
admissions keep torch's products.
"""

from __future__ import annotations

from replaylab.serving.checks import check_prompt
from replaylab.serving.prefill import prefill_many
from replaylab.serving.validate import given

__all__ = ["admit_many"]


def admit_many(engine, prompts):
    """``DecodeEngine.admit_many``: every prompt checked and the free slots counted before any
    slot changes; then each claims the lowest free slot, in order. Returns [(slot, the last
    logits (vocab,))]."""
    e = engine
    if not isinstance(prompts, (list, tuple)) or not prompts:
        raise ValueError(f"prompts: expected a non-empty list of prompts, got {given(prompts)}")
    prompts = [check_prompt(e, p, name=f"prompts[{i}]") for i, p in enumerate(prompts)]
    if len(prompts) > e.n_free:
        raise ValueError(
            f"prompts: {len(prompts)} prompts, {e.n_free} free slots (max_batch="
            f"{e.max_batch}, {e.batch} live, {len(e.prefilling)} prefilling): expected at "
            "most one prompt per free slot"
        )
    if not e.batched_admission:
        return [e.admit(p) for p in prompts]
    slots = []
    for _ in prompts:  # claimed, not yet live: the next claim takes the next free slot
        slots.append(e._claim())
        e.table.prefilling.add(slots[-1])
    short = [i for i, p in enumerate(prompts) if p.numel() <= e.prefill_chunk]
    logits = [None] * len(prompts)
    try:
        if short:
            together = [prompts[i].to(e.device) for i in short]
            for i, row in zip(short, prefill_many(e, [slots[i] for i in short], together)):
                logits[i] = row
        for i, p in enumerate(prompts):
            if logits[i] is None:
                logits[i] = e._prefill(slots[i], p.to(e.device))
    finally:
        for s in slots:
            e.table.prefilling.discard(s)
    for s, p in zip(slots, prompts):
        e._go_live(s, p.numel())
    return list(zip(slots, logits))
