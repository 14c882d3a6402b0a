"""The peer packages a benchmark compares against, loaded where they import (on the GPU
machine they are carried in and installed without their CUDA extensions)."""

from __future__ import annotations

import importlib
import os
import sys
import types
import warnings

__all__ = ["load_kernel_peers", "use_mamba_ssm_kernels_in_transformers"]


def _allow_mamba_ssm_import():
    """mamba-ssm imports its CUDA extension ``selective_scan_cuda`` at import time; its Triton
    kernels need none, so a stand-in module lets them import (set before the first import)."""
    os.environ.setdefault("MAMBA_DETERMINISTIC", "1")
    sys.modules.setdefault("selective_scan_cuda", types.ModuleType("selective_scan_cuda"))


def use_mamba_ssm_kernels_in_transformers() -> bool:
    """Make mamba-ssm importable before transformers' hybrid modules load, so that they pick
    mamba-ssm's Triton kernels (the fast path of a real deployment; needs a GPU). Returns
    whether mamba-ssm imported."""
    sys.modules.setdefault("selective_scan_cuda", types.ModuleType("selective_scan_cuda"))
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="Deterministic mode", category=UserWarning)
            importlib.import_module("mamba_ssm")
    except ImportError:
        return False
    return True


def load_kernel_peers():
    """({name: function}, {package: import error}) for mamba-ssm's selective_state_update and
    chunk scan, and fla's simple-GLA recurrent and chunked kernels."""
    peers, errors = {}, {}
    try:
        _allow_mamba_ssm_import()
        from mamba_ssm.ops.triton.selective_state_update import selective_state_update
        from mamba_ssm.ops.triton.ssd_combined import mamba_chunk_scan_combined

        peers["ssu"], peers["chunk_scan"] = selective_state_update, mamba_chunk_scan_combined
    except Exception as err:  # noqa: BLE001
        errors["mamba_ssm"] = repr(err)[:300]
    try:
        from fla.ops.simple_gla import chunk_simple_gla, fused_recurrent_simple_gla

        peers["fla_recurrent"], peers["fla_chunk"] = fused_recurrent_simple_gla, chunk_simple_gla
    except Exception as err:  # noqa: BLE001
        errors["fla"] = repr(err)[:300]
    return peers, errors
