"""Whether collecting a dead CUDA graph inside a capture invalidates it, with torch's own
``torch.cuda.graph`` and with ``replaylab.serving.runner.capture`` (GPU only; one JSON line
each). The evidence behind ``capture``: the GPU suite's intermittent "operation not permitted
when stream is capturing", raised from ``CUDAGraph``'s destructor (data/gpu_graphed_rerun.log).

    python tools/graph_gc_probe.py torch|replaylab
"""

from __future__ import annotations

import gc
import json
import sys

import torch

from replaylab.serving.runner import capture


def main(which):
    ctx = torch.cuda.graph if which == "torch" else capture
    x = torch.ones(4096, device="cuda")
    old = torch.cuda.CUDAGraph()
    with ctx(old):
        _ = x * 3
    graph = torch.cuda.CUDAGraph()
    try:
        with ctx(graph):
            y = x * 2
            holder = {"graph": old}  # a cycle made inside the capture, so it is in the
            holder["self"] = holder  # youngest generation whatever ran before the capture
            del holder, old  # only the cyclic collector frees the old graph now
            gc.set_threshold(1)  # a collection at nearly every Python allocation
            garbage = [[i] for i in range(200)]
            z = y + len(garbage)
        gc.set_threshold(700, 10, 10)
        graph.replay()
        torch.cuda.synchronize()
        result = {"capture": which, "ok": bool(torch.equal(z, x * 2 + 200)), "error": None}
    except Exception as err:  # noqa: BLE001 - the probe reports what the capture raised
        result = {"capture": which, "ok": False, "error": f"{type(err).__name__}: {err}"[:300]}
    print(json.dumps(result))


if __name__ == "__main__":
    main(sys.argv[1])
