"""Notebook 13's exercise checks (``replaylab.teaching.exercises_serving``): they pass on the
reference answers in ``notebooks/solutions/13_serving.py``, fail on the stubs, report an exception as a
failure, and fail on two plausible wrong answers each with a message that points at the
mistake."""

from pathlib import Path

import numpy as np
import pytest

from replaylab.teaching.exercises import solution_sections
from replaylab.teaching.exercises_serving import (
    check_accepted,
    check_admission_rule,
    check_best_k,
    check_provisional_room,
    check_rollback_cursor,
)

SOLUTIONS = Path(__file__).resolve().parents[1] / "notebooks" / "solutions" / "13_serving.py"


def _solution(key, name):
    scope = {}
    exec(solution_sections(SOLUTIONS)[key], scope)
    return scope[name]


def _out(capsys):
    return capsys.readouterr().out


def test_a_cursor_answer_in_any_pair_form_passes(capsys):
    """A right answer returned as a zip of the two lists or as arrays passes (the check unpacks
    it once); a number is refused by the answer's shape, not by the check's own error."""
    right = _solution("rollback_cursor", "my_rollback_cursor")
    assert check_rollback_cursor(lambda *a: zip(*zip(*right(*a))))
    assert check_rollback_cursor(lambda *a: tuple(np.array(x) for x in right(*a)))
    assert not check_rollback_cursor(lambda *a: 5)
    assert "expected (new_pos, new_log_len), two lists" in _out(capsys)


def test_the_reference_answers_pass(capsys):
    assert check_rollback_cursor(_solution("rollback_cursor", "my_rollback_cursor"))
    assert check_admission_rule(_solution("admission_rule", "my_admissible"))
    assert check_provisional_room(_solution("provisional_room", "my_provisional_room"))
    assert check_best_k(_solution("best_k", "my_best_k"))
    assert check_accepted(_solution("accepted", "my_accepted"))
    out = _out(capsys)
    assert "PASS rollback cursor" in out and "PASS admission rule" in out
    assert "PASS provisional room" in out and "PASS best k" in out and "PASS accepted" in out


def _stub(*args):
    raise NotImplementedError("write it")


@pytest.mark.parametrize(
    "check",
    [
        check_rollback_cursor,
        check_provisional_room,
        check_admission_rule,
        check_best_k,
        check_accepted,
    ],
)
def test_stubs_and_exceptions_are_failures_not_errors(check, capsys):
    assert check(_stub) is False
    assert "not yet implemented" in _out(capsys)

    def broken(*args):
        return [][0]

    assert check(broken) is False
    out = _out(capsys)
    assert "FAIL" in out and "IndexError" in out and "broken" in out
    assert check(lambda *a: None) is False
    assert "not done yet" in _out(capsys)


# ------------------------------------------------------------------ the rollback cursor


def _subtracts_keep(pos, log_len, last, keep):
    """Moves back by what is kept, not by what is dropped."""
    return [p - k for p, k in zip(pos, keep)], [n - k for n, k in zip(log_len, keep)]


def _forgets_the_log(pos, log_len, last, keep):
    """Moves the position back but leaves the log length where the step left it."""
    return [p - (lst - k) for p, lst, k in zip(pos, last, keep)], list(log_len)


def _counts_accepted_drafts(pos, log_len, last, keep):
    """Takes keep for the accepted drafts alone (forgets the pending token): one too many."""
    drop = [lst - (k - 1) for lst, k in zip(last, keep)]
    return [p - d for p, d in zip(pos, drop)], [n - d for n, d in zip(log_len, drop)]


def _in_place(pos, log_len, last, keep):
    """Right numbers, but written into the engine's own lists."""
    for i, (lst, k) in enumerate(zip(last, keep)):
        pos[i] -= lst - k
        log_len[i] -= lst - k
    return list(pos), list(log_len)


def _fractional(pos, log_len, last, keep):
    """Right numbers plus 0.9 (int() would cut 12.9 to 12)."""
    drop = [lst - k for lst, k in zip(last, keep)]
    return [p - d + 0.9 for p, d in zip(pos, drop)], [n - d + 0.9 for n, d in zip(log_len, drop)]


def _as_strings(pos, log_len, last, keep):
    drop = [lst - k for lst, k in zip(last, keep)]
    return [str(p - d) for p, d in zip(pos, drop)], [str(n - d) for n, d in zip(log_len, drop)]


def _returns_its_arguments(pos, log_len, last, keep):
    """Right numbers, but where nothing is dropped the engine's own lists come back."""
    if all(lst == k for lst, k in zip(last, keep)):
        return pos, log_len
    drop = [lst - k for lst, k in zip(last, keep)]
    return [p - d for p, d in zip(pos, drop)], [n - d for n, d in zip(log_len, drop)]


# ------------------------------------------------------------------ the provisional room


def _no_fold_at_all(pos, log_len, L, max_len):
    """Counts the full log as no room (forgets that the next step folds it first)."""
    return min(L - log_len, max_len - pos)


def _target_room(pos, log_len, L, max_len):
    """One short: the target's verify limit (k <= room - 1), not the draft slot's room."""
    held = log_len if log_len < L else 0
    return min(L - held - 1, max_len - pos)


def _ignores_max_len(pos, log_len, L, max_len):
    return L - (log_len if log_len < L else 0)


def _at_least_one(pos, log_len, L, max_len):
    """Right, except that a full slot gets a token of room."""
    return max(1, min(L - (log_len if log_len < L else 0), max_len - pos))


def _in_an_array(pos, log_len, L, max_len):
    return np.array([min(L - (log_len if log_len < L else 0), max_len - pos)])


# ------------------------------------------------------------------ the admission rule


def _skips_ahead(needs, used, budget, free_slots):
    """Admits every request that fits, in order, skipping the ones that do not."""
    n = 0
    for need in needs:
        if n < free_slots and used + need <= budget:
            used += need
            n += 1
    return n


def _ignores_slots(needs, used, budget, free_slots):
    n = 0
    for need in needs:
        if used + need > budget:
            break
        used, n = used + need, n + 1
    return n


def _strict_budget(needs, used, budget, free_slots):
    """Refuses an exact fit (< instead of <=)."""
    n = 0
    for need in needs:
        if n == free_slots or used + need >= budget:
            break
        used, n = used + need, n + 1
    return n


CURSOR, ADMISSION, ROOM = check_rollback_cursor, check_admission_rule, check_provisional_room


@pytest.mark.parametrize(
    "check, wrong, pointer",
    [
        (CURSOR, _subtracts_keep, r"so it drops last - keep = 0"),
        (CURSOR, _forgets_the_log, r"new_log_len of slot 0 expected .* the log moves back with"),
        (CURSOR, _counts_accepted_drafts, r"new_pos of slot 0 expected 10, got 9"),
        (CURSOR, _in_place, r"your function changed its arguments"),
        (CURSOR, _fractional, r"expected whole numbers of tokens, got \[10\.9\]"),
        (CURSOR, _as_strings, r"expected whole numbers of tokens, got \['10'\]"),
        (CURSOR, _returns_its_arguments, r"returned one of its argument lists; return new"),
        (ROOM, _at_least_one, r"pos=100, log_len=4, L=16, max_len=100: expected 0, got 1"),
        (ROOM, _in_an_array, r"expected a number of tokens \(int\), got array\(\[4\]\)"),
        (ROOM, _no_fold_at_all, r"log_len=5, L=5.*expected 5, got 0 \(a full log is folded"),
        (ROOM, _target_room, r"log_len=1, L=5.*expected 4, got 3 \(the log holds 1 of L=5"),
        (ROOM, _ignores_max_len, r"pos=98.*expected 2, got 14 \(max_len binds"),
        (ADMISSION, _skips_ahead, r"needs=\[20, 1, 1\].*expected 0, got 2: .*first come, first"),
        (ADMISSION, _ignores_slots, r"free_slots=2: expected 2, got 3: only free_slots=2 slots"),
        (ADMISSION, _strict_budget, r"expected 3, got 2: .*\(an exact fit is allowed\)"),
    ],
)
def test_wrong_answers_fail_with_a_pointed_message(check, wrong, pointer, capsys):
    import re

    assert check(wrong) is False
    out = _out(capsys)
    assert f"FAIL {check.verdict_name()}" in out and re.search(pointer, out), out


# ------------------------------------------------------------------ each round's k


def _rate(a, seconds, k):
    return sum(a**i for i in range(k + 1)) / seconds[k]


def test_an_admission_count_is_what_the_scheduler_takes(capsys):
    """The check refused a 0-d integer tensor the scheduler accepts, and passed a float it
    refuses; it now asks the scheduler's own test (``serving.validate.is_int``)."""
    import torch

    right = _solution("admission_rule", "my_admissible")
    assert check_admission_rule(lambda *a: torch.tensor(right(*a)))
    assert not check_admission_rule(lambda *a: float(right(*a)))
    assert "as the scheduler takes" in _out(capsys)


def test_a_tie_hint_shows_the_right_tokens_a_round():
    """An E(k) one term short picks k = 1 where k = 0 and 1 tie under the right E: the hint
    says so with the right E(k), so the learner sees the formula, not only the tie rule."""
    import contextlib
    import io

    short = lambda a, s: max(  # noqa: E731
        range(len(s)), key=lambda k: ((1 + sum(a**i for i in range(k))) / s[k], -k)
    )
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert check_best_k(short) is False
    assert "tie at" in out.getvalue() and "E(1) = " in out.getvalue(), out.getvalue()


@pytest.mark.parametrize(
    "wrong, says",
    [
        (lambda a, s: len(s) - 1, "expected 0, got 4"),  # always the most drafts
        (lambda a, s: max(range(len(s)), key=lambda k: (_rate(a, s, k), k)), "take the smaller"),
        (lambda a, s: max(range(len(s)), key=lambda k: _rate(a, s, k) - 1 / s[k]), "tokens/s"),
        (lambda a, s: max(range(len(s) - 1), key=lambda k: _rate(a, s[1:], k)), "expected"),
        (lambda a, s: len(s), "k must be one of 0 .."),
        (lambda a, s: "two", "expected a number of drafts"),
        (
            lambda a, s: min(range(len(s)), key=lambda k: -(1 - a ** (k + 1)) / (1 - a) / s[k]),
            "ZeroDivisionError",
        ),  # the closed form, unguarded at acceptance 1
    ],
)
def test_wrong_choices_of_k_fail_with_what_they_got_wrong(wrong, says, capsys):
    """The largest k always, ties to the larger k, E(k) without its 1, the times shifted by
    one k, a k past the last time, not a number, (1 - a^(k+1)) / (1 - a) at a = 1."""
    assert check_best_k(wrong) is False
    out = _out(capsys)
    assert "FAIL best k" in out and says in out, out


# ------------------------------------------------------------------ a round's acceptance


def _every_match(drafts, predicted, n):
    """Counts every draft equal to the target's token, not only the leading run."""
    k = drafts.shape[1]
    return ((drafts == predicted[:, :k]) & (np.arange(k) < n[:, None])).sum(1)


def _tokens_kept(drafts, predicted, n):
    """1 + accepted: the tokens a row keeps, not its drafts."""
    k = drafts.shape[1]
    same = (drafts == predicted[:, :k]) & (np.arange(k) < n[:, None])
    return same.cumprod(1).sum(1) + 1


def _ignores_padding(drafts, predicted, n):
    """Reads the padding past a row's proposed drafts."""
    k = drafts.shape[1]
    return (drafts == predicted[:, :k]).cumprod(1).sum(1)


def _shifted(drafts, predicted, n):
    """Compares draft j with the target's token j + 1."""
    k = drafts.shape[1]
    same = (drafts == predicted[:, 1:]) & (np.arange(k) < n[:, None])
    return same.cumprod(1).sum(1)


def _reads_one_padding_draft(drafts, predicted, n):
    """Off by one in the mask: one draft past the row's proposed ones."""
    k = drafts.shape[1]
    same = (drafts == predicted[:, :k]) & (np.arange(k) <= n[:, None])
    return same.cumprod(1).sum(1)


def _first_rows_count(drafts, predicted, n):
    """The first row's n_drafts for every row."""
    k = drafts.shape[1]
    same = (drafts == predicted[:, :k]) & (np.arange(k) < n[0])
    return same.cumprod(1).sum(1)


def _in_place(drafts, predicted, n):
    """Right, but writes into its input."""
    k = drafts.shape[1]
    n[:] = np.minimum(n, k)
    drafts[:] = drafts * ((drafts == predicted[:, :k]) & (np.arange(k) < n[:, None]))
    same = (drafts == predicted[:, :k]) & (np.arange(k) < n[:, None])
    return same.cumprod(1).sum(1)


@pytest.mark.parametrize(
    "wrong, says",
    [
        (_every_match, "only the leading run counts"),
        (_tokens_kept, "not the tokens"),
        (_ignores_padding, "the rest is padding"),
        (_shifted, "not predicted[:, j + 1]"),
        (_reads_one_padding_draft, "the rest is padding"),
        (_first_rows_count, "draft j is kept when drafts 0 .. j all equal"),
        (_in_place, "changed its inputs"),
        (lambda d, p, n: np.zeros(len(d) + 1, dtype=np.int64), "one integer count per row"),
        (lambda d, p, n: _ignores_padding(d, p, n)[:, None], "got shape ("),
        (lambda d, p, n: _ignores_padding(d, p, n).astype(float), "of dtype float64"),
        (lambda d, p, n: _ignores_padding(d, p, n).tolist(), "got list"),
        (lambda d, p, n: object(), "expected a numpy array"),
    ],
)
def test_wrong_acceptances_fail_with_what_they_got_wrong(wrong, says, capsys):
    """Every match counted, 1 + accepted, the padding read, the targets shifted by one, the
    inputs overwritten, a count too many, a column (G, 1), floats, a list, not an array."""
    assert check_accepted(wrong) is False
    out = _out(capsys)
    assert "FAIL accepted drafts" in out and says in out, out
