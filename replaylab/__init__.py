"""replaylab: how hybrid (attention + Mamba) language models store their recurrent state while
decoding, and what snapshot, recompute and replay cost for branching workloads.

Modules: ``scan`` (reference selective scans), ``model`` (a NemotronH / Bamba mirror),
``kv`` (an attention layer's KV cache), ``cache`` and ``strategies`` (one API over snapshot,
recompute and replay), ``decoding`` (greedy, speculative, beam, best-of-n, tree search),
``generate`` and ``cli`` (``replaylab generate``), ``kernels`` (Triton replay kernels),
``costmodel`` and ``widgets`` (predictions and explorers), ``experiments`` and ``bench``
(measurements), ``shapes``, ``checks``, ``oracles``, ``exercises``, ``plotting``,
``validation``.
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
