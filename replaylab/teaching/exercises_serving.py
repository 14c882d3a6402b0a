"""Exercise checks of notebook 13 (serving): the per-slot rollback cursor, a draft slot's
provisional room, the scheduler's admission rule under a byte budget and each speculation
round's k, and a round's acceptance on the host in numpy. Each check compares the learner's
function with the library's (``serving.cursor.rollback_cursor``, ``serving.cursor.provisional_room``,
``serving.scheduler.admissible``, ``serving.adaptive_k.best_k``, ``serving.contexts.accepted``)
on fixed edge cases and then
random ones, prints PASS or FAIL with the first mismatch and what it points at,
and records its verdict (``grading``).

Glossary: pos (tokens a slot holds), log_len (replay's log entries since the checkpoint), last
(tokens the slot took in its last step), keep (tokens of that step it keeps: the pending token
plus the accepted drafts), needs (bytes of each waiting request, in queue order), used (bytes
the running requests hold), budget (the byte budget), free_slots (engine slots free), L
(replay's log length), max_len (the engine's longest sequence), acceptance (a, the per-draft
acceptance), seconds (a round's time with k drafts, k = 0 .. k_max), drafts (G, k) and
predicted (G, k + 1) token ids of a verify round's G rows, n_drafts (G,) the drafts each row
proposed (the rest of its row is padding).
"""

from __future__ import annotations

import operator
import random

import numpy as np

from replaylab.serving.adaptive_k import best_k, geometric_tokens
from replaylab.serving.contexts import accepted
from replaylab.serving.cursor import provisional_room, rollback_cursor
from replaylab.serving.scheduler import admissible
from replaylab.serving.validate import is_int
from replaylab.teaching.exercises_common import whole_number
from replaylab.teaching.grading import describe_exception, guarded, report

__all__ = [
    "check_rollback_cursor",
    "check_provisional_room",
    "check_admission_rule",
    "check_best_k",
    "check_accepted",
]


def _cursor_cases(n_random, seed):
    fixed = [
        dict(pos=[10], log_len=[6], last=[5], keep=[5]),  # everything kept: nothing moves
        dict(pos=[10], log_len=[5], last=[5], keep=[1]),  # only the pending token kept
        dict(pos=[12, 7, 30], log_len=[6, 2, 9], last=[5, 1, 3], keep=[2, 1, 3]),
    ]
    rng = random.Random(seed)
    for _ in range(n_random):
        n = rng.randint(1, 6)
        last = [rng.randint(1, 5) for _ in range(n)]
        log_len = [lst + rng.randint(0, 12) for lst in last]  # the step appended `last`
        pos = [lg + rng.randint(0, 60) for lg in log_len]
        keep = [rng.randint(1, lst) for lst in last]
        fixed.append(dict(pos=pos, log_len=log_len, last=last, keep=keep))
    return fixed


def _ints(values, name, n):
    """values as ints, one per slot; a string, a fraction or a bool is refused by name."""
    given = list(values)
    out = [whole_number(v) for v in given]
    if None in out:
        raise ValueError(f"{name}: expected whole numbers of tokens, got {given!r}")
    if len(out) != n:
        raise ValueError(f"{name}: {len(out)} values for {n} slots")
    return out


@guarded("rollback cursor")
def check_rollback_cursor(fn, cases=200, seed=0) -> bool:
    """Exercise (notebook 13): ``fn(pos, log_len, last, keep) -> (new_pos, new_log_len)``,
    each argument a list with one int per slot, compared with ``rollback_cursor``."""
    name = "rollback cursor"
    checked = _cursor_cases(cases, seed)
    for case in checked:
        given = {k: list(v) for k, v in case.items()}
        want_pos, want_log, _ = rollback_cursor(**case)
        where = ", ".join(f"{k}={v}" for k, v in case.items())
        try:
            got = fn(given["pos"], given["log_len"], given["last"], given["keep"])
        except NotImplementedError:
            raise
        except Exception as err:  # the learner's code raised on this case
            return report(name, False, f"on {where}: {describe_exception(err)}")
        if given != case:
            return report(
                name,
                False,
                f"on {where}: your function changed its arguments (now {given}); return new "
                "lists and leave the engine's own lists alone",
            )
        if got is None:
            return report(name, False, "not done yet (the function returned None)")
        try:
            got_pos, got_log = got
        except (TypeError, ValueError) as err:
            return report(
                name, False, f"on {where}: expected (new_pos, new_log_len), two lists ({err})"
            )
        if got_pos is given["pos"] or got_log is given["log_len"]:
            return report(
                name,
                False,
                f"on {where}: your function returned one of its argument lists; return new "
                "lists (the engine's own lists are its state)",
            )
        try:
            n = len(case["pos"])
            got_pos, got_log = _ints(got_pos, "new_pos", n), _ints(got_log, "new_log_len", n)
        except (TypeError, ValueError) as err:
            return report(
                name, False, f"on {where}: expected (new_pos, new_log_len), two lists ({err})"
            )
        for i in range(len(case["pos"])):
            drop = case["last"][i] - case["keep"][i]
            hint = (
                f"slot {i} took last={case['last'][i]} tokens and keeps keep={case['keep'][i]}, "
                f"so it drops last - keep = {drop}"
            )
            if got_pos[i] != want_pos[i]:
                return report(
                    name,
                    False,
                    f"on {where}: new_pos of slot {i} expected {want_pos[i]}, got {got_pos[i]} "
                    f"({hint}: pos - {drop})",
                )
            if got_log[i] != want_log[i]:
                return report(
                    name,
                    False,
                    f"on {where}: new_log_len of slot {i} expected {want_log[i]}, got "
                    f"{got_log[i]} ({hint}: the log moves back with the position, "
                    f"log_len - {drop}; the dropped entries are overwritten by the next step)",
                )
    return report(name, True, f"{len(checked)} cases give the engine's cursor")


def _answer(name, fn, args, where):
    """(the learner's answer to one case, None), or (None, the failed report) when it raised
    or returned None; a stub's NotImplementedError goes on to ``guarded``."""
    try:
        got = fn(*args)
    except NotImplementedError:
        raise
    except Exception as err:
        return None, report(name, False, f"on {where}: {describe_exception(err)}")
    if got is None:
        return None, report(name, False, "not done yet (the function returned None)")
    return got, None


def _room_cases(n_random, seed):
    fixed = [
        dict(pos=21, log_len=1, L=5, max_len=100),  # 4 entries to go before the next fold
        dict(pos=25, log_len=5, L=5, max_len=100),  # a full log: the next step folds it first
        dict(pos=16, log_len=0, L=16, max_len=100),  # just folded
        dict(pos=98, log_len=2, L=16, max_len=100),  # max_len binds
        dict(pos=100, log_len=4, L=16, max_len=100),  # a full slot: no room at all
    ]
    rng = random.Random(seed)
    for _ in range(n_random):
        L = rng.choice([1, 2, 3, 4, 5, 8, 16, 64])
        log_len = rng.randint(0, L)
        pos = L * rng.randint(0, 300 // L) + log_len  # the checkpoint on the grid of L
        fixed.append(dict(pos=pos, log_len=log_len, L=L, max_len=pos + rng.randint(0, 40)))
    return fixed


@guarded("provisional room")
def check_provisional_room(fn, cases=300, seed=0) -> bool:
    """Exercise (notebook 13): ``fn(pos, log_len, L, max_len) -> int``, the tokens a draft slot
    may take and still give back by a cursor move, compared with ``provisional_room``."""
    name = "provisional room"
    checked = _room_cases(cases, seed)
    for case in checked:
        want = provisional_room(**case)
        where = ", ".join(f"{k}={v}" for k, v in case.items())
        args = (case["pos"], case["log_len"], case["L"], case["max_len"])
        got, failed = _answer(name, fn, args, where)
        if failed is not None:
            return failed
        count = whole_number(got)
        if count is None:
            return report(
                name, False, f"on {where}: expected a number of tokens (int), got {got!r}"
            )
        got = count
        if got == want:
            continue
        pos, log_len, L, max_len = case["pos"], case["log_len"], case["L"], case["max_len"]
        if max_len - pos < L - (log_len % L):
            why = f"max_len binds: the slot holds {pos} of max_len={max_len} positions"
        elif log_len == L:
            why = (
                "a full log is folded by the next step, before its first token, and that fold "
                "holds only true tokens; the entries after it may run to the next fold, L away"
            )
        else:
            why = (
                f"the log holds {log_len} of L={L} entries: {L - log_len} more fit before the "
                "next fold, and a fold of a drafted entry could not be given back"
            )
        return report(name, False, f"on {where}: expected {want}, got {got} ({why})")
    return report(name, True, f"{len(checked)} cases give the engine's provisional room")


def _admission_cases(n_random, seed):
    fixed = [
        dict(needs=[5, 5, 5], used=0, budget=15, free_slots=3),  # an exact fit
        dict(needs=[20, 1, 1], used=0, budget=10, free_slots=3),  # the head blocks the rest
        dict(needs=[1, 1, 1], used=0, budget=100, free_slots=2),  # slots bind, not bytes
        dict(needs=[], used=3, budget=10, free_slots=2),
        dict(needs=[4], used=7, budget=10, free_slots=0),
    ]
    rng = random.Random(seed)
    for _ in range(n_random):
        needs = [rng.randint(1, 10) for _ in range(rng.randint(0, 6))]
        used = rng.randint(0, 20)
        budget = used + rng.randint(0, 30)
        if needs and rng.random() < 0.3:  # an exact fit of a prefix
            budget = used + sum(needs[: rng.randint(1, len(needs))])
        fixed.append(dict(needs=needs, used=used, budget=budget, free_slots=rng.randint(0, 4)))
    return fixed


@guarded("admission rule")
def check_admission_rule(fn, cases=300, seed=0) -> bool:
    """Exercise (notebook 13): ``fn(needs, used, budget, free_slots) -> int``, how many
    requests from the head of the queue to admit, compared with ``admissible``."""
    name = "admission rule"
    checked = _admission_cases(cases, seed)
    for case in checked:
        needs = list(case["needs"])
        want = admissible(**case)
        where = ", ".join(f"{k}={v}" for k, v in case.items())
        got, failed = _answer(
            name, fn, (needs, case["used"], case["budget"], case["free_slots"]), where
        )
        if failed is not None:
            return failed
        if needs != case["needs"]:
            return report(name, False, f"on {where}: your function changed the queue {needs}")
        if not is_int(got):  # the scheduler's own test of a count
            return report(
                name,
                False,
                f"on {where}: expected a count (int, as the scheduler takes), got {got!r}",
            )
        got = operator.index(got)
        if got == want:
            continue
        used, budget, free = case["used"], case["budget"], case["free_slots"]
        held = used + sum(case["needs"][:got])
        if got > free:
            why = f"only free_slots={free} slots are free"
        elif got > len(case["needs"]):
            why = f"only {len(case['needs'])} requests wait"
        elif got > want:
            why = (
                f"admitting the first {got} would hold used + their bytes = {held} > "
                f"budget={budget}: request {want} of the queue (needs {case['needs'][want]}) "
                "does not fit, and first come, first served, every request behind it waits "
                "too (no overtaking)"
            )
        else:
            fits = used + sum(case["needs"][:want])
            why = f"the first {want} fit: used + their bytes = {fits} <= budget={budget}"
            if fits == budget:
                why += " (an exact fit is allowed)"
            why += f", and {free} slots are free"
        return report(name, False, f"on {where}: expected {want}, got {got}: {why}")
    return report(name, True, f"{len(checked)} queues give the library's admissions")


def _best_k_cases(n_random, seed):
    fixed = [
        dict(acceptance=0.8, seconds=[1.0, 1.0, 1.0, 1.0, 1.0]),  # bytes bind: drafts are free
        dict(acceptance=0.9, seconds=[1.0, 2.0, 3.0, 4.0, 5.0]),  # FLOPs bind: a row, a step
        dict(acceptance=0.0, seconds=[1.0, 1.0, 1.0]),  # nothing accepted: a tie, take k = 0
        dict(acceptance=0.7, seconds=[1.0, 1.2, 1.5, 1.9, 2.4]),  # in between: k = 2
        dict(acceptance=1.0, seconds=[1.0, 1.5, 2.0, 2.5]),  # every draft kept: k + 1 tokens
    ]
    rng = random.Random(seed)
    for _ in range(n_random):
        seconds, t = [], rng.uniform(0.5, 2.0)
        for _ in range(rng.randint(1, 8)):  # a round never gets cheaper with more drafts
            seconds.append(round(t, 4))
            t += rng.uniform(0.0, 1.2) * seconds[0]
        a = rng.choice([0.0, 1.0]) if rng.random() < 0.1 else round(rng.random(), 3)
        fixed.append(dict(acceptance=a, seconds=seconds))
    return fixed


@guarded("best k")
def check_best_k(fn, cases=300, seed=0) -> bool:
    """Exercise (notebook 13): ``fn(acceptance, seconds) -> k``, the number of drafts whose
    round keeps the most tokens a second, compared with ``serving.adaptive_k.best_k``."""
    name = "best k"
    checked = _best_k_cases(cases, seed)
    for case in checked:
        a, seconds = case["acceptance"], list(case["seconds"])
        want = best_k(a, seconds)
        where = f"acceptance={a}, seconds={seconds}"
        got, failed = _answer(name, fn, (a, seconds), where)
        if failed is not None:
            return failed
        if seconds != case["seconds"]:
            return report(name, False, f"on {where}: your function changed seconds")
        try:
            count = whole_number(got)
        except (TypeError, ValueError):
            count = None
        if count is None:
            return report(name, False, f"on {where}: expected a number of drafts, got {got!r}")
        got = count
        if got == want:
            continue
        rate = [geometric_tokens(k, a) / t for k, t in enumerate(seconds)]
        if not 0 <= got < len(seconds):
            why = f"k must be one of 0 .. {len(seconds) - 1} (one time per k)"
        elif rate[got] == rate[want]:
            why = (
                f"k={got} and k={want} tie at {rate[want]:.4g} tokens/s (E({got}) = "
                f"{geometric_tokens(got, a):.4g} in {seconds[got]} s, E({want}) = "
                f"{geometric_tokens(want, a):.4g} in {seconds[want]} s): take the smaller"
            )
        else:
            why = (
                f"k={want} keeps 1 + a + ... + a^{want} = {geometric_tokens(want, a):.4g} "
                f"tokens in {seconds[want]} s ({rate[want]:.4g} tokens/s), k={got} "
                f"{geometric_tokens(got, a):.4g} in {seconds[got]} s ({rate[got]:.4g})"
            )
        return report(name, False, f"on {where}: expected {want}, got {got} ({why})")
    return report(name, True, f"{len(checked)} cases give the library's best k")


def _accepted_cases(n_random, seed):
    rows = lambda *r: np.array(r, dtype=np.int64)  # noqa: E731
    fixed = [
        (rows([2, 3, 4]), rows([1, 2, 3, 4]), rows(3)),  # the first one wrong (shifted: all)
        (rows([1, 2, 3]), rows([1, 2, 3, 4]), rows(3)),  # every draft kept
        (rows([1, 2, 3]), rows([5, 2, 3, 4]), rows(3)),  # the first one wrong: none kept
        (rows([1, 2, 3]), rows([1, 9, 3, 4]), rows(3)),  # a match after a mismatch counts not
        (rows([1, 2, 3]), rows([1, 2, 3, 4]), rows(1)),  # one proposed: padding past it
        (rows([7, 7], [1, 2]), rows([7, 7, 0], [1, 2, 0]), rows(0, 2)),  # none proposed
    ]
    gen = np.random.default_rng(seed)
    for _ in range(n_random):
        G, k = int(gen.integers(1, 7)), int(gen.integers(1, 6))
        drafts = gen.integers(0, 3, (G, k))  # few ids: many matches
        predicted = gen.integers(0, 3, (G, k + 1))
        fixed.append((drafts, predicted, gen.integers(0, k + 1, G)))
    return fixed


@guarded("accepted drafts")
def check_accepted(fn, cases=300, seed=0) -> bool:
    """Exercise (notebook 13): ``fn(drafts, predicted, n_drafts) -> (G,)`` on numpy arrays,
    the drafts each row keeps (the leading run equal to the target's tokens, within the row's
    ``n_drafts``), compared with ``serving.contexts.accepted``."""
    name = "accepted drafts"
    checked = _accepted_cases(cases, seed)
    for drafts, predicted, n in checked:
        want = accepted(drafts, predicted, n).tolist()
        where = f"drafts={drafts.tolist()}, predicted={predicted.tolist()}, n_drafts={n.tolist()}"
        kept = drafts.copy(), predicted.copy(), n.copy()
        got, failed = _answer(name, fn, kept, where)
        if failed is not None:
            return failed
        if any((a != b).any() for a, b in zip(kept, (drafts, predicted, n))):
            return report(name, False, f"on {where}: your function changed its inputs")
        if not isinstance(got, np.ndarray):
            return report(
                name, False, f"on {where}: expected a numpy array of {len(want)} counts, got "
                f"{type(got).__name__} (the point is numpy on the host: no tensor dispatch)",
            )  # fmt: skip
        if got.shape != (len(want),) or got.dtype.kind not in "iu":
            return report(
                name, False, f"on {where}: expected one integer count per row, shape "
                f"({len(want)},), got shape {got.shape} of dtype {got.dtype}",
            )  # fmt: skip
        got = got.tolist()
        k = drafts.shape[1]
        shifted = accepted(drafts, predicted[:, 1:], n).tolist()
        for g, (a, b) in enumerate(zip(want, got)):
            if a == b:
                continue
            same = (drafts[g] == predicted[g, :k]).tolist()
            if b == shifted[g] > 0 and got == shifted:
                why = (
                    "draft j is compared with predicted[:, j], the target's token at its "
                    "position, not predicted[:, j + 1]"
                )
            elif b == sum(same[: n[g]]):
                why = "only the leading run counts: stop at the first draft the target did not pick"
            elif b > n[g]:
                why = f"only the row's first n_drafts = {n[g]} drafts were proposed (the rest is padding)"
            elif b == a + 1:
                why = "count the drafts kept, not the tokens (a row keeps 1 + accepted)"
            else:
                why = "draft j is kept when drafts 0 .. j all equal the target's tokens there"
            return report(name, False, f"on {where}: row {g} expected {a}, got {b} ({why})")
    return report(name, True, f"{len(checked)} cases give the scheduler's acceptance")
