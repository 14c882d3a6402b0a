"""What the checks of notebooks 01-09 share: the verdict lines, the comparison that names the
first mismatch, the answer to a question with one right answer, and one Mamba-2 layer reduced
to its recurrence for the mini stores of notebooks 03-05. The record of verdicts (``record``,
``results``) and the guard around learner code (``guarded``) live in ``grading``.

Glossary:
    verdict     ``_verdict`` prints ``correct:`` / ``not yet:`` (notebooks 01-02); ``_done``
                (``grading.report``) prints ``PASS name: ...`` / ``FAIL name: ...``
    _Mismatch   raised by ``_compare`` with the first element out of tolerance (and its index)
    ScanInputs  x (batch, T, H, P), dt (batch, T, H) raw, B and C (batch, T, G, N): what a
                replay log keeps per token
    MiniLayer   A, D, dt_bias (H,), P, N, G; ``scan(state, inputs)`` is ``scan.ssd_scan`` from
                ``state`` (batch, H, P, N) with Δ = softplus(dt + dt_bias)
"""

from __future__ import annotations

import operator
from dataclasses import dataclass

import numpy as np
import torch

from replaylab.checks import max_abs_error
from replaylab.scan import ScanResult, ssd_scan
from replaylab.teaching.grading import describe_exception, not_implemented, record, report


def _verdict(name, ok, message):
    print(("correct: " if ok else "not yet: ") + message)
    return record(name, ok)


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


_done = report


_not_implemented = not_implemented


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

    def clone(self) -> ScanInputs:
        """A copy to hand a learner's code: the checks keep the original for their reference,
        so an answer that changes its inputs in place is judged against what it was given."""
        return ScanInputs(*(t.clone() for t in (self.x, self.dt, self.B, self.C)))


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


def whole_number(answer):
    """``answer`` as an int when it is a whole number (an int, or a float, numpy or 0-d tensor
    value equal to one), else None: 1474560.99 is not 1474560, True is not 1, and the text
    "12" is not 12. A value ``float`` cannot read raises."""
    if isinstance(answer, torch.Tensor):
        if answer.dim():  # [4] is not 4, as for numpy arrays below
            return None
        answer = answer.item()
    if isinstance(answer, str):
        float(answer)  # a text that is no number raises: ``guarded`` reports it
        return None  # one that is, is still not the number
    if isinstance(answer, (bool, np.bool_)) or (isinstance(answer, np.ndarray) and answer.ndim):
        return None  # a boolean, or an array of one value ([4] is not 4)
    try:
        return operator.index(answer)  # ints of any size, numpy ints, exactly
    except TypeError:
        pass
    value = float(answer)  # what cannot be read as a number raises: ``guarded`` reports it
    return int(value) if value.is_integer() else None


def _plain(value):
    """An answer as the checks compare it: words without case or surrounding spaces
    ("Recompute " is "recompute"), lists as tuples, inside dicts and sequences too."""
    if isinstance(value, str):
        return value.strip().lower()
    if isinstance(value, dict):
        return {_plain(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return tuple(_plain(v) for v in value)
    return value


def _answer(name, answer, want, explain, rel=0.0):
    if answer is None or answer is Ellipsis:
        return _done(name, False, "no answer yet (replace None with your answer)")
    if isinstance(want, float) or rel:
        try:
            ok = abs(float(answer) - float(want)) <= rel * abs(float(want)) + 1e-12
        except (TypeError, ValueError) as err:
            return _done(name, False, f"{answer!r}: expected a number; {describe_exception(err)}")
    else:
        ok = _plain(answer) == _plain(want)
    return _done(name, ok, f"{answer!r}" + ("" if ok else f" - {explain}"))
