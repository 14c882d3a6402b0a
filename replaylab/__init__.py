"""replaylab: how hybrid (attention + state-space) language models store their recurrent state
while decoding, and what snapshot, recompute and replay cost for branching workloads.

Modules (ARCHITECTURE.md says how they fit):
    scan, recurrent                 reference recurrences; the recurrent-layer interface
    mamba2, mamba1, gated_deltanet  layer families, each a mixer owning its state spec
    model, kv, cache, strategies    the hybrid LM (NemotronH, Bamba, Jamba, Qwen3-Next,
                                    Qwen3.5), the KV cache, one cache API over the strategies
    replay_ops, kernels             replay in PyTorch for any family; Triton kernels (Mamba-2, -1)
    serving                         the engine: CUDA-graphed decode over preallocated pools,
                                    the scheduler, the prefix cache on the engine
    prefix                          the teaching cache's prefix cache (a tree of blocks)
    decoding, generate, cli         workloads; ``replaylab generate`` / ``train`` / ``bench``
    train, training                 the trained pair's recipe; its corpus, tokenizer, loop
    hf                              replay and recompute as transformers' own cache layers
    costmodel, shapes, families     predictions, published shapes, per-family byte counts
    bench, results                  the benchmark harness; committed data
    testing                         oracles for tests, notebooks and CPU benchmarks
    teaching                        the notebooks' explorers, figures, checks, puzzles, quiz
                                    and live measurements (nothing outside it imports it)
    checks, validation              assert_close; argument checks
"""

import os as _os

import torch as _torch

# Triton kernels on a machine without a GPU run through Triton's interpreter, which must be
# switched on before any kernel is defined. Importing torch does not import triton.
if not _torch.cuda.is_available():
    _os.environ.setdefault("TRITON_INTERPRET", "1")


if _os.environ.get("TRITON_INTERPRET") == "1":  # the interpreter without work it throws away
    from replaylab._interpreter import quicken as _quicken

    _quicken()

from replaylab.checks import assert_close  # noqa: E402
from replaylab.scan import ScanResult, s6_scan, s6_step, ssd_scan, ssd_step  # noqa: E402

__version__ = "0.1.0"
__all__ = ["assert_close", "ScanResult", "ssd_step", "ssd_scan", "s6_step", "s6_scan"]
