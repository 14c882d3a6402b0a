"""Host time of ``serving.BatchPromptLookupDrafter.propose_batch`` on host tensors: one call
for G rows of random contexts (ids in [0, 1000)), each of ``width`` tokens but its last 6, k
drafts, max_ngram 3; the best of 3 repeats of 20 calls, in ms, at each (G, width). Rows go
to OUT.json (``--append`` adds to its rows; ``--label`` names the tree, run with ``python -P``
and the tree on PYTHONPATH for side-by-side runs).

    python tools/prompt_lookup_probe.py OUT.json [--rows 8,32,128] [--widths 200,2000]
        [--k 4] [--label NAME] [--append]
"""

from __future__ import annotations

import argparse
import functools
import json
import timeit
from pathlib import Path

import torch

import replaylab
from replaylab.bench.provenance import provenance
from replaylab.serving import BatchPromptLookupDrafter


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--rows", default="8,32,128")
    ap.add_argument("--widths", default="200,2000")
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--label", default=None)
    ap.add_argument("--append", action="store_true")
    a = ap.parse_args(argv)
    torch.set_num_threads(1)
    drafter = BatchPromptLookupDrafter(3)
    rows = []
    for G in map(int, a.rows.split(",")):
        for width in map(int, a.widths.split(",")):
            gen = torch.Generator().manual_seed(G + width)
            contexts = torch.randint(0, 1000, (G, width), generator=gen)
            lengths = torch.full((G,), width - 6)
            args = (contexts, lengths, torch.arange(G), a.k, 1000)
            call = functools.partial(drafter.propose_batch, *args)
            seconds = min(timeit.repeat(call, number=20, repeat=3))
            seconds /= 20
            rows.append(dict(rows=G, width=width, k=a.k, ms=1e3 * seconds, label=a.label,
                             replaylab=replaylab.__file__))  # fmt: skip
            print(f"{a.label or ''} G {G:4d} width {width:5d}: {1e3 * seconds:.3f} ms", flush=True)
    run = dict(provenance(), command="python tools/prompt_lookup_probe.py " + " ".join(argv or []))
    out = Path(a.out)
    if a.append and out.exists():
        result = json.loads(out.read_text())
        result["runs"].append(run)
        result["rows"] += rows
    else:
        result = dict(runs=[run], rows=rows)
    out.write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
