"""A CUDA graph capture survives Python's garbage collector (GPU only): a dead cycle that holds
an earlier graph, collected inside a capture, must not invalidate it (``runner.capture``)."""

from __future__ import annotations

import gc

import pytest
import torch

from replaylab.serving.runner import capture

pytestmark = pytest.mark.gpu


def test_a_dead_graph_collected_inside_a_capture_does_not_invalidate_it():
    """An earlier graph that becomes garbage inside the capture, reachable only from a
    reference cycle (as an engine that captured steps and then went out of use), while Python
    allocates enough to trigger the cyclic collector: the capture holds (torch's own capture
    is invalidated there: ``tools/graph_gc_probe.py``, data/graph_gc_probe.jsonl)."""
    x = torch.arange(4096, device="cuda", dtype=torch.float32)
    old = torch.cuda.CUDAGraph()
    with capture(old):
        _ = x * 3
    threshold = gc.get_threshold()
    try:
        graph = torch.cuda.CUDAGraph()
        with capture(graph):
            y = x * 2
            holder = {"graph": old}  # the cycle is born in the capture: the youngest generation
            holder["self"] = holder
            del holder, old
            gc.set_threshold(1)  # a collection at nearly every Python allocation
            garbage = [[i] for i in range(200)]
            z = y + len(garbage)
        gc.set_threshold(*threshold)
        x.add_(1)
        graph.replay()
        torch.cuda.synchronize()
    finally:
        gc.set_threshold(*threshold)
    assert torch.equal(z, (x * 2) + 200)
    assert gc.isenabled()
