"""Checks of notebook 05 (recompute and replay): a mini recompute store and a mini replay log on
``MiniLayer``, each against a reference scan after every operation and against its memory
budget (states found among the tensors it holds, in any shape), and the distances at which
recompute re-runs nothing.

Glossary: c, the checkpoint position; j, the tokens logged after it; S_{c+j} the state after
them; interval, recompute's checkpoint spacing.
"""

from __future__ import annotations

import torch

from replaylab.scan import ssd_scan
from replaylab.teaching.exercises_common import (
    MiniLayer,
    ScanInputs,
    _answer,
    _compare,
    _done,
    _equals,
    _Mismatch,
    _reference_path,
    _run_ops,
    mini_layer,
    whole_number,
)
from replaylab.teaching.grading import guarded


@guarded("recompute store")
def check_recompute_store(store_class, layer=None, interval=3) -> bool:
    """Exercise (notebook 05): a mini recompute store for one Mamba-2 layer.

    ``store_class(layer, batch, interval)`` with ``.state``, ``.position``, ``.checkpoints``
    (dict position -> state), ``.advance(inputs) -> y`` and ``.restore(p) -> tokens re-run``,
    checked on random advances (1-5 tokens, so one call may cross several checkpoints) and
    restores to random earlier positions: outputs and states against a reference scan, the
    checkpoints held (exactly the multiples of ``interval`` up to the position), the
    tokens re-run (p minus the last checkpoint at or before p), and the bytes of state the store
    holds (any tensor reachable from it, in any shape, whose values are a state along the
    branch) against recompute's budget: the checkpoints and the current state."""
    layer = layer or mini_layer()
    batch = 2

    def ops(g, log, n_ops):
        store = store_class(layer, batch, interval)
        path: list[ScanInputs] = []
        for _ in range(n_ops):
            pos = sum(len(p) for p in path)
            if float(torch.rand(1, generator=g)) < 0.35 and pos > 0:
                p = int(torch.randint(pos + 1, (1,), generator=g))
                log.append(f"restore({p}) from position {pos}")
                rerun = store.restore(p)
                path = [ScanInputs.cat(path)[:p]] if p else []
                want = p - (p // interval) * interval
                if rerun != want:
                    raise _Mismatch(
                        f"restore({p}) returned {rerun} tokens re-run, expected {want} "
                        f"(from the checkpoint at {p - want})"
                    )
            else:
                T = int(torch.randint(1, 6, (1,), generator=g))
                new = layer.random_inputs(batch, T, g)
                log.append(f"advance({T} tokens) from position {pos}")
                y = store.advance(new.clone())
                path.append(new)
                _, ref_y = _reference_path(layer, batch, path)
                _compare("y returned by advance", y, ref_y[:, -T:])
            pos = sum(len(p) for p in path)
            if store.position != pos:
                raise _Mismatch(f"position is {store.position}, expected {pos}")
            states, _ = _reference_path(layer, batch, path)

            def state_at(q, states=states):
                return layer.zero_state(batch) if q == 0 else states[:, q - 1]

            _compare("state", store.state, state_at(pos))
            want_keys = list(range(0, pos + 1, interval))
            keys = sorted(store.checkpoints)
            if keys != want_keys:
                raise _Mismatch(f"checkpoints held at {keys}, expected {want_keys}")
            for q in keys:
                _compare(f"checkpoint at {q}", store.checkpoints[q], state_at(q))
            if pos:  # the bytes of state the store holds, against recompute's budget
                found, nbytes, _ = _held_states(store, states.transpose(0, 1))
                extra = [q + 1 for q in found if q + 1 not in keys and q + 1 != pos]
                if extra:
                    one = state_at(pos).numel() * 4
                    raise _Mismatch(
                        f"the store holds the states at positions {extra[:8]}"
                        f"{' ...' if len(extra) > 8 else ''} besides its checkpoints and current "
                        f"state: about {nbytes} bytes of state against recompute's budget of "
                        f"{(len(keys) + 1) * one} ({len(keys)} checkpoints and the current "
                        f"state, {one} bytes each); a recompute store keeps only the checkpoints "
                        "and re-runs the kept tokens from the latest one on restore"
                    )
        return n_ops

    return _run_ops("recompute store", ops)


def _held_tensors(obj, seen=None, depth=0):
    """Every tensor reachable from obj's attributes, dicts, lists and tuples (not the layer)."""
    seen = seen if seen is not None else set()
    if id(obj) in seen or depth > 4:
        return []
    seen.add(id(obj))
    if isinstance(obj, torch.Tensor):
        return [obj]
    if isinstance(obj, dict):
        children = list(obj.values())
    elif isinstance(obj, (list, tuple)):
        children = list(obj)
    elif hasattr(obj, "__dict__") and not isinstance(obj, (MiniLayer, type)):
        children = list(vars(obj).values())
    else:
        return []
    found = []
    for child in children:
        found += _held_tensors(child, seen, depth + 1)
    return found


def _state_tensors(obj, state_shape):
    """Tensors shaped like a state (..., H, P, N) reachable from obj's attributes."""
    return [t for t in _held_tensors(obj) if tuple(t.shape[-3:]) == tuple(state_shape)]


def _held_states(obj, states):
    """The states among ``states`` (k, batch, H, P, N) that obj holds, in any shape: every tensor
    reachable from it whose element count is a multiple of H·P·N is cut into rows of H·P·N
    values, and a row whose sorted values equal one sequence's state is that state (so a state
    flattened, reshaped or with its axes permuted is found; inputs never match). Returns
    (sorted indices k found, bytes of the rows found, shapes of the tensors holding them)."""
    k, batch = states.shape[:2]
    if k == 0:
        return [], 0, []
    hpn = states[0, 0].numel()
    ref = states.reshape(k * batch, hpn).double().sort(dim=1).values
    owner = torch.arange(k).repeat_interleave(batch)
    found, nbytes, shapes, seen = set(), 0, [], set()
    for t in _held_tensors(obj):
        key = (t.data_ptr(), tuple(t.shape), tuple(t.stride()))
        if key in seen or not t.is_floating_point() or not t.numel() or t.numel() % hpn:
            continue
        seen.add(key)
        rows = t.detach().reshape(-1, hpn).double().sort(dim=1).values
        close = ((rows[:, None] - ref[None]).abs() <= 1e-4 + 1e-4 * ref.abs()[None]).all(-1)
        if close.any():
            found |= set(owner[close.any(0)].tolist())
            nbytes += int(close.any(1).sum()) * hpn * t.element_size()
            shapes.append(tuple(t.shape))
    return sorted(found), nbytes, shapes


def _raw_dt_hint(layer, start, inputs, got):
    """A FAIL hint when ``got`` is the fold of ``inputs`` from ``start`` with Δ = dt as logged
    (or softplus(dt) without the bias): the logged dt is raw."""
    for how, kw in (
        ("the logged dt itself", dict(dt_bias=None, dt_softplus=False)),
        ("softplus(dt) without dt_bias", dict(dt_bias=None, dt_softplus=True)),
    ):
        wrong = ssd_scan(
            inputs.x, inputs.dt, layer.A, inputs.B, inputs.C, layer.D, initial_state=start, **kw
        ).state
        if _equals(got, wrong):
            return (
                f" - it is the fold with Δ = {how}: the log holds the raw dt (before its bias "
                "and softplus), and the step is Δ = softplus(dt + dt_bias); layer.scan "
                "applies both (the stub's hint)"
            )
    return ""


@guarded("replay log")
def check_replay_log(log_class, layer=None) -> bool:
    """Exercise (notebook 05): a mini replay log for one Mamba-2 layer.

    ``log_class(layer, checkpoint)`` with ``len(log)``, ``.append(inputs)``,
    ``.truncate_to(j)`` and ``.state(j=None) -> S_{c+j}``, checked on random appends,
    truncations and folds against a reference scan from the checkpoint. The log must keep
    inputs, not states: besides the checkpoint it may hold no state-shaped tensor and no state
    in any other shape (found by its values), the checkpoint must come out unchanged, and ``state`` must return a new tensor (the check
    changes each one it gets in place, as a caller advancing it would)."""
    layer = layer or mini_layer()
    batch = 2
    state_shape = (layer.H, layer.P, layer.N)

    def ops(g, log, n_ops):
        checkpoint = torch.randn(batch, *state_shape, generator=g)
        original = checkpoint.clone()
        replay = log_class(layer, checkpoint)
        entries: list[ScanInputs] = []
        # what a log that only moves a cursor on truncate_to, and appends after the stale
        # entries, folds: every entry ever appended, in order (for the FAIL hint)
        stale: list[ScanInputs] = []
        for _ in range(n_ops):
            n = sum(len(e) for e in entries)
            roll = float(torch.rand(1, generator=g))
            if roll < 0.25 and n:
                j = int(torch.randint(n + 1, (1,), generator=g))
                log.append(f"truncate_to({j}) from {n}")
                replay.truncate_to(j)
                entries = [ScanInputs.cat(entries)[:j]] if j else []
            elif roll < 0.55:
                j = (
                    None
                    if n == 0 or float(torch.rand(1, generator=g)) < 0.5
                    else int(torch.randint(n + 1, (1,), generator=g))
                )
                log.append(f"state({'' if j is None else j})")
                got = replay.state() if j is None else replay.state(j)
                upto = n if j is None else j
                want = (
                    checkpoint
                    if upto == 0
                    else layer.scan(original, ScanInputs.cat(entries)[:upto]).state
                )
                try:
                    _compare(f"state after {upto} of {n} logged tokens", got, want)
                except _Mismatch as err:
                    hint = (
                        ""
                        if upto == 0
                        else _raw_dt_hint(layer, original, ScanInputs.cat(entries)[:upto], got)
                    )
                    if not hint and upto and stale and sum(len(e) for e in stale) >= upto:
                        behind = layer.scan(original, ScanInputs.cat(stale)[:upto]).state
                        if _equals(got, behind):
                            hint = (
                                " - it is the fold of the entries as they were appended, "
                                "the ones truncate_to dropped still in place: after "
                                "truncate_to(j), the next append must go at position j "
                                "(drop or overwrite the entries past it), not after them"
                            )
                    raise _Mismatch(f"{err}{hint}") from None
                if not torch.equal(checkpoint, original):
                    raise _Mismatch("the checkpoint was modified: a fold must not write into it")
                want = want.clone()
                got.add_(1.0)  # a caller advancing what it got, in place
                again = replay.state() if j is None else replay.state(j)
                if not torch.allclose(again, want, rtol=1e-5, atol=1e-5):
                    raise _Mismatch(
                        f"state({'' if j is None else j}) returned a tensor the log keeps (its "
                        "checkpoint?): after the caller changed it in place, the next call gave "
                        "another state; return a new tensor (e.g. .clone())"
                    )
            else:
                T = int(torch.randint(1, 4, (1,), generator=g))
                new = layer.random_inputs(batch, T, g)
                log.append(f"append({T} tokens) at {n}")
                replay.append(new.clone())
                entries.append(new)
                stale.append(new)
            n = sum(len(e) for e in entries)
            if len(replay) != n:
                raise _Mismatch(f"len(log) is {len(replay)}, expected {n}")
            if not torch.equal(checkpoint, original):
                raise _Mismatch("the checkpoint was modified: a fold must not write into it")
            held = _state_tensors(replay, state_shape)
            if len({t.data_ptr() for t in held}) > 1:
                raise _Mismatch(
                    f"the log holds {len(held)} state-shaped tensors; a replay log keeps one "
                    "state (the checkpoint) and per-token inputs"
                )
            if n:  # a state cached in any shape, found by its values
                states = layer.scan(original, ScanInputs.cat(entries), return_states=True).states
                found, nbytes, shapes = _held_states(replay, states.transpose(0, 1))
                if found:
                    raise _Mismatch(
                        f"the log holds the states after {[q + 1 for q in found][:8]} logged "
                        f"tokens ({nbytes} bytes, in tensors of shape "
                        f"{', '.join(map(str, shapes))}); a replay log keeps one state (the "
                        "checkpoint) and per-token inputs, and folds them when asked: a cached "
                        "state, in any shape, is the memory replay exists to save"
                    )
        return n_ops

    return _run_ops("replay log", ops)


@guarded("distances where recompute re-runs nothing")
def check_zero_rerun_distances(answer, model) -> bool:
    """Notebook 05: at which distances (of those ``restore_cost_vs_distance`` visits with
    interval 16) does recompute re-run no token? The check runs it."""
    from replaylab.teaching.experiments import restore_cost_vs_distance

    rows = restore_cost_vs_distance(model, "recompute", interval=16)
    want = sorted(r["distance"] for r in rows if r["recomputed_tokens"] == 0)
    got = None if answer is None else [whole_number(d) for d in answer]
    if got is not None and None in got:
        return _done(
            "distances where recompute re-runs nothing", False, f"{answer!r}: expected integers"
        )
    return _answer(
        "distances where recompute re-runs nothing",
        None if got is None else sorted(got),
        want,
        "a restore lands on a checkpoint when 32 + distance is a multiple of the interval",
    )
