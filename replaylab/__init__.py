"""replaylab: how hybrid (attention + Mamba) language models store their recurrent state while
decoding, and what snapshot, recompute and replay cost for branching workloads.

Modules: ``scan`` (reference selective scans), ``kv`` (an attention layer's KV cache),
``shapes`` (published hybrid shapes and their memory), ``checks`` (``assert_close``),
``oracles`` (mamba-ssm's references), ``exercises`` (notebook exercise checks).
"""

import os as _os

import torch as _torch

# Triton kernels on a machine without a GPU run through Triton's interpreter, which must be
# switched on before any kernel is defined. Importing torch does not import triton.
if not _torch.cuda.is_available():
    _os.environ.setdefault("TRITON_INTERPRET", "1")

from replaylab.checks import assert_close  # noqa: E402
from replaylab.scan import ScanResult, s6_scan, s6_step, ssd_scan, ssd_step  # noqa: E402

__version__ = "0.1.0"
__all__ = ["assert_close", "ScanResult", "ssd_step", "ssd_scan", "s6_step", "s6_scan"]
