"""The recap quiz of notebook 12: a bank of questions over notebooks 01-11 and a grader.

Every question's correct answer is *computed when the quiz is graded*: numeric answers by the
library (a config, the cost model, a live run of the tiny model, the committed measurements in
``data/``), multiple-choice keys by a short derivation or a live count where one exists. A
changed library or a re-measured ``data/`` file moves the expected answers with it.

Glossary (code name -> meaning):
    Question        one question: ``id``, ``text``, ``kind`` ("number" or "choice"), the
                    ``choices`` of a multiple-choice question, ``compute`` (returns the correct
                    answer), ``how`` (one line: how ``compute`` gets it), ``explanation``
                    (shown after grading), ``rel`` (relative tolerance of a numeric answer)
    QUESTIONS       the bank, in the order the notebook asks them
    correct_answer  the computed answer of one question (cached per process)
    grade           {id: answer} -> ``Grade``; records one verdict per question with
                    ``replaylab.teaching.exercises.record`` (name ``"quiz <id>"``)
    tiny_setup      the model and prompt the live questions run on (notebook 12's setup)
"""

from __future__ import annotations

import html
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cache
from typing import Any

import torch

from replaylab.teaching import exercises
from replaylab.teaching.kernel_harness import count_traffic, interpreting

__all__ = [
    "Question",
    "QUESTIONS",
    "question",
    "correct_answer",
    "is_correct",
    "grade",
    "Grade",
    "show_questions",
    "tiny_setup",
    "TINY_CONFIG",
    "SCAN_CASE",
    "EVICTION_ITEMS",
]

TINY_CONFIG = dict(pattern="M*M-M-", ssm_heads=8, ssm_head_dim=16, d_state=64, n_groups=1)


@dataclass(frozen=True)
class Question:
    """One quiz question. ``compute()`` returns the correct answer: a number for
    ``kind="number"``, a choice letter for ``kind="choice"``."""

    id: str
    notebooks: str  # where the topic is taught, e.g. "05, 06"
    text: str
    kind: str  # "number" or "choice"
    compute: Callable[[], Any]
    how: str
    explanation: str
    choices: dict[str, str] = field(default_factory=dict)
    rel: float = 0.0  # relative tolerance for numbers; 0 means exact


def tiny_setup():
    """(model, prompt): the notebooks' tiny hybrid (pattern "M*M-M-": three Mamba-2 layers, one
    attention, two MLPs; seed 0) and a fixed 16-token prompt, the same on every call."""
    from replaylab.model import HybridConfig, HybridLM

    model = HybridLM(HybridConfig(**TINY_CONFIG), seed=0).eval()
    prompt = torch.randint(0, 128, (1, 16), generator=torch.Generator().manual_seed(0))
    return model, prompt


# --------------------------------------------------------------------------------------------
# How each answer is computed


def _layer_state_bytes():
    from replaylab.cache import HybridCache

    model, prompt = tiny_setup()
    cache_ = HybridCache(model, 1, "snapshot")
    with torch.no_grad():
        model(prompt[:, :4], cache_)
    return cache_.nbytes()["ssm_state"] // len(model.cfg.ssm_layers)


SCAN_CASE = dict(state=3.0, x=2.0, dt=0.5, A=-2.0, B=1.0, C=1.5, D=0.25)


def _scan_step_y():
    from replaylab.scan import ssd_step

    c = SCAN_CASE
    one = lambda v, *shape: torch.full(shape, float(v), dtype=torch.float64)  # noqa: E731
    y, _ = ssd_step(
        one(c["state"], 1, 1, 1, 1),
        one(c["x"], 1, 1, 1),
        one(c["dt"], 1, 1),
        one(c["A"], 1),
        one(c["B"], 1, 1, 1),
        one(c["C"], 1, 1, 1),
        one(c["D"], 1),
    )
    return float(y.reshape(-1)[0])


def _recompute_rerun_tokens():
    from replaylab.teaching.experiments import compare_strategies

    model, prompt = tiny_setup()
    rows = compare_strategies(
        model, prompt, n_new=24, acceptance=0.0, k=4, interval=8, strategies=("recompute",)
    )
    return int(rows[0]["recomputed_tokens"])


def _one_read_key():
    """Count the library's replay_step traffic under Triton's interpreter: the checkpoint read
    once and no state written is choice "b". Without the interpreter (compiled kernels on a
    GPU) traffic cannot be counted; the key then comes from the derivation (also "b")."""
    from replaylab.kernels.mamba2 import replay_step

    if not interpreting():
        return "b"
    g = torch.Generator().manual_seed(0)
    b, H, P, N, G, L = 2, 2, 4, 8, 1, 4
    r = lambda *s: torch.randn(*s, generator=g)  # noqa: E731
    lib = dict(
        states=r(b, H, P, N),
        slots=torch.arange(b, dtype=torch.int32),
        log_x=r(b, L, H, P),
        log_dt=r(b, L, H),
        log_B=r(b, L, G, N),
        log_C=r(b, L, G, N),
        log_len=torch.full((b,), L, dtype=torch.int32),
    )
    new = dict(x=r(b, 1, H, P), dt=r(b, 1, H), B=r(b, 1, G, N), C=r(b, 1, G, N))
    with count_traffic(states=lib["states"]) as traffic:
        replay_step(**lib, **new, A=-torch.rand(H, generator=g), append=False, check=False)
    reads, writes = traffic.times_read("states"), traffic.times_written("states")
    if math.isclose(reads, 1.0) and writes == 0:
        return "b"
    if math.isclose(reads, 1.0) and math.isclose(writes, 1.0):
        return "c"
    return "a" if reads > 1 else "d"


def _best_log_length(batch=128):
    from replaylab.results import amortised_decode, load_bench

    rows = [r for r in amortised_decode(load_bench()) if r["batch"] == batch]
    return min(rows, key=lambda r: r["amortised_us"])["L"]


def _tokens_per_round(k=5, alpha=0.7):
    from replaylab.costmodel import expected_accepted

    return 1 + expected_accepted(k, alpha)


def _optimum_steps_per_restore(n=64, interval=16):
    from replaylab.costmodel import interval_tradeoff, revolve_cost

    kept = interval_tradeoff(n, interval)["states_kept"]
    return revolve_cost(n, kept - 1) / n


def _eviction_items():
    from replaylab.strategies.base import EvictionItem

    # key, position, nbytes, last_used (larger = more recent)
    return [
        EvictionItem("copy@4", 4, 1, 2),
        EvictionItem("copy@10", 10, 1, 1),
        EvictionItem("copy@11", 11, 1, 4),
        EvictionItem("copy@20", 20, 1, 3),
    ]


def _eviction_key():
    from replaylab.cache import choose_victim

    victim = choose_victim(_eviction_items(), "cost")
    return next(letter for letter, item in zip("abcd", _eviction_items()) if item.key == victim)


def _replay_roofline(batch=64):
    from replaylab.results import load_bench

    eng = load_bench("data/bench_engine.json")
    row = next(
        r
        for r in eng["rows"]
        if r.get("preset") == "8b-layers"
        and r.get("strategy") == "replay"
        and r.get("provider") is None
        and "workload" not in r
        and r["batch"] == batch
    )
    step_seconds = row["seconds_per_token"]["median"]
    return row["bytes_per_step"] / (eng["copy_bandwidth_gbs"] * 1e9) / step_seconds


def _mamba1_state_in_entries():
    from replaylab.families import FAMILY_SHAPES, entry_bytes, state_bytes

    shape = next(s for s in FAMILY_SHAPES.values() if s.family == "mamba1")
    return state_bytes(shape) / sum(entry_bytes(shape).values())


def _fixed(key):
    """A conceptual question's key, fixed by the derivation its ``how`` names."""
    return lambda: key


# --------------------------------------------------------------------------------------------
# The bank

# the tolerance of the questions that say "Three significant digits are enough": any rounding
# of the answer to three significant digits is within it
SIGNIFICANT_3 = 5e-3


QUESTIONS: list[Question] = [
    Question(
        "kv_vs_ssm",
        "01",
        "A hybrid model has decoded up to position 10; a branch needs the model's memory at "
        "position 6. What does each kind of layer need?",
        "choice",
        _fixed("b"),
        "fixed key: the definitions of notebook 01, sections 1-2",
        "A KV cache keeps one row per position, so going back is dropping rows. A recurrent "
        "state is overwritten by every token: position 6's state exists only if it was copied, "
        "rebuilt by a re-run, or folded from a checkpoint plus logged inputs.",
        choices={
            "a": "Both can be cut back to position 6 by dropping what came after it.",
            "b": "The KV cache is cut back by dropping rows 6-9; the recurrent state needs a "
            "copy taken at 6, a re-run from an older state, or a fold of logged inputs.",
            "c": "The recurrent state is cut back by dropping entries; the KV cache needs a copy.",
            "d": "Neither can go back without re-running the model from the prompt.",
        },
    ),
    Question(
        "state_bytes",
        "01, 04",
        "In the tiny model of the notebooks (replaylab.teaching.quiz.tiny_setup(): HybridConfig "
        "with ssm_heads=8, ssm_head_dim=16, d_state=64, n_groups=1), how many bytes does ONE SSM "
        "layer's recurrent state take for one sequence? (The state is kept in fp32.)",
        "number",
        _layer_state_bytes,
        "a live HybridCache after a 4-token forward: nbytes()['ssm_state'] / number of SSM layers",
        "H x P x N values of 4 bytes. The conv window is separate (notebook 04 counts both).",
    ),
    Question(
        "scan_step",
        "02",
        "One Mamba-2 step with one head and P = N = 1: previous state S = 3, x = 2, Δ = dt = "
        "0.5 (already processed), A = -2, B = 1, C = 1.5, D = 0.25. What is the output y?"
        " Three significant digits are enough.",
        "number",
        _scan_step_y,
        "replaylab.scan.ssd_step on these values (float64)",
        "a = exp(Δ A); S' = a S + Δ x B; y = S' C + D x. The decay multiplies the old state, "
        "the input is written as an outer product, C reads the new state out.",
        rel=SIGNIFICANT_3,
    ),
    Question(
        "what_is_kept",
        "03",
        "What does each strategy keep so that it can go back to an earlier position?",
        "choice",
        _fixed("b"),
        "fixed key: replaylab/strategies/{snapshot,recompute,replay}.py",
        "Snapshot pays in memory (a copy per point it may return to), recompute in work (a "
        "re-run of the whole model from its last checkpoint), replay keeps one checkpoint and "
        "a log of inputs, a fraction of a state per token.",
        choices={
            "a": "snapshot: a checkpoint every interval; recompute: a copy of every state; "
            "replay: nothing, it re-runs the prompt.",
            "b": "snapshot: a copy of every state it may return to; recompute: a checkpoint "
            "every checkpoint_interval tokens and re-runs the model from it; replay: one "
            "checkpoint per SSM layer plus a log of that layer's scan inputs since it.",
            "c": "all three keep a copy per draft; they differ only in their kernels.",
            "d": "snapshot: a log of inputs; recompute: one checkpoint; replay: a copy per token.",
        },
    ),
    Question(
        "rerun_tokens",
        "03, 05",
        "On the tiny model with replaylab.teaching.quiz.tiny_setup()'s prompt, run "
        "compare_strategies(model, prompt, n_new=24, acceptance=0.0, k=4, interval=8, "
        "strategies=('recompute',)) (every draft rejected). How many tokens does recompute "
        "re-run through the model on its restores, in total?",
        "number",
        _recompute_rerun_tokens,
        "a live run of replaylab.teaching.experiments.compare_strategies; its 'recomputed_tokens'",
        "Every rejected round goes back to the round's start; recompute rebuilds that state by "
        "re-running the tokens since its last checkpoint through every layer. Snapshot (a copy) "
        "and replay (a cursor move in the log) re-run none.",
    ),
    Question(
        "one_read",
        "05, 06",
        "A replay decode step computes the new token's output from the checkpoint S_c and the "
        "L tokens logged since. What does it read and write of the recurrent state?",
        "choice",
        _one_read_key,
        "the library's replay_step traffic counted under Triton's interpreter "
        "(replaylab.teaching.puzzles.count_traffic); the derivation when kernels are compiled",
        "y_t = e^{cum_t} (S_c C_t) + a sum over logged x_s, B_s + D x_t: S_c is read once and "
        "no state is written; the token's inputs are appended to the log. The state is written "
        "only by a fold, once the log is full (or a branch needs its own copy).",
        choices={
            "a": "It reads S_c once per logged token (L times) and writes the new state.",
            "b": "It reads S_c once and writes no state; the new token's inputs go to the log.",
            "c": "It reads S_c once and writes the new state, like selective_state_update.",
            "d": "It reads no state: the output comes from the log alone.",
        },
    ),
    Question(
        "best_log_length",
        "06",
        "Replay's decode cost, counted honestly, is step + fold(L) / L: a full log forces a "
        "fold. From data/bench_kernels.json (H200), at batch 128, which measured log length L "
        "gives the lowest amortised cost per token?",
        "number",
        _best_log_length,
        "replaylab.bench.mamba2_kernels.amortised_decode(load_bench()): the batch-128 row with the "
        "smallest amortised_us",
        "A short log folds often (fold(L)/L is large); a long log makes every step read more "
        "entries. The optimum sits in between; quoting a step without its share of the fold "
        "overstates the gain.",
    ),
    Question(
        "tokens_per_round",
        "07",
        "Speculative decoding with k = 5 drafts, each accepted with probability 0.7 "
        "independently; a rejection ends the round. How many tokens does a round yield on "
        "average (accepted drafts plus the target's own token)?"
        " Three significant digits are enough.",
        "number",
        _tokens_per_round,
        "1 + replaylab.costmodel.expected_accepted(5, 0.7)",
        "Draft i counts only if drafts 1..i are all accepted: 1 + sum_{i=1..k} α^i. The terms "
        "shrink geometrically, so long drafts stop paying.",
        rel=SIGNIFICANT_3,
    ),
    Question(
        "interval_optimum",
        "08",
        "Visit all states of a 64-step chain in reverse. A checkpoint every 16 steps keeps 4 "
        "states. How many forward steps per restored state does the optimal schedule "
        "(Griewank's binomial checkpointing) need with as many states kept?"
        " Three significant digits are enough.",
        "number",
        _optimum_steps_per_restore,
        "revolve_cost(64, states_kept - 1) / 64 with states_kept from "
        "costmodel.interval_tradeoff(64, 16)",
        "The optimum places checkpoints on several nested levels; a fixed interval uses one. "
        "Compare with interval_tradeoff(64, 16)['steps_per_restore'] to see the gap.",
        rel=SIGNIFICANT_3,
    ),
    Question(
        "eviction_choice",
        "04, 08",
        "A byte budget forces one kept copy out. The kept copies "
        "(replaylab.teaching.quiz.EVICTION_ITEMS, each EvictionItem(key, position, nbytes, last_used); a larger last_used is more "
        "recent): "
        + ", ".join(
            f"{i.key} (position {i.position}, last used {i.last_used})" for i in _eviction_items()
        )
        + ". Which does the 'cost' policy evict?",
        "choice",
        _eviction_key,
        "replaylab.cache.choose_victim(EVICTION_ITEMS, 'cost')",
        "'cost' evicts the copy cheapest to rebuild: the fewest tokens back to the next older "
        "kept copy (from 0 if none), ties to the least recently used. LRU would evict the "
        "smallest last_used instead.",
        choices={"a": "copy@4", "b": "copy@10", "c": "copy@11", "d": "copy@20"},
    ),
    Question(
        "roofline_fraction",
        "09",
        "data/bench_engine.json, preset 8b-layers, the replay engine at batch 64: what "
        "fraction of the roofline does it reach? Roofline time = the bytes a step must move "
        "(bytes_per_step) / the copy bandwidth measured in the same run (copy_bandwidth_gbs); "
        "the fraction = roofline time / measured seconds per step."
        " Three significant digits are enough.",
        "number",
        _replay_roofline,
        "bytes_per_step / (copy_bandwidth_gbs x 1e9) / seconds_per_token['median'] of that row",
        "A fraction well below 1 says the step is not moving bytes as fast as the device can: "
        "launch overheads, small kernels or compute bind. Quote it beside any tokens/s.",
        rel=SIGNIFICANT_3,
    ),
    Question(
        "gpu_busy",
        "09",
        "Suppose torch.profiler shows the GPU busy only a quarter of the wall time while a "
        "Python decode loop runs at batch 1. What follows for an end-to-end tokens/s "
        "comparison of the strategies in that loop?",
        "choice",
        _fixed("b"),
        "fixed key: what a low GPU-busy fraction means (notebook 09, section 4)",
        "When the GPU waits for the host three quarters of the time, changing state traffic "
        "barely moves the wall clock. The engine (CUDA graphs over preallocated pools) removes "
        "the host from the loop; then the strategies' differences show.",
        choices={
            "a": "State traffic binds: replay's saving shows in full.",
            "b": "The host binds: the number says little about state storage until the loop "
            "runs as CUDA graphs over preallocated buffers.",
            "c": "The GPU is compute-bound: use larger batches to see the difference.",
            "d": "The roofline fraction is therefore a quarter as well.",
        },
    ),
    Question(
        "mamba1_entries",
        "11",
        "For the Mamba-1 layer shape in replaylab.families.FAMILY_SHAPES (Jamba), how many "
        "tokens of replay log (entries as replaylab logs them) cost as many bytes as one "
        "recurrent state?"
        " Three significant digits are enough.",
        "number",
        _mamba1_state_in_entries,
        "families.state_bytes(shape) / sum(families.entry_bytes(shape).values())",
        "With only N state entries per channel (16 at Jamba's shape), a Mamba-1 state is small "
        "against its inputs, so a log outgrows a snapshot after far fewer tokens than for "
        "Mamba-2 or Gated DeltaNet (families.byte_table() lists all three).",
        rel=SIGNIFICANT_3,
    ),
    Question(
        "delta_rule",
        "11",
        "Gated DeltaNet's transitions α_t (I − β_t k_t k_tᵀ) do not commute. How does replay "
        "still get a new token's output from one read of the checkpoint?",
        "choice",
        _fixed("c"),
        "fixed key: replaylab.scan.gdn_replay_outputs (notebook 11, section 2)",
        "The output is linear in the state, so the query can be carried backward through the "
        "log, O(L (K + V)) per head, and the checkpoint read once at the end. No K x K matrix "
        "is built and no state is written.",
        choices={
            "a": "It multiplies the L transition matrices together and applies the product.",
            "b": "It folds the log into a new state before every token.",
            "c": "It carries the query backward through the log, q ← α_s (q − β_s k_s (k_sᵀ q)), "
            "accumulating β_s (k_sᵀ q) v_s, then reads S_c once.",
            "d": "It cannot: delta-rule layers need snapshots.",
        },
    ),
]

EVICTION_ITEMS = _eviction_items()
_BY_ID = {q.id: q for q in QUESTIONS}
assert len(_BY_ID) == len(QUESTIONS), "duplicate question ids"


def question(qid: str) -> Question:
    """The question with id ``qid``."""
    return _BY_ID[qid]


@cache
def correct_answer(qid: str):
    """The computed correct answer of question ``qid`` (computed once per process)."""
    return question(qid).compute()


def is_correct(q: Question, answer, want=None) -> bool:
    """Whether ``answer`` answers ``q`` (against ``want``, by default its computed answer).
    Numbers compare within ``q.rel`` (exactly when it is 0); choices by letter, any case."""
    if answer is None or answer is Ellipsis:
        return False
    want = correct_answer(q.id) if want is None else want
    if q.kind == "choice":
        return isinstance(answer, str) and answer.strip().lower() == str(want).lower()
    if isinstance(answer, bool):
        return False
    try:
        value = float(answer)
    except (TypeError, ValueError):
        return False
    if q.rel == 0:
        return value == float(want)
    return abs(value - float(want)) <= q.rel * abs(float(want)) + 1e-12


def show_questions() -> None:
    """Print every question with its id, kind and choices (what the answers dict needs)."""
    for i, q in enumerate(QUESTIONS, 1):
        print(f"{i:2d}. [{q.id}] ({q.kind}; notebook {q.notebooks})")
        print(f"    {q.text}")
        for letter, text in q.choices.items():
            print(f"      {letter}) {text}")


@dataclass
class Grade:
    """The graded quiz: one row per question (id, question, your answer, correct, explanation)
    and the score. Shows as a table in a notebook."""

    rows: list[dict]

    @property
    def score(self) -> int:
        return sum(r["correct"] for r in self.rows)

    def __repr__(self):
        lines = [f"score: {self.score} / {len(self.rows)}"]
        for r in self.rows:
            mark = "correct" if r["correct"] else "not yet"
            lines.append(f"[{r['id']}] your answer: {r['answer']!r} - {mark}. {r['explanation']}")
        return "\n".join(lines)

    def _repr_html_(self):
        e = html.escape
        head = "".join(
            f"<th style='text-align:left'>{h}</th>"
            for h in ("question", "your answer", "correct?", "explanation")
        )
        body = "".join(
            "<tr>"
            f"<td style='text-align:left'><b>{e(r['id'])}</b>: {e(r['question'])}</td>"
            f"<td>{e(repr(r['answer']))}</td>"
            f"<td>{'&#10004;' if r['correct'] else '&#10008;'}</td>"
            f"<td style='text-align:left'>{e(r['explanation'])}</td>"
            "</tr>"
            for r in self.rows
        )
        return (
            f"<p><b>score: {self.score} / {len(self.rows)}</b></p>"
            f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"
        )


def grade(answers: dict) -> Grade:
    """Grade ``answers`` ({question id: answer}; missing or None counts as unanswered, and its
    explanation is withheld until an attempt). Every question's verdict is recorded with
    ``exercises.record("quiz <id>", ok)``."""
    unknown = sorted(set(answers) - set(_BY_ID))
    if unknown:
        print(f"not questions of this quiz (ignored): {unknown}")
    rows = []
    for q in QUESTIONS:
        given = answers.get(q.id)
        ok = is_correct(q, given)
        exercises.record(f"quiz {q.id}", ok)
        # an unanswered question shows no explanation: several name the right choice
        why = q.explanation if given is not None else UNANSWERED
        rows.append(dict(id=q.id, question=q.text, answer=given, correct=ok, explanation=why))
    return Grade(rows)


UNANSWERED = "(the explanation appears once you have answered)"
