"""Checks for the notebooks' exercises. Each ``check_*`` takes the learner's answer (a value, a
function or a class), compares it with the library on fixed or random inputs, prints a verdict
(``PASS ...`` / ``FAIL ...`` with the first mismatch; notebooks 01-02 print ``correct:`` /
``not yet:``), records it (``results()``) and returns True or False. A stub that returns None,
is left as None or raises NotImplementedError is reported as not done; any other exception
raised by the learner's code (or by reading the answer) is reported as ``FAIL name: ...``
naming the exception and the learner's line (``grading.guarded``). No check raises,
so an unfinished or broken notebook still runs to the end.

Mini-store exercises (notebooks 03-05) run on ``MiniLayer``: one Mamba-2 layer's recurrence
(``replaylab.scan.ssd_scan``) with fixed parameters, fed ``ScanInputs`` (x, dt, B, C of T tokens).
Triton puzzles (notebook 06) live in ``replaylab.teaching.puzzles`` and record here too.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from replaylab.checks import max_abs_error
from replaylab.scan import ScanResult, ssd_scan, ssd_step
from replaylab.shapes import PUBLISHED_SHAPES, memory_per_sequence
from replaylab.teaching.grading import (
    describe_exception,
    guarded,
    not_implemented,
    record,
    report,
    results,
)
from replaylab.teaching.kernel_harness import kernel_device

__all__ = [
    "record",
    "results",
    "ScanInputs",
    "MiniLayer",
    "mini_layer",
    "check_conv_state_bytes",
    "check_kv_truncate",
    "check_ssd_step",
    "check_resume",
    "check_snapshot_store",
    "check_recompute_store",
    "check_replay_log",
    "check_cost_eviction",
    "check_rollback_work",
    "check_interval_effect",
    "check_snapshot_copy_bytes",
    "check_rerun_at_high_acceptance",
    "recompute_speedup",
    "check_zero_rerun_distances",
    "check_largest_winning_log",
    "check_largest_log_len",
    "kernel_device",
    "check_recompute_break_even",
    "check_tokens_per_round",
    "check_worst_interval",
    "check_cost_eviction_scenario",
    "check_state_share",
    "check_recompute_at_acceptance",
]


def _verdict(name, ok, message):
    print(("correct: " if ok else "not yet: ") + message)
    return record(name, ok)


@guarded("conv-state bytes")
def check_conv_state_bytes(answer) -> bool:
    """Exercise: conv-state bytes of one Nemotron-H 8B sequence (bf16), over all its SSM layers."""
    if answer is None:
        return _verdict("conv-state bytes", False, "return a number of bytes")
    want = memory_per_sequence(PUBLISHED_SHAPES["Nemotron-H 8B"], 1)["conv_state"]
    return _verdict(
        "conv-state bytes",
        int(answer) == want,
        f"{int(answer):,} bytes"
        + ("" if int(answer) == want else " - count channels x (d_conv - 1) x 2 bytes x layers"),
    )


@guarded("KV truncate")
def check_kv_truncate(truncate) -> bool:
    """Exercise: ``truncate(keys, p)`` keeps positions [0, p) of keys (batch, Hkv, T, Dh)."""
    keys = torch.randn(2, 3, 9, 4)
    got = truncate(keys, 5)
    if got is None:
        return _verdict("KV truncate", False, "return the truncated keys")
    if not isinstance(got, torch.Tensor):
        return _verdict("KV truncate", False, f"return a tensor, got {type(got).__name__}")
    if got.shape != (2, 3, 5, 4):
        return _verdict(
            "KV truncate",
            False,
            f"keys (2, 3, 9, 4) truncated to p=5 gave shape {tuple(got.shape)}, expected "
            "(2, 3, 5, 4): positions are dim 2 (batch, Hkv, T, Dh)",
        )
    if not torch.equal(got, keys[:, :, :5]):
        return _verdict(
            "KV truncate",
            False,
            "shape (2, 3, 5, 4) but not the keys of positions 0..4 (keep the first p, in order)",
        )
    return _verdict("KV truncate", True, "shape (2, 3, 5, 4), the keys of positions 0..4")


def _random_step_inputs(generator, batch=2, H=4, P=3, N=5, G=2):
    r = lambda *s: torch.randn(*s, generator=generator)  # noqa: E731
    return dict(
        x=r(batch, H, P),
        dt=r(batch, H).abs(),
        A=-r(H).abs(),
        B=r(batch, G, N),
        C=r(batch, G, N),
        D=r(H),
    )


def _difference(what, got, want, tol=1e-4, head_dim=None):
    """None when ``got`` matches ``want``; otherwise the first mismatch (see ``_compare``) and,
    with ``head_dim``, which heads are wrong."""
    try:
        _compare(what, got, want, tol)
    except _Mismatch as err:
        message = str(err)
        if head_dim is not None and got.shape == want.shape:
            a, e = got.double(), want.double()
            bad = (~((a - e).abs() <= tol + tol * e.abs())).movedim(head_dim, 0)
            wrong = [h for h in range(bad.shape[0]) if bad[h].any()]
            if len(wrong) < bad.shape[0]:
                message += f" (wrong in heads {wrong} of {bad.shape[0]}, the others agree)"
            else:
                message += " (wrong in every head)"
        return message
    return None


@guarded("SSD step")
def check_ssd_step(step) -> bool:
    """Exercise: ``step(state, x, dt, A, B, C, D) -> (y, new_state)`` for the Mamba-2 form with
    Δ = dt as given (no bias, no softplus) and no gate. y and new_state are compared separately
    (the message says which is wrong and in which heads)."""
    g = torch.Generator().manual_seed(0)
    inp = _random_step_inputs(g)
    state = torch.randn(2, 4, 3, 5, generator=g)
    out = step(state.clone(), **inp)
    if out is None:
        return _verdict("SSD step", False, "return (y, new_state)")
    if not isinstance(out, (tuple, list)) or len(out) != 2:
        return _verdict(
            "SSD step", False, f"return a pair (y, new_state), got {type(out).__name__}"
        )
    want_y, want_state = ssd_step(state, **inp)
    bad_y = _difference("y", out[0], want_y, head_dim=1)
    bad_state = _difference("new_state", out[1], want_state, head_dim=1)
    if bad_y is None and bad_state is None:
        err = max(max_abs_error(out[0], want_y), max_abs_error(out[1], want_state))
        return _verdict(
            "SSD step", True, f"max abs error {err:.1e} against replaylab.scan.ssd_step"
        )
    if bad_state is None:
        message = (
            f"new_state agrees, y differs: {bad_y}; y_t = C_t . S_t (the state after this "
            "token) + D x_t"
        )
    else:
        message = "; ".join(m for m in (bad_state, bad_y) if m)
    return _verdict("SSD step", False, message + " - against replaylab.scan.ssd_step")


@guarded("resume from a checkpoint")
def check_resume(resume) -> bool:
    """Exercise: ``resume(checkpoint_state, x, dt, A, B, C) -> y`` continues a scan from a
    checkpoint state (batch, H, P, N) over new inputs x (batch, T, H, P) etc."""
    name = "resume from a checkpoint"
    g = torch.Generator().manual_seed(1)
    x, dt = torch.randn(2, 12, 4, 3, generator=g), torch.rand(2, 12, 4, generator=g)
    A = -torch.rand(4, generator=g)
    B, C = torch.randn(2, 12, 2, 5, generator=g), torch.randn(2, 12, 2, 5, generator=g)
    checkpoint = ssd_scan(x[:, :7], dt[:, :7], A, B[:, :7], C[:, :7]).state
    got = resume(checkpoint.clone(), x[:, 7:], dt[:, 7:], A, B[:, 7:], C[:, 7:])
    if got is None:
        return _verdict(name, False, "return y for the tokens after the checkpoint")
    want = ssd_scan(x, dt, A, B, C).y[:, 7:]
    bad = _difference("y of the 5 tokens after the checkpoint", got, want)
    if bad is None:
        err = max_abs_error(got, want)
        return _verdict(name, True, f"max abs error {err:.1e} against one scan over all 12 tokens")
    from_zero = ssd_scan(x[:, 7:], dt[:, 7:], A, B[:, 7:], C[:, 7:]).y
    if _difference("y", got, from_zero) is None:
        bad += "; it equals a scan of the 5 new tokens from a zero state: start from the checkpoint"
    return _verdict(name, False, f"{bad} - against one scan over all 12 tokens")


# --------------------------------------------------------------------------------------------
# The record of verdicts (read by tests/test_notebook_solutions.py after running a notebook)
# lives in replaylab.teaching.grading (``record``, ``results``, imported above).

_done = report
_not_implemented = not_implemented


# --------------------------------------------------------------------------------------------
# One Mamba-2 layer, reduced to its recurrence, for the mini stores of notebooks 03-05


@dataclass(frozen=True)
class ScanInputs:
    """The scan inputs of T tokens of one Mamba-2 layer (what a replay log keeps per token):
    x (batch, T, H, P), dt (batch, T, H) raw (before bias and softplus), B and C
    (batch, T, G, N). ``inputs[a:b]`` selects tokens, ``len(inputs)`` is T,
    ``ScanInputs.cat([...])`` joins along the tokens."""

    x: torch.Tensor
    dt: torch.Tensor
    B: torch.Tensor
    C: torch.Tensor

    def __len__(self) -> int:
        return self.x.shape[1]

    def __getitem__(self, tokens: slice) -> ScanInputs:
        if not isinstance(tokens, slice):
            raise TypeError(f"ScanInputs: index with a slice of tokens, got {tokens!r}")
        return ScanInputs(*(t[:, tokens] for t in (self.x, self.dt, self.B, self.C)))

    @staticmethod
    def cat(parts) -> ScanInputs:
        parts = list(parts)
        if not parts:
            raise ValueError("ScanInputs.cat: need at least one part")
        return ScanInputs(
            *(torch.cat([getattr(p, f) for p in parts], 1) for f in ("x", "dt", "B", "C"))
        )

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (self.x, self.dt, self.B, self.C))


@dataclass(frozen=True)
class MiniLayer:
    """The recurrence of one Mamba-2 layer with fixed parameters A, D, dt_bias (H,):
    ``scan(state, inputs)`` runs ``replaylab.scan.ssd_scan`` from ``state`` (batch, H, P, N)
    with Δ = softplus(dt + dt_bias), as the real layer does."""

    A: torch.Tensor
    D: torch.Tensor
    dt_bias: torch.Tensor
    P: int
    N: int
    G: int

    @property
    def H(self) -> int:
        return self.A.shape[0]

    def zero_state(self, batch) -> torch.Tensor:
        """The state before the first token: zeros (batch, H, P, N), fp32."""
        return torch.zeros(batch, self.H, self.P, self.N)

    def scan(self, state, inputs: ScanInputs, return_states=False) -> ScanResult:
        """y (batch, T, H, P), the state after the last token and, with ``return_states``,
        the state after every token (batch, T, H, P, N)."""
        return ssd_scan(
            inputs.x,
            inputs.dt,
            self.A,
            inputs.B,
            inputs.C,
            self.D,
            dt_bias=self.dt_bias,
            dt_softplus=True,
            initial_state=state,
            return_states=return_states,
        )

    def random_inputs(self, batch, T, generator=None) -> ScanInputs:
        """Random scan inputs of T tokens."""

        def r(*shape):
            return torch.randn(*shape, generator=generator)

        return ScanInputs(
            r(batch, T, self.H, self.P),
            r(batch, T, self.H),
            r(batch, T, self.G, self.N),
            r(batch, T, self.G, self.N),
        )


def mini_layer(seed=0, H=4, P=3, N=5, G=2) -> MiniLayer:
    """A ``MiniLayer`` with random parameters (awkward sizes on purpose)."""
    g = torch.Generator().manual_seed(seed)
    return MiniLayer(
        A=-torch.rand(H, generator=g) - 0.1,
        D=torch.randn(H, generator=g),
        dt_bias=torch.rand(H, generator=g) - 0.5,
        P=P,
        N=N,
        G=G,
    )


class _Mismatch(Exception):
    pass


def _compare(what, got, want, tol=1e-4):
    """Raise _Mismatch naming the first element out of tolerance (or a shape / type error)."""
    if not isinstance(got, torch.Tensor):
        raise _Mismatch(f"{what}: expected a tensor, got {type(got).__name__}")
    if got.shape != want.shape:
        raise _Mismatch(f"{what}: shape {tuple(got.shape)}, expected {tuple(want.shape)}")
    a, e = got.double(), want.double()
    bad = ~((a - e).abs() <= tol + tol * e.abs())
    if bad.any():
        where = tuple(int(i) for i in bad.nonzero()[0])
        raise _Mismatch(
            f"{what}: max abs error {max_abs_error(a, e):.2e}; first mismatch at {where}: "
            f"{float(a[where]):.6g} vs reference {float(e[where]):.6g}"
        )


def _equals(got, want) -> bool:
    """``got`` is a tensor equal to ``want`` within the checks' tolerance (for FAIL hints)."""
    return (
        isinstance(got, torch.Tensor)
        and got.shape == want.shape
        and torch.allclose(got.double(), want.double(), rtol=1e-4, atol=1e-4)
    )


def _reference_path(layer, batch, path):
    """States after every token of ``path`` (ScanInputs) from zeros and the outputs:
    (states (batch, T, H, P, N) or None, y)."""
    if not path:
        return None, None
    res = layer.scan(layer.zero_state(batch), ScanInputs.cat(path), return_states=True)
    return res.states, res.y


def _run_ops(name, ops_fn, seeds=(0, 1, 2), n_ops=14):
    """Run the random operation sequences ``ops_fn(generator, log)`` for each seed; report the
    first mismatch with every operation that led to it (at most ``n_ops``; the last one is where
    it showed: the cause may be any earlier one, a truncation say)."""
    total = 0
    for seed in seeds:
        g = torch.Generator().manual_seed(seed)
        log: list[str] = []
        try:
            total += ops_fn(g, log, n_ops)
        except NotImplementedError:
            return _not_implemented(name)
        except _Mismatch as err:
            trail = "; ".join(log)
            return _done(name, False, f"seed {seed}, after [{trail}]: {err}")
        except Exception as err:  # the learner's code raised: report it, do not raise
            where = f"in [{'; '.join(log)}]" if log else "building the store"
            return _done(name, False, f"seed {seed}, {where}: {describe_exception(err)}")
    return _done(
        name,
        True,
        f"{total} operations in {len(seeds)} sequences agree with replaylab.scan.ssd_scan",
    )


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
                y = store.advance(new)
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
                raise _Mismatch(f"{err}{hint}") from None
        return len(_SNAPSHOT_SCRIPT) + n_ops

    return _run_ops("snapshot store", ops)


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
                y = store.advance(new)
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
                replay.append(new)
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
                message += ": a tie in tokens goes to the least recently used (smallest last_used)"
            else:
                message += (
                    ": evict the copy with the fewest tokens back to the next older kept position "
                    "(0 when none is older)"
                )
            return _done(name, False, message)
    return _done(name, True, f"same choice as replaylab.cache.choose_victim on {len(cases)} lists")


# --------------------------------------------------------------------------------------------
# Questions with one right answer: the learner computes an answer; the check computes it from
# the library (or from a live run) and compares


def _answer(name, answer, want, explain, rel=0.0):
    if answer is None or answer is Ellipsis:
        return _done(name, False, "no answer yet (replace None with your answer)")
    if isinstance(want, float) or rel:
        try:
            ok = abs(float(answer) - float(want)) <= rel * abs(float(want)) + 1e-12
        except (TypeError, ValueError) as err:
            return _done(name, False, f"{answer!r}: expected a number; {describe_exception(err)}")
    else:
        ok = answer == want
    return _done(name, ok, f"{answer!r}" + ("" if ok else f" - {explain}"))


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
    return _answer(
        "bytes of one snapshot",
        None if answer is None else int(answer),
        want,
        "SSM layers x (H x P x N x 4 bytes + (d_conv - 1) x conv channels x 2 bytes)",
    )


@guarded("tokens re-run under a budget at acceptance 0.9")
def check_rerun_at_high_acceptance(answer, model, prompt, fractions=(0.9, 0.7, 0.5)) -> bool:
    """Notebook 04: at acceptance 0.9, the most tokens any eviction policy re-runs at any of the
    budgets ``fractions`` (of the unbudgeted peak). The check runs ``budget_outcomes``."""
    from replaylab.teaching.experiments import budget_outcomes

    rows = budget_outcomes(
        model, prompt, n_new=24, budget_fractions=list(fractions), acceptance=0.9
    )
    want = max(r["recomputed_tokens"] for r in rows)
    return _answer(
        "tokens re-run under a budget at acceptance 0.9",
        None if answer is None else int(answer),
        want,
        "run budget_outcomes(..., acceptance=0.9) and take the largest recomputed_tokens",
    )


@guarded("distances where recompute re-runs nothing")
def check_zero_rerun_distances(answer, model) -> bool:
    """Notebook 05: at which distances (of those ``restore_cost_vs_distance`` visits with
    interval 16) does recompute re-run no token? The check runs it."""
    from replaylab.teaching.experiments import restore_cost_vs_distance

    rows = restore_cost_vs_distance(model, "recompute", interval=16)
    want = sorted(r["distance"] for r in rows if r["recomputed_tokens"] == 0)
    got = None if answer is None else sorted(int(d) for d in answer)
    return _answer(
        "distances where recompute re-runs nothing",
        got,
        want,
        "a restore lands on a checkpoint when 32 + distance is a multiple of the interval",
    )


@guarded("largest log where replay_step beats ssu at batch 128")
def check_largest_winning_log(answer) -> bool:
    """Notebook 06: from ``data/bench_kernels.json`` (H200), the largest measured log length at
    which ``replay_step`` decodes (T=1) faster than ``selective_state_update`` at batch 128."""
    from replaylab.results import load_bench

    rows = [r for r in load_bench()["rows"] if "us" in r and r["batch"] == 128 and r["T"] == 1]
    ssu = next(r["us"] for r in rows if r["provider"] == "ssu")
    want = max(r["log_len"] for r in rows if r["provider"] == "replay_step" and r["us"] < ssu)
    return _answer(
        "largest log where replay_step beats ssu at batch 128",
        answer,
        want,
        "filter rows by provider, batch=128, T=1 and compare 'us' with the ssu row",
    )


@guarded("largest log_len that leaves room for T tokens")
def check_largest_log_len(answer, Lmax=16, T=2) -> bool:
    """Notebook 06: the largest ``log_len`` at which ``replay_step`` can still append T=2 new
    tokens to a log of capacity Lmax=16. The check calls the reference with ``answer`` (must
    work) and ``answer + 1`` (must be refused)."""
    from replaylab.kernels.replay import replay_step

    name = "largest log_len that leaves room for T tokens"
    if answer is None:
        return _done(name, False, "no answer yet (replace None with your answer)")
    H, P, N, G = 2, 4, 8, 1
    device = kernel_device()

    def attempt(n):
        g = torch.Generator().manual_seed(0)
        r = lambda *s: torch.randn(*s, generator=g).to(device)  # noqa: E731
        replay_step(
            r(1, H, P, N),
            torch.zeros(1, dtype=torch.int32, device=device),
            r(1, Lmax, H, P),
            r(1, Lmax, H),
            r(1, Lmax, G, N),
            r(1, Lmax, G, N),
            torch.tensor([n], dtype=torch.int32, device=device),
            r(1, T, H, P),
            r(1, T, H),
            r(1, T, G, N),
            r(1, T, G, N),
            -torch.rand(H).to(device),
        )

    n = int(answer)
    try:
        attempt(n)
    except ValueError as err:
        return _done(name, False, f"{n}: replay_step refused it ({err})")
    try:
        attempt(n + 1)
    except ValueError:
        return _done(name, True, f"{n}: accepted, and {n + 1} is refused")
    return _done(name, False, f"{n}: {n + 1} is accepted too; look for a larger one")


def recompute_speedup(acceptance, k):
    """Recompute's predicted speedup over plain decoding in ``AcceptanceExplorer``'s default
    setting (its shape, parameter count, hardware, batch and interval), computed by
    ``replaylab.costmodel`` without building the widget."""
    import inspect

    from replaylab import costmodel as cm
    from replaylab.teaching.widgets import AcceptanceExplorer

    d = {n: p.default for n, p in inspect.signature(AcceptanceExplorer).parameters.items()}
    hardware = d["hardware"] or cm.HARDWARE["H200"]
    w = cm.Workload(batch=d["batch"], k=k, acceptance=acceptance, interval=d["interval"])
    plain = cm.plain_decode_seconds_per_token(d["shape"], w, hardware, d["n_params"])
    out = cm.predict(d["shape"], w, hardware, d["n_params"])
    return plain / out["recompute"]["seconds_per_token"]


@guarded("acceptance where recompute stops paying (k=8)")
def check_recompute_break_even(answer, k=8) -> bool:
    """Notebook 07: on the explorer's slider grid (acceptance 0.00, 0.05, ..., 1.00), the
    highest acceptance at which recompute's predicted speedup over plain decoding is below 1
    for draft length k=8 (AcceptanceExplorer's defaults otherwise)."""
    below = [i / 20 for i in range(21) if recompute_speedup(i / 20, k) < 1]
    want = max(below) if below else None
    return _answer(
        "acceptance where recompute stops paying (k=8)",
        None if answer is None else round(float(answer), 2),
        want,
        "move the acceptance slider at k=8 and read recompute's bar",
        rel=1e-9,
    )


@guarded("tokens per round with falling acceptance")
def check_tokens_per_round(answer, acceptance=(0.9, 0.8, 0.6, 0.3)) -> bool:
    """Notebook 07: tokens per round when draft i is accepted with probability acceptance[i]
    and a rejection ends the round: 1 + E[accepted drafts]."""
    from replaylab.costmodel import expected_accepted

    want = 1 + expected_accepted(len(acceptance), acceptance)
    return _answer(
        "tokens per round with falling acceptance",
        answer,
        float(want),
        "draft i counts only if drafts 1..i are all accepted: add the running products",
        rel=1e-6,
    )


@guarded("interval furthest above the optimum")
def check_worst_interval(answer, n=64, intervals=(2, 4, 8, 16, 32)) -> bool:
    """Notebook 08: of ``intervals``, the one whose steps per restore is the largest multiple
    of the optimum (``revolve_cost``) with as many states kept, for an n-step chain."""
    from replaylab.costmodel import interval_tradeoff, revolve_cost

    def ratio(i):
        t = interval_tradeoff(n, i)
        return t["steps_per_restore"] / (revolve_cost(n, t["states_kept"] - 1) / n)

    want = max(intervals, key=ratio)
    return _answer(
        "interval furthest above the optimum",
        answer,
        want,
        "divide each interval's steps per restore by the optimum's in the table",
    )


@guarded("cost-aware eviction in section 3")
def check_cost_eviction_scenario(answer, model) -> bool:
    """Notebook 08: section 3's scenario under eviction="cost": which snapshot is evicted
    ("first" or "second") and how many tokens does ``restore(first)`` re-run?
    ``answer``: {"evicted": ..., "tokens_rerun": ...}."""
    from replaylab.cache import CacheConfig, HybridCache

    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, model.cfg.vocab_size, (1, 21), generator=g)
    cache = HybridCache(model, 1, CacheConfig("snapshot", eviction="cost"))
    with torch.no_grad():
        model(ids[:, :12], cache)
        first = cache.snapshot()
        model(ids[:, 12:18], cache)
        cache.snapshot()
        model(ids[:, 18:], cache)
        cache.set_budget(cache.total_bytes() - 1)
        cache.set_budget(None)
        cache.restore(first)
    rerun = cache.stats.recomputed_tokens
    want = {
        "evicted": "first" if cache.stats.fallback_restores else "second",
        "tokens_rerun": rerun,
    }
    return _answer(
        "cost-aware eviction in section 3",
        answer,
        want,
        "re-run section 3 with CacheConfig('snapshot', eviction='cost')",
    )


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
        ok = abs(float(value) - ours) <= 1e-3 * ours and word == (
            "more" if ours > nemotron else "less"
        )
    except (TypeError, ValueError) as err:
        return _done(
            label,
            False,
            f"{answer!r}: expected a pair (share, 'more' or 'less'); {describe_exception(err)}",
        )
    return _done(
        label,
        ok,
        f"{answer!r}" + ("" if ok else " - memory_per_sequence(shape, 65536): state / total"),
    )


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
    got = None if answer is None else tuple(int(v) for v in answer)
    return _answer(
        f"recompute at acceptance {acceptance}",
        got,
        want,
        "run section 3's loop with SyntheticDrafter(reference, 0.5, seed=0)",
    )


# --------------------------------------------------------------------------------------------
# Plumbing for the solutions / stubs double run (tests/test_notebook_solutions.py)

EXERCISE_KEY = "exercise"  # cell metadata key holding an exercise cell's id


def solution_sections(path) -> dict[str, str]:
    """The reference answers in a solutions file: ``# %% <id>`` starts the section for the
    notebook cell whose metadata has ``{"exercise": "<id>"}``. Returns {id: source}."""
    import re
    from pathlib import Path

    sections: dict[str, list[str]] = {}
    current = None
    for line in Path(path).read_text(encoding="utf-8").splitlines():
        m = re.match(r"^# %% (\S+)\s*$", line)
        if m:
            current = m.group(1)
            if current in sections:
                raise ValueError(f"{path}: section {current!r} appears twice")
            sections[current] = []
        elif current is not None:
            sections[current].append(line)
    return {k: "\n".join(v).strip() + "\n" for k, v in sections.items()}


def exercise_cells(nb) -> dict[str, int]:
    """{exercise id: cell index} of a notebook (an ``nbformat`` node or the parsed JSON)."""
    found = {}
    for i, cell in enumerate(nb["cells"]):
        key = cell.get("metadata", {}).get(EXERCISE_KEY)
        if key:
            if key in found:
                raise ValueError(f"exercise id {key!r} on cells {found[key]} and {i}")
            found[key] = i
    return found


# --------------------------------------------------------------------------------------------
# Notebook 06, the log-length explorer (issue 15)


@guarded("best log length at batch {batch} (measured, cost model)")
def check_best_log_length(answer, batch=8, max_L=64) -> bool:
    """Notebook 06: at ``batch``, the pair (measured L with the lowest amortised decode time,
    step + fold(L) / L, in ``data/bench_kernels.json``; the integer L in 1..max_L at which the
    cost model's amortised bytes, ``kernel_bytes`` of replay_step over a log of L plus fold(L)
    / L for the benchmark's layer shape, are lowest)."""
    from replaylab.bench.kernels import SHAPE, amortised_decode
    from replaylab.costmodel import kernel_bytes
    from replaylab.results import load_bench

    name = f"best log length at batch {batch} (measured, cost model)"
    bench = load_bench()
    shape = bench.get("shape") or SHAPE
    rows = [r for r in amortised_decode(bench) if r["batch"] == batch]
    measured = min(rows, key=lambda r: r["amortised_us"])["L"]

    def amortised(L):
        step = kernel_bytes("replay_step", batch, L, 1, **shape)
        return step + kernel_bytes("fold", batch, L, 0, **shape) / L

    model = min(range(1, max_L + 1), key=amortised)
    if answer is not None and answer is not Ellipsis:
        try:
            answer = tuple(int(v) for v in answer)
        except (TypeError, ValueError) as err:
            return _done(
                name,
                False,
                f"{answer!r}: expected a pair (measured_L, model_L); {describe_exception(err)}",
            )
    return _answer(
        name,
        answer,
        (measured, model),
        "measured: the row of amortised_decode(bench) at this batch with the least "
        "amortised_us; model: the L in 1..64 minimising kernel_bytes('replay_step', batch, L, "
        "1, **bench['shape']) + kernel_bytes('fold', batch, L, 0, **bench['shape']) / L",
    )


# --- notebooks 08 and 09: the caveats and the roofline (issue 15) --------------------------


@guarded("beam search's best log length for Bamba 9B")
def check_beam_log_length(answer) -> bool:
    """Notebook 08: the best replay log length for beam search on Bamba 9B's shape
    (``costmodel.best_log_length`` over L = 2..256), and whether it is "longer" or "shorter"
    than Nemotron-H 8B's. Answer: (L, "longer" or "shorter")."""
    from replaylab import costmodel as cm
    from replaylab.shapes import PUBLISHED_SHAPES

    def best(name):
        m = cm.model_costs(PUBLISHED_SHAPES[name], cm.Workload(), 8e9)
        return cm.best_log_length(m, "beam search", range(2, 257))

    bamba, nemotron = best("Bamba 9B"), best("Nemotron-H 8B")
    want = (bamba, "longer" if bamba > nemotron else "shorter")
    return _answer(
        "beam search's best log length for Bamba 9B",
        None if answer is None else tuple(answer),
        want,
        "build cm.model_costs for Bamba 9B's shape and call cm.best_log_length(m, 'beam search', "
        "range(2, 257)); one group (G = 1) makes its log entries smaller than Nemotron-H 8B's",
    )


def roofline_floor_ms(context_len=32768, batch=64, strategy="replay") -> float:
    """Notebook 09's roofline at another context: ms per decode step of Nemotron-H 8B (8.1e9
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
    """Notebook 09: replay's floor (ms per decode step) for Nemotron-H 8B at batch 64 and 32K
    tokens (32768) of context, as section 6 computes it at 8K."""
    return _answer(
        "replay's roofline floor at 32K context, batch 64",
        answer,
        roofline_floor_ms(),
        "section 6's cm.decode_floor_seconds with context_len=32768, batch 64, in ms",
        rel=1e-3,
    )
