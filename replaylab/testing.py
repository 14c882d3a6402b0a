"""For tests and notebooks only: independent references to check replaylab against
(mamba-ssm's PyTorch references) and what importing them needs. Library code does not import
this module.

mamba-ssm ships CUDA extensions that a CPU machine does not build. Its pure-PyTorch references
(``selective_scan_ref``, ``selective_state_update_ref``, ``ssd_minimal_discrete``) import once
two things are arranged for the first import: a stand-in ``selective_scan_cuda`` module and
``MAMBA_DETERMINISTIC=1`` (for the import only, then ``set_deterministic_mode``). ``mamba_ssm_references()`` arranges them and returns the functions.
"""

from __future__ import annotations

import importlib
import os
import sys
import types
import warnings
from types import SimpleNamespace

import torch

__all__ = [
    "DEVICE", "mamba_ssm_references", "scan_agreement", "tiny_hybrid", "kernel_sized", "perturbed",
]  # fmt: skip

# where the tests run: the GPU where there is one (Triton kernels then need its tensors), else
# the CPU under Triton's interpreter
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


# transformers picks a hybrid layer's implementation when its modeling module is first
# imported: mamba-ssm's kernels if mamba-ssm imports, else PyTorch. Importing those modules
# before the stand-in below keeps transformers on its PyTorch path, the one the tests compare.
_TRANSFORMERS_HYBRIDS = ("nemotron_h", "bamba", "jamba")


def _prepare_import():
    for name in _TRANSFORMERS_HYBRIDS:
        try:
            importlib.import_module(f"transformers.models.{name}.modeling_{name}")
        except ImportError:
            pass
    sys.modules.setdefault("selective_scan_cuda", types.ModuleType("selective_scan_cuda"))


def mamba_ssm_references() -> SimpleNamespace:
    """mamba-ssm's reference functions, or ImportError saying how to install mamba-ssm.

    Returns a namespace with ``selective_scan_ref`` (Mamba-1 sequence scan, layout
    (batch, D, T)), ``selective_state_update_ref`` (one Mamba-1/2 decode step) and
    ``ssd_minimal_discrete`` (the chunked SSD algorithm, no D, no dt processing).
    """
    _prepare_import()
    # deterministic mode is read while mamba-ssm's modules are imported; the variable is set
    # for the import only, so it does not leak into child processes (notebook kernels)
    had = os.environ.get("MAMBA_DETERMINISTIC")
    os.environ["MAMBA_DETERMINISTIC"] = "1"
    try:
        with warnings.catch_warnings():  # its autotune-cache advice concerns GPU runs only
            warnings.filterwarnings("ignore", message="Deterministic mode", category=UserWarning)
            from mamba_ssm.modules.ssd_minimal import ssd_minimal_discrete
            from mamba_ssm.ops.selective_scan_interface import selective_scan_ref
            from mamba_ssm.ops.triton.selective_state_update import selective_state_update_ref
            from mamba_ssm.utils.determinism import set_deterministic_mode

            set_deterministic_mode(True)
    except ImportError as err:  # pragma: no cover - depends on the machine
        raise ImportError(
            "mamba-ssm is not installed. It is a test oracle only; install it with "
            "MAMBA_FORCE_BUILD=TRUE MAMBA_SKIP_CUDA_BUILD=TRUE pip install --no-build-isolation "
            f"--no-deps mamba-ssm==2.3.2.post1 (import failed with: {err})"
        ) from err
    finally:
        if had is None:
            os.environ.pop("MAMBA_DETERMINISTIC", None)
        else:
            os.environ["MAMBA_DETERMINISTIC"] = had
    return SimpleNamespace(
        selective_scan_ref=selective_scan_ref,
        selective_state_update_ref=selective_state_update_ref,
        ssd_minimal_discrete=ssd_minimal_discrete,
    )


def scan_agreement(seed=0) -> list[dict]:
    """Run replaylab's fp32 scans and each independent reference on fresh random inputs.

    Returns rows ``{"oracle": name, "max_abs_error": float}`` (outputs and states together):
    a float64 run of the same scan, mamba-ssm's ``selective_state_update_ref`` (Mamba-2 decode
    steps), ``ssd_minimal_discrete`` (chunked SSD) and ``selective_scan_ref`` (Mamba-1).
    """
    from einops import rearrange, repeat

    from replaylab.checks import max_abs_error
    from replaylab.scan import process_dt, s6_scan, ssd_scan

    ref = mamba_ssm_references()
    g = torch.Generator().manual_seed(seed)
    r = lambda *s: torch.randn(*s, generator=g)  # noqa: E731
    batch, T, H, P, N, G = 3, 32, 6, 5, 8, 3
    x, dt, B, C = r(batch, T, H, P), r(batch, T, H) - 1, r(batch, T, G, N), r(batch, T, G, N)
    A, D, bias = -torch.rand(H, generator=g) * 4 - 0.1, r(H), r(H) * 0.5
    init = r(batch, H, P, N)
    ours = ssd_scan(x, dt, A, B, C, D, dt_bias=bias, dt_softplus=True, initial_state=init)
    rows = []

    def add(name, pairs):
        rows.append({"oracle": name, "max_abs_error": max(max_abs_error(a, b) for a, b in pairs)})

    f64 = ssd_scan(
        x.double(),
        dt,
        A,
        B.double(),
        C.double(),
        D,
        dt_bias=bias,
        dt_softplus=True,
        initial_state=init,
        compute_dtype=torch.float64,
    )
    add("float64 scan (replaylab, Mamba-2)", [(ours.y, f64.y), (ours.state, f64.state)])

    state, ys = init.clone(), []
    for t in range(T):
        ys.append(
            ref.selective_state_update_ref(
                state,
                x[:, t],
                repeat(dt[:, t], "b h -> b h p", p=P),
                repeat(A, "h -> h p n", p=P, n=N),
                B[:, t],
                C[:, t],
                D=repeat(D, "h -> h p", p=P),
                dt_bias=repeat(bias, "h -> h p", p=P),
                dt_softplus=True,
            )
        )
    add(
        "mamba-ssm selective_state_update_ref (Mamba-2, per token)",
        [(ours.y, torch.stack(ys, 1)), (ours.state, state)],
    )

    delta = process_dt(dt, bias, True)
    Bh, Ch = (repeat(t_, "b t g n -> b t (g r) n", r=H // G) for t_ in (B, C))
    ref_y, ref_state = ref.ssd_minimal_discrete(
        x * delta[..., None], A * delta, Bh, Ch, 8, initial_states=init[:, None]
    )
    add(
        "mamba-ssm ssd_minimal_discrete (Mamba-2, chunked)",
        [(ours.y, ref_y + D[:, None] * x), (ours.state, ref_state)],
    )

    Dm, Nm = 10, 6
    u, dtm, Bm, Cm = r(batch, T, Dm), r(batch, T, Dm) - 1, r(batch, T, Nm), r(batch, T, Nm)
    Am, Dskip = -torch.rand(Dm, Nm, generator=g) * 2, r(Dm)
    s6 = s6_scan(u, dtm, Am, Bm, Cm, Dskip, dt_softplus=True)
    to_bdt = lambda t_: rearrange(t_, "b t d -> b d t")  # noqa: E731
    ref_y, ref_state = ref.selective_scan_ref(
        to_bdt(u),
        to_bdt(dtm),
        Am,
        to_bdt(Bm),
        to_bdt(Cm),
        D=Dskip,
        delta_softplus=True,
        return_last_state=True,
    )
    add(
        "mamba-ssm selective_scan_ref (Mamba-1)",
        [(s6.y, rearrange(ref_y, "b d t -> b t d")), (s6.state, ref_state)],
    )
    return rows


def tiny_hybrid(seed=2):
    """The tests' model: a NemotronH-layout hybrid "M*M-" (two Mamba-2 layers with 3 heads of
    width 8, state 8, one attention layer, one MLP), vocabulary 50, fixed random weights."""
    from replaylab.model import HybridConfig, HybridLM

    cfg = HybridConfig(
        vocab_size=50,
        hidden_size=32,
        pattern="M*M-",
        ssm_heads=3,
        ssm_head_dim=8,
        d_state=8,
        n_groups=3,
        attn_heads=2,
        kv_heads=1,
        head_dim=16,
        intermediate_size=64,
    )
    return HybridLM(cfg, seed=seed).eval()


def kernel_sized(model, seed=0):
    """The model a test runs the fused kernels on, in place of ``model`` (a HybridLM): itself
    on a GPU; on CPU, where Triton's interpreter takes time for every program (one per head
    and state tile), a new one of its config with two heads of state size 16 (``seed``): the
    kernels' paths over several heads and state tiles are then tested on a GPU only."""
    import dataclasses

    from replaylab.model import HybridLM

    if torch.cuda.is_available():
        return model
    cfg = dataclasses.replace(model.cfg, ssm_heads=2, d_state=16)
    return HybridLM(cfg, seed=seed).eval()


def perturbed(model, scale, seed=7):
    """A draft model that agrees with ``model`` part of the time: a copy of it whose every
    weight tensor has Gaussian noise of ``scale`` times that tensor's spread added (drawn on
    the CPU, so the same draft on any device)."""
    import copy

    draft = copy.deepcopy(model).eval()
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in draft.parameters():
            noise = torch.randn(p.shape, generator=g).to(p.device)
            p.add_(noise * scale * p.std().nan_to_num(0))
    return draft
