"""Checks for notebook 11 ("Beyond Mamba-2"). Each ``check_*`` takes the learner's function,
compares it with the library's reference on random inputs, prints ``PASS ...`` / ``FAIL ...``
with the first mismatch, records the verdict (``replaylab.exercises.results()``) and returns
True or False. A stub that returns None or raises NotImplementedError is reported as not done;
any other exception is reported as a failure naming it and the learner's line; no check
raises.

Glossary: see ``replaylab.scan`` (Gated DeltaNet: q, k (batch, T, Hk, K), v (batch, T, H, V),
g = log α and β (batch, T, H), state S (batch, H, K, V)).
"""

from __future__ import annotations

import torch

from replaylab.checks import max_abs_error
from replaylab.exercises_common import NOT_IMPLEMENTED, describe_exception, guarded, report
from replaylab.scan import gdn_scan

__all__ = ["check_chunked_fold", "gdn_fold_inputs"]


def _done(name, ok, message) -> bool:
    return report(name, ok, message)


def gdn_fold_inputs(batch=2, T=11, Hk=2, H=4, K=8, V=6, seed=0) -> dict:
    """Random Gated DeltaNet log entries and a start state with a trained layer's ranges:
    state (batch, H, K, V), k unit-norm (batch, T, Hk, K), v (batch, T, H, V), g in
    (-0.7, 0] and beta in (0, 1) (batch, T, H)."""
    g_ = torch.Generator().manual_seed(seed)
    k = torch.randn(batch, T, Hk, K, generator=g_)
    return dict(
        state=torch.randn(batch, H, K, V, generator=g_),
        k=k / k.norm(dim=-1, keepdim=True),
        v=torch.randn(batch, T, H, V, generator=g_),
        g=-torch.rand(batch, T, H, generator=g_) * 0.7,
        beta=torch.rand(batch, T, H, generator=g_),
    )


@guarded("chunked_fold")
def check_chunked_fold(fold, atol=1e-4) -> bool:
    """Exercise: ``fold(state, k, v, g, beta, chunk_size) -> state after the T tokens``, by
    the chunked WY / UT form. Compared with the token loop ``replaylab.scan.gdn_scan`` on
    random inputs, for chunk sizes that divide T and that do not (1, 4, T, T + 3)."""
    name = "chunked_fold"
    for case, shape in enumerate([dict(T=11), dict(T=16, Hk=1, H=3, K=4, V=5), dict(T=3)]):
        p = gdn_fold_inputs(seed=case, **shape)
        T = p["k"].shape[1]
        want = gdn_scan(
            torch.zeros_like(p["k"]), p["k"], p["v"], p["g"], p["beta"], initial_state=p["state"]
        ).state
        for chunk in (1, 4, T, T + 3):
            try:
                got = fold(p["state"].clone(), p["k"], p["v"], p["g"], p["beta"], chunk)
            except NotImplementedError:
                return _done(name, False, NOT_IMPLEMENTED)
            except Exception as err:  # the learner's code raised: say on which case
                return _done(name, False, f"T={T}, chunk_size={chunk}: {describe_exception(err)}")
            if got is None:
                return _done(name, False, "not yet implemented (the function returned None)")
            if not isinstance(got, torch.Tensor) or got.shape != want.shape:
                shape_got = tuple(got.shape) if isinstance(got, torch.Tensor) else type(got)
                return _done(
                    name, False, f"expected a state of shape {tuple(want.shape)}, got {shape_got}"
                )
            err = max_abs_error(got, want)
            if not err <= atol:
                wrong = ~((got.double() - want.double()).abs() <= atol)  # NaN counts as wrong
                bad = wrong.nonzero()[0].tolist()
                heads = [h for h in range(got.shape[1]) if wrong[:, h].any()]
                which = (
                    f"wrong in heads {heads} of {got.shape[1]} (Hk={p['k'].shape[2]} key heads)"
                    if len(heads) < got.shape[1]
                    else "wrong in every head"
                )
                return _done(
                    name,
                    False,
                    f"T={T}, chunk_size={chunk}: max error {err:.2e} > {atol:g}, {which}; first at "
                    f"{tuple(bad)}: {float(got[tuple(bad)]):.5g} vs {float(want[tuple(bad)]):.5g}",
                )
    return _done(name, True, "the chunked fold equals the token loop for every chunk size")
