"""Checks of notebook 04 (snapshots and their budget): the "cost" eviction policy against
``cache.choose_victim``, the bytes of one snapshot and the tokens re-run under a budget at high
acceptance (both computed live).

Glossary (as in ``strategies.base.EvictionItem``): key, position, nbytes, last_used; the cost of
a copy is the tokens from the next older kept position (0 when none is older) to its own.
"""

from __future__ import annotations

import torch

from replaylab.teaching.exercises_common import _answer, _done, _not_implemented, whole_number
from replaylab.teaching.grading import describe_exception, guarded


def _rebuild_cost(items, key):
    """(tokens, older position) to rebuild the item ``key`` of an eviction list from the next
    older kept position (0 when none is older); None when ``key`` is not in the list."""
    item = next((it for it in items if it.key == key), None)
    if item is None:
        return None
    older = max((it.position for it in items if it.position < item.position), default=0)
    return item.position - older, older


def _describe_victim(items, key) -> str:
    cost = _rebuild_cost(items, key)
    if cost is None:
        return f"{key!r} (not a key of the list)"
    used = next(it.last_used for it in items if it.key == key)
    return f"{key!r} (rebuilt in {cost[0]} tokens from {cost[1]}, last used {used})"


# (positions, last used) with ties in tokens to rebuild, which random lists rarely have
_EVICTION_TIES = (([4, 8, 12], [5, 1, 9]), ([3, 10, 13], [7, 2, 4]), ([6, 9, 20, 23], [3, 8, 1, 2]))


@guarded("cost-aware eviction")
def check_cost_eviction(choose, seeds=range(20)) -> bool:
    """Exercise (notebook 04): ``choose(items) -> key`` picks the kept copy to evict under the
    "cost" policy: the one cheapest to rebuild, i.e. with the fewest tokens between its
    position and the next older kept position (0 when none is older); ties go to the least
    recently used. ``items``: a list of ``replaylab.strategies.base.EvictionItem``. Checked
    against ``replaylab.cache.choose_victim`` on three lists with ties and on random lists."""
    from replaylab.cache import choose_victim
    from replaylab.strategies.base import EvictionItem

    name = "cost-aware eviction"
    cases = list(_EVICTION_TIES)
    for seed in seeds:
        g = torch.Generator().manual_seed(seed)
        n = int(torch.randint(1, 7, (1,), generator=g))
        cases.append(
            (
                (torch.randperm(40, generator=g)[:n] + 1).tolist(),
                torch.randperm(100, generator=g)[:n].tolist(),
            )
        )
    for positions, used in cases:
        items = [
            EvictionItem(key=f"copy@{p}", position=p, nbytes=1000, last_used=u)
            for p, u in zip(positions, used)
        ]
        listing = ", ".join(f"{it.key} (last used {it.last_used})" for it in items)
        try:
            got = choose(list(items))
        except NotImplementedError:
            return _not_implemented(name)
        except Exception as err:  # the learner's code raised: say on which list
            return _done(name, False, f"for [{listing}]: {describe_exception(err)}")
        want = choose_victim(items, "cost")
        if got != want:
            message = (
                f"for [{listing}] you chose {_describe_victim(items, got)}, expected "
                f"{_describe_victim(items, want)}"
            )
            mine, best = _rebuild_cost(items, got), _rebuild_cost(items, want)
            if mine is not None and mine[0] == best[0]:
                message += (
                    f": both are {best[0]} tokens back (to the next older kept position, or to 0 "
                    "when none is older); a tie in tokens goes to the least recently used "
                    "(smallest last_used)"
                )
            else:
                message += (
                    ": evict the copy with the fewest tokens back to the next older kept position "
                    "(0 when none is older)"
                )
            return _done(name, False, message)
    return _done(name, True, f"same choice as replaylab.cache.choose_victim on {len(cases)} lists")


@guarded("bytes of one snapshot")
def check_snapshot_copy_bytes(answer, model) -> bool:
    """Notebook 04: bytes of one snapshot of one sequence of ``model`` (every SSM layer's state
    and conv window). The check takes one snapshot in a live cache and reads its bytes."""
    from replaylab.cache import HybridCache

    cache = HybridCache(model, 1, "snapshot")
    with torch.no_grad():
        model(torch.zeros(1, 4, dtype=torch.long), cache)
        cache.snapshot()
    want = cache.nbytes()["snapshots"]
    size = next(model.parameters()).element_size()
    n = None if answer is None else whole_number(answer)
    if answer is not None and n is None:
        return _done("bytes of one snapshot", False, f"{answer!r}: expected a whole number")
    return _answer(
        "bytes of one snapshot",
        n,
        want,
        f"len(cfg.ssm_layers) x (H x P x N x 4 bytes (the state is fp32) + (d_conv - 1) x conv "
        f"channels x {size} bytes (the model's dtype: next(model.parameters()).element_size()))",
    )


@guarded("evictions and tokens re-run under a budget at acceptance 0.9")
def check_rerun_at_high_acceptance(answer, model, prompt, fractions=(0.9, 0.7, 0.5)) -> bool:
    """Notebook 04: at acceptance 0.9, the pair (the most evictions any eviction policy makes
    at any of the budgets ``fractions`` of the unbudgeted peak, the most tokens any re-runs
    there). The check runs ``budget_outcomes``."""
    from replaylab.teaching.experiments import budget_outcomes

    name = "evictions and tokens re-run under a budget at acceptance 0.9"
    if answer is None or answer is Ellipsis:
        return _done(name, False, "no answer yet (replace None with your answer)")
    scalar = isinstance(answer, (int, float, str)) or (
        isinstance(answer, torch.Tensor) and answer.dim() == 0
    )
    if scalar or (isinstance(answer, (tuple, list)) and len(answer) != 2):
        return _done(name, False, f"{answer!r}: expected a pair (evictions, tokens re-run)")
    first, second = answer  # what cannot be unpacked raises: ``guarded`` reports it
    got = (whole_number(first), whole_number(second))
    if None in got:
        return _done(name, False, f"{answer!r}: expected two whole numbers")
    rows = budget_outcomes(
        model, prompt, n_new=24, budget_fractions=list(fractions), acceptance=0.9
    )
    evictions = max(r["evictions"] for r in rows)
    rerun = max(r["recomputed_tokens"] for r in rows)
    wrong = []
    if got[0] != evictions:
        wrong.append("evictions: the largest 'evictions' of any row")
    if got[1] != rerun:
        wrong.append("tokens re-run: the largest 'recomputed_tokens' of any row")
    explain = "; ".join(wrong) + " (budget_outcomes(..., acceptance=0.9))"
    return _done(name, not wrong, f"{answer!r}" + (f" - {explain}" if wrong else ""))
