"""Checks of notebook 03 (branching strategies): a mini snapshot store on ``MiniLayer``, and two
questions the check answers by running ``experiments.compare_strategies`` (which strategy re-runs
tokens at acceptance 0; what recompute's interval does to its peak bytes and its re-runs).

Glossary: a handle names one snapshot (not a position); position, the tokens along the current
branch; the store's ``state`` (batch, H, P, N).
"""

from __future__ import annotations

import torch

from replaylab.teaching.exercises_common import (
    ScanInputs,
    _answer,
    _compare,
    _equals,
    _Mismatch,
    _reference_path,
    _run_ops,
    mini_layer,
)
from replaylab.teaching.grading import guarded

# the start of every snapshot-store sequence: one handle restored three times with advances
# between, so a store whose restore hands out the saved tensor itself (no copy) fails the second
# restore; then two branches from it snapshotted at one position (4) and both restored, so a store
# that keys its copies by position (the later snapshot overwrites the earlier) fails
_SNAPSHOT_SCRIPT = (("advance", 2), ("snapshot",), ("advance", 3), ("restore", 0), ("advance", 2))
_SNAPSHOT_SCRIPT += (("restore", 0), ("advance", 1), ("restore", 0))
_SNAPSHOT_SCRIPT += (("advance", 2), ("snapshot",), ("restore", 0), ("advance", 2), ("snapshot",))
_SNAPSHOT_SCRIPT += (("restore", 1), ("advance", 1), ("restore", 2), ("restore", 1))


def _same_position_hint(layer, batch, state, k, saved):
    """If ``state`` (what the store holds after restoring snapshot #k) is the state of another
    snapshot taken at the same position, the FAIL hint that says so; else ''."""
    pos = sum(len(p) for p in saved[k])
    for j, path in saved.items():
        if j == k or sum(len(p) for p in path) != pos or not path:
            continue
        if _equals(state, _reference_path(layer, batch, path)[0][:, -1]):
            return (
                f" - it is the state of snapshot #{j}, taken at the same position {pos} on "
                "another branch: a handle must name one snapshot, not a position (a store "
                "keyed by position lets a later snapshot at that position replace the first)"
            )
    return ""


@guarded("snapshot store")
def check_snapshot_store(store_class, layer=None) -> bool:
    """Exercise (notebook 03): a mini snapshot store for one Mamba-2 layer.

    ``store_class(layer, batch)`` with ``.state``, ``.position``, ``.advance(inputs) -> y``,
    ``.snapshot() -> handle`` and ``.restore(handle)``. Each of three sequences starts with a
    fixed script that restores one handle three times with advances between (advance 2,
    snapshot, advance 3, restore, advance 2, restore, advance 1, restore), then snapshots two
    branches from it at one position (advance 2, snapshot, restore, advance 2, snapshot) and
    restores both (the first, advance 1, the second, the first again), then runs random
    advances (1-3 tokens), snapshots and restores; after every operation the outputs, state and
    position are compared with one reference scan over the tokens of the current branch."""
    layer = layer or mini_layer()
    batch = 2

    def ops(g, log, n_ops):
        store = store_class(layer, batch)
        path: list[ScanInputs] = []  # the inputs along the current branch, from position 0
        saved = {}  # snapshot number -> path at the snapshot
        handles = []
        restores = {}  # snapshot number -> restores so far
        script = list(_SNAPSHOT_SCRIPT)
        for _ in range(len(script) + n_ops):
            pos = sum(len(p) for p in path)
            if script:
                op = script.pop(0)
            else:
                roll = float(torch.rand(1, generator=g))
                if roll < 0.25 and pos > 0:
                    op = ("snapshot",)
                elif roll < 0.45 and handles:
                    op = ("restore", int(torch.randint(len(handles), (1,), generator=g)))
                else:
                    op = ("advance", int(torch.randint(1, 4, (1,), generator=g)))
            hint = ""
            if op[0] == "snapshot":
                log.append(f"snapshot() #{len(handles)} at {pos}")
                handles.append(store.snapshot())
                saved[len(handles) - 1] = list(path)
            elif op[0] == "restore":
                k = op[1]
                restores[k] = restores.get(k, 0) + 1
                path = list(saved[k])
                log.append(
                    f"restore(snapshot #{k}, position {sum(len(p) for p in path)})"
                    + (f", restore number {restores[k]} of this handle" if restores[k] > 1 else "")
                )
                store.restore(handles[k])
                hint = (
                    " - this handle gave the right state when restored before, so the saved copy "
                    "changed since: restore() must give the store its own copy (.clone()), or an "
                    "in-place advance writes into the saved state"
                    if restores[k] > 1
                    else " - the saved copy changed after snapshot(): snapshot() must keep its "
                    "own copy (.clone()), or an in-place advance writes into it"
                )
            else:
                T = op[1]
                new = layer.random_inputs(batch, T, g)
                log.append(f"advance({T} tokens) at {pos}")
                y = store.advance(new.clone())
                path.append(new)
                _, ref_y = _reference_path(layer, batch, path)
                _compare("y returned by advance", y, ref_y[:, -T:])
            pos = sum(len(p) for p in path)
            if store.position != pos:
                raise _Mismatch(f"position is {store.position}, expected {pos}")
            states, _ = _reference_path(layer, batch, path)
            want = layer.zero_state(batch) if states is None else states[:, -1]
            try:
                _compare("state", store.state, want)
            except _Mismatch as err:
                if op[0] == "restore":
                    hint = _same_position_hint(layer, batch, store.state, op[1], saved) or hint
                    got = store.state
                    if isinstance(got, torch.Tensor) and not got.any() and want.any():
                        hint = (
                            " - the state after restore() is all zeros: restore() must put the "
                            "snapshot's saved state back"
                        )
                raise _Mismatch(f"{err}{hint}") from None
        return len(_SNAPSHOT_SCRIPT) + n_ops

    return _run_ops("snapshot store", ops)


@guarded("rollback work at acceptance 0")
def check_rollback_work(answer, model, prompt) -> bool:
    """Notebook 03: with every draft rejected (acceptance 0), which strategy re-runs tokens
    through the model on its restores? The check runs ``compare_strategies`` at acceptance 0
    and takes the strategy with the most recomputed tokens."""
    from replaylab.teaching.experiments import compare_strategies

    rows = compare_strategies(model, prompt, n_new=24, acceptance=0.0, k=4)
    want = max(rows, key=lambda r: r["recomputed_tokens"])["strategy"]
    return _answer(
        "rollback work at acceptance 0",
        answer,
        want,
        "look at 'recomputed tokens' per strategy at acceptance 0.0",
    )


@guarded("recompute interval 2 -> 32")
def check_interval_effect(answer, model, prompt) -> bool:
    """Notebook 03: going from ``interval=2`` to ``interval=32``, does recompute's peak bytes go
    "up" or "down", and its recomputed tokens? ``answer``: {"peak_bytes": "up"|"down",
    "recomputed_tokens": "up"|"down"}. The check runs both."""
    from replaylab.teaching.experiments import compare_strategies

    run = {
        i: compare_strategies(
            model, prompt, n_new=40, acceptance=0.5, k=4, interval=i, strategies=("recompute",)
        )[0]
        for i in (2, 32)
    }
    want = {
        q: ("up" if run[32][q] > run[2][q] else "down") for q in ("peak_bytes", "recomputed_tokens")
    }
    return _answer(
        "recompute interval 2 -> 32",
        answer,
        want,
        "run compare_strategies with interval=2 and interval=32 and compare the recompute rows",
    )
