"""A CUDA graph capture survives Python's garbage collector (GPU only): a dead cycle that holds
an earlier graph, collected inside a capture, must not invalidate it (``runner.capture``)."""

from __future__ import annotations

import gc

import pytest
import torch

from replaylab.serving.runner import capture

pytestmark = pytest.mark.gpu


def _dead_cycle_holding_a_graph():
    """A captured graph reachable only from a reference cycle (as an engine that captured
    steps and then went out of use), so only the cyclic collector frees it."""
    x = torch.ones(4096, device="cuda")
    graph = torch.cuda.CUDAGraph()
    with capture(graph):
        y = x * 3
    holder = {"graph": graph, "out": y}
    holder["self"] = holder


def test_a_dead_graph_collected_inside_a_capture_does_not_invalidate_it():
    x = torch.arange(4096, device="cuda", dtype=torch.float32)
    threshold = gc.get_threshold()
    _dead_cycle_holding_a_graph()
    gc.set_threshold(1)  # a collection at nearly every Python allocation
    try:
        graph = torch.cuda.CUDAGraph()
        with capture(graph):
            y = x * 2
            garbage = [[i] for i in range(200)]  # allocations that would trigger collections
            z = y + len(garbage)
        x.add_(1)
        graph.replay()
        torch.cuda.synchronize()
    finally:
        gc.set_threshold(*threshold)
    assert torch.equal(z, (x * 2) + 200)
    assert gc.isenabled()
