"""Checks of notebook 09 (measuring) and of notebook 15 (the appendix of measurements): the
recurrent state's share of decode memory, recompute's restores at an acceptance (run live), and
replay's roofline floor over the copy bandwidth in ``data/bench_engine.json`` (the run the
check reads).

Glossary: share, ssm_state / (KV + state + conv state) of one sequence; floor, bytes per decode
step over the copy bandwidth.
"""

from __future__ import annotations

import torch

from replaylab.shapes import PUBLISHED_SHAPES, memory_per_sequence
from replaylab.teaching.exercises_common import _answer, _done, whole_number
from replaylab.teaching.grading import describe_exception, guarded


@guarded("state share at 64K tokens")
def check_state_share(answer, name="Falcon-H1 7B", context_len=65536) -> bool:
    """Notebook 09: the recurrent state's share of one sequence's decode memory (KV + state +
    conv state) for ``name`` at ``context_len`` tokens, and whether that share is "more" or
    "less" than Nemotron-H 8B's at the same length. ``answer``: (share, "more"|"less")."""

    def share(model_name):
        m = memory_per_sequence(PUBLISHED_SHAPES[model_name], context_len)
        return m["ssm_state"] / sum(m.values())

    ours, nemotron = share(name), share("Nemotron-H 8B")
    label = "state share at 64K tokens"
    if answer is None:
        return _done(label, False, "no answer yet (replace None with your answer)")
    try:
        value, word = answer
        value = float(value)
    except (TypeError, ValueError) as err:
        return _done(
            label,
            False,
            f"{answer!r}: expected a pair (share, 'more' or 'less'); {describe_exception(err)}",
        )
    wrong = []
    if abs(value - ours) > 5e-3 * ours:  # any rounding to three significant digits passes
        if abs(value - 100 * ours) <= ours:
            wrong.append("the share is a fraction of 1, not a percentage")
        else:
            wrong.append(
                f"the share: memory_per_sequence(shape, {context_len}): ssm_state over the sum "
                "of all three (to three significant digits)"
            )
    if not isinstance(word, str) or word.strip().lower() != ("more" if ours > nemotron else "less"):
        wrong.append("the word: compare with Nemotron-H 8B's share at the same length")
    return _done(label, not wrong, f"{answer!r}" + ("" if not wrong else " - " + "; ".join(wrong)))


@guarded("recompute at acceptance {acceptance}")
def check_recompute_at_acceptance(answer, model, prompt, n_new=48, acceptance=0.5) -> bool:
    """Notebook 09: speculative decoding (k=4) of ``prompt`` under recompute at the given
    acceptance: (restores, tokens re-run). The check runs it with SyntheticDrafter(seed=0)."""
    from replaylab.decoding import SyntheticDrafter, greedy, speculative

    reference = torch.cat([prompt, greedy(model, prompt, n_new).tokens], 1)
    run = speculative(
        model,
        prompt,
        n_new,
        SyntheticDrafter(reference, acceptance, seed=0),
        k=4,
        cache="recompute",
    )
    want = (run.restores, run.recomputed_tokens)
    got = None if answer is None else tuple(whole_number(v) for v in answer)
    if got is not None and None in got:
        return _done(f"recompute at acceptance {acceptance}", False, f"{answer!r}: expected counts")
    return _answer(
        f"recompute at acceptance {acceptance}",
        got,
        want,
        "run section 3's loop with SyntheticDrafter(reference, 0.5, seed=0)",
    )


def roofline_floor_ms(context_len=32768, batch=64, strategy="replay") -> float:
    """Notebook 15's roofline at another context: ms per decode step of Nemotron-H 8B (8.1e9
    bf16 parameters, L = 16, checkpoints every 16) over the engine run's copy bandwidth."""
    from replaylab import costmodel as cm
    from replaylab.results import load_bench
    from replaylab.shapes import PUBLISHED_SHAPES

    bw = load_bench("data/bench_engine.json")["copy_bandwidth_gbs"] * 1e9
    return 1e3 * cm.decode_floor_seconds(
        PUBLISHED_SHAPES["Nemotron-H 8B"],
        strategy,
        batch,
        bw,
        context_len=context_len,
        log_length=16,
        interval=16,
        weight_bytes=8.1e9 * 2,
    )


@guarded("replay's roofline floor at 32K context, batch 64")
def check_roofline_floor(answer) -> bool:
    """Notebook 15: replay's floor (ms per decode step) for Nemotron-H 8B at batch 64 and 32K
    tokens (32768) of context, as section 6 computes it at 8K."""
    return _answer(
        "replay's roofline floor at 32K context, batch 64",
        answer,
        roofline_floor_ms(),
        "section 6's cm.decode_floor_seconds with context_len=32768, batch 64, in ms",
        rel=5e-3,  # three significant digits
    )
