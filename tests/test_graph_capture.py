"""A CUDA graph capture survives Python's garbage collector (GPU only): a dead cycle that holds
an earlier graph, collected inside a capture, must not invalidate it (``runner.capture``)."""

from __future__ import annotations

import gc

import pytest
import torch

from replaylab.serving.runner import capture

pytestmark = pytest.mark.gpu


def test_a_dead_graph_collected_inside_a_capture_does_not_invalidate_it():
    """An earlier graph reachable only from a reference cycle (as an engine that captured
    steps and then went out of use), whose last outside reference goes inside the capture."""
    x = torch.arange(4096, device="cuda", dtype=torch.float32)
    old = torch.cuda.CUDAGraph()
    with capture(old):
        _ = x * 3
    holder = {"graph": old}
    holder["self"] = holder
    keep = [holder]
    del holder, old
    threshold = gc.get_threshold()
    try:
        graph = torch.cuda.CUDAGraph()
        with capture(graph):
            y = x * 2
            keep.clear()
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
