"""How much of a graphed decode step is host work outside its CUDA graph (issue 36, item 2).

    python3 tools/step_host_probe.py OUT.json [--label NAME] [--batches 1,8,64,128,256]

For each batch: the weight-matched model (``bench.matched.MATCHED``, replay, L = 16, the
lossless defaults), graphs captured, then ``n_steps`` of a user's loop (``step`` + argmax) timed
with CUDA events, while every graph replay is recorded; then the same graphs replayed back to
back in the same order, timed the same way. ``wall_over_replay`` is the loop's time over the
graphs' alone: 1.0 would mean no time outside the graphs. Run it on two trees in one device
call (PYTHONPATH) to time a change side by side; ``--label`` names the tree in the JSON.
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path

import torch

REPEATS = 5


def _timed(fn, repeats=REPEATS):
    """Median milliseconds of ``fn()`` between CUDA events."""
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def probe(batch, model, vocab, n_steps=64, log_length=16):
    from replaylab.bench.serve import admit_all, random_prompts
    from replaylab.serving import DecodeEngine

    engine = DecodeEngine(model, batch, 64 + 6 * n_steps + log_length, "replay", log_length)
    tok = admit_all(engine, random_prompts(batch, vocab, seed=7))
    tok = tok.argmax(-1, keepdim=True)
    for _ in range(log_length + 2):  # capture both graphs (with and without a fold)
        tok = engine.step(tok, check=False)[:, -1].argmax(-1, keepdim=True)
    replayed = []
    original = torch.cuda.CUDAGraph.replay

    def recording(graph):
        replayed.append(graph)
        return original(graph)

    state = {"tok": tok}

    def loop():
        t = state["tok"]
        for _ in range(n_steps):
            t = engine.step(t, check=False)[:, -1].argmax(-1, keepdim=True)
        state["tok"] = t

    torch.cuda.CUDAGraph.replay = recording
    try:
        wall_ms = _timed(loop)
    finally:
        torch.cuda.CUDAGraph.replay = original
    sequence = replayed[-len(replayed) // REPEATS :]  # the last timed loop's replays

    def graphs_alone():
        for g in sequence:
            g.replay()

    replay_ms = _timed(graphs_alone)
    return dict(
        batch=batch,
        n_steps=n_steps,
        step_us=1e3 * wall_ms / n_steps,
        graph_replay_us=1e3 * replay_ms / n_steps,
        wall_over_replay=wall_ms / replay_ms,
        graphs_per_step=len(replayed) / (REPEATS * n_steps),
    )


def main():
    from replaylab.bench.matched import MATCHED
    from replaylab.bench.provenance import write_tool_result
    from replaylab.model import HybridConfig, HybridLM

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out")
    parser.add_argument("--label", default="this tree")
    parser.add_argument("--batches", default="1,8,64,128,256")
    args = parser.parse_args()
    cfg = HybridConfig(**MATCHED)
    model = HybridLM(cfg, seed=0).to("cuda", torch.bfloat16).eval()
    import replaylab

    tree = str(Path(replaylab.__file__).resolve().parent.parent)  # which tree ran (PYTHONPATH)
    rows = []
    with torch.no_grad():
        for batch in (int(b) for b in args.batches.split(",")):
            rows.append(dict(label=args.label, tree=tree, **probe(batch, model, cfg.vocab_size)))
            torch.cuda.empty_cache()
            r = rows[-1]
            print(
                f"{args.label} ({tree}): batch {batch:4d}  step {r['step_us']:8.1f} us  graphs "
                f"{r['graph_replay_us']:8.1f} us  wall/replay {r['wall_over_replay']:.3f}"
            )
    write_tool_result(args.out, "step_host_probe.py", rows)


if __name__ == "__main__":
    main()
