"""The row-invariant matrix product (``kernels.matmul.linear``) against cuBLAS, on every weight
shape of the presets (GPU).

``sweep`` times candidate launches (tile, K slices, warps, stages, TMA, in-loop slices) at a few
row counts; ``best_launches`` picks from it, per weight shape, one reduction (block_k, slices)
and, per row count, that reduction's fastest launch: what ``kernels.matmul.TUNED`` holds.
``run`` times ``launch_for``'s launch at each row count 1 .. 1,280 against cuBLAS and checks the
contract at each: rows 0 .. M-1 computed among M rows equal the same rows computed among the
most rows, bit for bit.

Each timing replays a CUDA graph of ``reps`` products, each behind a write of 256 MiB that
evicts the weight from L2 (as a decode step's other layers do), minus the same graph without
the products: microseconds a product, with no host launch cost on either side.
"""

from __future__ import annotations

import statistics

import torch

from replaylab.serving.runner import capture

__all__ = [
    "weight_shapes", "candidates", "sweep", "best_launches", "table_policy", "run",
    "sweep_summary", "run_summary", "slower_weights",
]  # fmt: skip

ISSUE_SHAPES = [(32256, 4096), (4096, 32256)]  # the weight-matched layout's MLP (issue #36)


def weight_shapes(presets=None):
    """{(N, K): [presets]} of every 2-D weight a forward multiplies by (not the embedding), for
    the serving presets and the families' presets (or ``presets``), built on the meta device
    (no memory); with the fused path's one q/k/v product of each attention layer, and, with
    8b-layers, the weight-matched layout's MLP (``ISSUE_SHAPES``, ``bench matched``)."""
    from replaylab.bench.families import PRESETS, load_preset
    from replaylab.model import HybridLM, preset

    names = presets or ["8b-layers", "1b", *PRESETS]
    shapes: dict[tuple[int, int], list[str]] = {}
    with torch.device("meta"):
        for name in names:
            cfg = load_preset(name)[1] if name in PRESETS else preset(name)
            model = HybridLM(cfg, seed=0)
            for n, p in model.named_parameters():
                if p.dim() == 2 and "embed" not in n:
                    shapes.setdefault(tuple(p.shape), []).append(name)
            for l in cfg.attn_layers:  # the fused path's one product for q, k and v
                qkv = [getattr(model.model.layers[l].mixer, f"{c}_proj").weight for c in "qkv"]
                if all(w.dim() == 2 for w in qkv):
                    rows = sum(w.shape[0] for w in qkv)
                    shapes.setdefault((rows, qkv[0].shape[1]), []).append(f"{name} (fused qkv)")
    if presets is None or "8b-layers" in presets:
        for shape in ISSUE_SHAPES:
            shapes.setdefault(shape, []).append("weight-matched M-M-*-M-")
    return {s: sorted(set(v)) for s, v in sorted(shapes.items())}


TILES = [  # (block_m, block_n, block_k, num_warps, num_stages)
    (64, 64, 64, 4, 4),
    (64, 128, 64, 4, 4),
    (64, 128, 128, 4, 3),
    (64, 256, 64, 8, 3),
    (128, 64, 64, 4, 4),
    (128, 128, 64, 8, 3),
    (128, 128, 64, 8, 4),
    (128, 256, 64, 8, 3),
]
SPLITS = (1, 2, 3, 4, 6, 8)


def candidates(N, K):
    """Launches worth timing for a weight (N, K): every tile of ``TILES`` at each count of
    ``SPLITS`` slices of K (a slice at least 512 columns), the slices in programs of their own
    and, where there are several, also reduced one after another in one program (``in_loop``:
    the same sums); tiles loaded by pointers and, where bf16 rows of K are 16-byte multiples,
    by TMA."""
    from replaylab.kernels.matmul import Launch

    out = []
    for tma in (False, True) if K * 2 % 16 == 0 else (False,):  # TMA: 16-byte bf16 rows
        for bm, bn, bk, warps, stages in TILES:
            for splits in SPLITS:
                if splits == 1 or K // splits >= 512:
                    for in_loop in (False, True) if splits > 1 else (False,):
                        out.append(Launch(bm, bn, bk, splits, warps, stages, tma=tma,
                                          in_loop=in_loop))  # fmt: skip
    return out


class _Timer:
    """Microseconds of ``fn`` from a CUDA graph of ``reps`` calls behind L2-evicting writes."""

    def __init__(self, reps=16):
        self.reps = reps
        self.flush = torch.empty(256 * 2**20, dtype=torch.int8, device="cuda")
        self.empty_ms = self._graph_ms(None)

    def _graph_ms(self, fn):
        if fn is not None:
            fn()  # compile and warm outside the capture
        torch.cuda.synchronize()
        g = torch.cuda.CUDAGraph()
        with capture(g, collect=False):  # the sweep collects once per weight
            for _ in range(self.reps):
                self.flush.zero_()
                if fn is not None:
                    fn()
        times = []
        for _ in range(5):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            g.replay()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end))
        del g
        return statistics.median(times)

    def us(self, fn):
        return max(0.0, 1e3 * (self._graph_ms(fn) - self.empty_ms) / self.reps)


def _inputs(N, K, rows, seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    w = (torch.randn(N, K, device="cuda", generator=g) * K**-0.5).bfloat16()
    x = torch.randn(max(rows), K, device="cuda", generator=g).bfloat16()
    return x, w


def sweep(shapes=None, rows=(1, 8, 64, 128, 256, 320, 640), progress=True, checkpoint=None):
    """Per weight shape: cuBLAS and every candidate launch (µs at each row count), whether the
    candidate's rows computed among M rows equal the same rows among max(rows) at every M, and
    the chosen launch (the lowest worst ratio to cuBLAS over the rows). ``checkpoint(result)``
    is called after each weight with the result so far."""
    import gc

    from tqdm.auto import tqdm

    from replaylab.kernels.matmul import linear

    shapes = shapes or weight_shapes()
    timer = _Timer()
    out = []
    stopped = None
    try:  # a SIGINT (the device call's time limit) keeps the shapes already swept
        for (N, K), presets in tqdm(list(shapes.items()), desc="weights", disable=not progress):
            gc.collect()  # once a weight, not once a capture (``capture``)
            x, w = _inputs(N, K, rows)
            cublas = {m: timer.us(lambda m=m: torch.nn.functional.linear(x[:m], w)) for m in rows}
            tried, failed = [], []
            for launch in candidates(N, K):
                try:
                    every = linear(x, w, launch)
                except Exception as error:  # a launch this Triton cannot compile
                    failed.append(dict(launch=launch._asdict(), error=repr(error)[:300]))
                    continue
                us = {m: timer.us(lambda m=m: linear(x[:m], w, launch)) for m in rows}
                tried.append(
                    dict(
                        launch=launch._asdict(),
                        us=us,
                        worst_ratio=max(us[m] / max(cublas[m], 1e-3) for m in rows),
                        rows_equal=all(
                            torch.equal(linear(x[:m], w, launch), every[:m]) for m in rows
                        ),
                    )
                )
            fair = [t for t in tried if t["rows_equal"]] or tried
            best = min(fair, key=lambda t: t["worst_ratio"])  # one launch for all rows
            out.append(
                dict(
                    weight=[N, K],
                    presets=presets,
                    cublas_us=cublas,
                    tried=tried,
                    failed=failed,
                    best=best,
                )  # fmt: skip
            )
            if checkpoint is not None:  # what is done survives a kill, not only a SIGINT
                checkpoint(dict(kind="matmul sweep", rows=list(rows), shapes=out, stopped=None))
    except KeyboardInterrupt:
        stopped = f"interrupted after {len(out)} of {len(shapes)} weights"
    return dict(kind="matmul sweep", rows=list(rows), shapes=out, stopped=stopped)


def best_launches(result, up_to=256, one_slice_stands_in=False):
    """{(N, K): ((max_rows, Launch), ...)} of a sweep's result (``sweep``, or its JSON loaded):
    each weight's launches by row count, the table ``kernels.matmul.TUNED`` is written from.

    A row's bits depend on the reduction (block_k and the slices of K), not on the tile, so one
    reduction is chosen per weight, the one whose fastest launches have the lowest worst ratio
    to cuBLAS over the rows up to ``up_to`` (then the lowest sum of ratios); each row count
    then takes its fastest launch of that reduction, up to the geometric middle between it and
    the next row count swept. ``one_slice_stands_in``: for sweeps made before ``in_loop``
    launches were candidates, each one-slice launch stands in for the in-loop launch of its
    tile at every count of slices (the same loop with a sum at each slice's end). It is how
    ``TUNED`` was made, and it was wrong at 640 rows for some weights (data/README.md): a sweep
    that times them is better. (``sweep`` also times 320 rows, a verify at batch 64, since that
    table; its sweeps did not.)"""
    from replaylab.kernels.matmul import Launch

    table = {}
    for shape in result["shapes"]:
        cublas = {int(m): us for m, us in shape["cublas_us"].items()}
        rows = sorted(cublas)
        tried = [t for t in shape["tried"] if t["rows_equal"]]
        if not tried:
            raise ValueError(
                f"weight {tuple(shape['weight'])}: no launch of the sweep kept its rows equal "
                f"at every row count ({len(shape['tried'])} tried); nothing to choose from"
            )
        groups: dict[tuple[int, int], list] = {}
        for t in tried:
            launch = Launch(**t["launch"])
            us = {int(m): v for m, v in t["us"].items()}
            groups.setdefault((launch.block_k, launch.splits), []).append((launch, us))
        if one_slice_stands_in:
            for (block_k, splits), members in groups.items():
                if splits > 1:
                    members += [(l._replace(splits=splits, in_loop=True), us)
                                for l, us in groups.get((block_k, 1), [])]  # fmt: skip

        def fastest(members, m):
            return min(members, key=lambda lu: lu[1][m])

        def score(members):
            ratios = [fastest(members, m)[1][m] / max(cublas[m], 1e-3) for m in rows if m <= up_to]
            return max(ratios), sum(ratios)

        members = min(groups.values(), key=score)
        buckets = []
        for i, m in enumerate(rows):
            bound = int((m * rows[i + 1]) ** 0.5) if i + 1 < len(rows) else None
            launch = fastest(members, m)[0]
            if buckets and buckets[-1][1] == launch:
                buckets[-1] = (bound, launch)
            else:
                buckets.append((bound, launch))
        table[tuple(shape["weight"])] = tuple(buckets)
    return table


def table_policy(table):
    """A launch policy for ``kernels.matmul.use_launches``: ``table``'s launches (from
    ``best_launches``) for the weights it holds, ``launch_for``'s for the others."""
    from replaylab.kernels.matmul import launch_for, launch_for_rows

    def policy(N, K, M):
        entry = table.get((N, K))
        return launch_for(N, K, M) if entry is None else launch_for_rows(entry, M)

    return policy


def run(
    shapes=None,
    rows=(1, 2, 4, 8, 16, 32, 64, 128, 256, 320, 640, 1280),
    progress=True,
    launches=None,
):
    """Per weight shape: ``launch_for``'s launch at each row count against cuBLAS and against
    the launch it replaced (``previous_launch_for``), µs, and the contract: rows computed
    among M rows equal the same rows among max(rows), at every M (each M with its own launch).
    With ``launches`` (a table from ``best_launches``) the table's launches are timed against
    ``launch_for``'s."""
    import gc

    from tqdm.auto import tqdm

    from replaylab.kernels.matmul import launch_for, linear, linear_ref, previous_launch_for

    shapes = shapes or weight_shapes()
    policy = table_policy(launches or {})
    previous = launch_for if launches else previous_launch_for  # what the table would replace
    timer = _Timer()
    out = []
    for (N, K), presets in tqdm(list(shapes.items()), desc="weights", disable=not progress):
        gc.collect()  # once a weight, not once a capture (``capture``)
        x, w = _inputs(N, K, rows)
        every = linear(x, w, policy(N, K, max(rows)))
        ref = linear_ref(x, w).float()
        launch = {m: policy(N, K, m) for m in rows}
        row = dict(
            weight=[N, K],
            presets=presets,
            launch={m: launch[m]._asdict() for m in rows},
            rows_equal={m: bool(torch.equal(linear(x[:m], w, launch[m]), every[:m])) for m in rows},
            max_abs_diff_vs_fp32_accumulation=float((every.float() - ref).abs().max()),
            cublas_us={},
            row_invariant_us={},
            previous_launch_us={},
        )
        for m in rows:
            before = previous(N, K, m)
            row["cublas_us"][m] = timer.us(lambda m=m: torch.nn.functional.linear(x[:m], w))
            row["row_invariant_us"][m] = timer.us(lambda m=m: linear(x[:m], w, launch[m]))
            row["previous_launch_us"][m] = timer.us(lambda m=m: linear(x[:m], w, before))
        row["weight_bytes"] = N * K * 2
        out.append(row)
    arm = "launch_for (TUNED)" if launches else "previous_launch_for"
    return dict(kind="matmul", rows=list(rows), shapes=out, previous_launch=arm)


def sweep_summary(result):
    """One line per weight and row bucket: the chosen launch (``best_launches``) and its ratio
    to cuBLAS at the row count the bucket was chosen at."""
    from replaylab.kernels.matmul import Launch, launch_for_rows

    table = best_launches(result)
    lines = [
        f"{'weight (N, K)':>16}  rows  /cuBLAS  launch (bm, bn, bk, splits, warps, stages, ...)"
    ]
    for s in result["shapes"]:
        weight = tuple(s["weight"])
        for m, cublas in s["cublas_us"].items():
            launch = launch_for_rows(table[weight], int(m))
            us = next(t["us"][m] for t in s["tried"] if Launch(**t["launch"]) == launch)
            lines.append(
                f"{str(weight):>16}  {int(m):>4}  {us / max(cublas, 1e-3):6.2f}x  {tuple(launch)}"
            )
    return lines


def run_summary(result, show=(1, 8, 128, 640)):
    """One line per weight: row-invariant / cuBLAS (and the previous launch's / cuBLAS) at a
    few row counts, and the contract; then the sums over the weights at each row count."""
    head = "  ".join(f"M={m:<12}" for m in show)
    lines = [f"{'weight (N, K)':>16}  {head}  rows equal  (launch / cuBLAS, previous / cuBLAS)"]

    def key(d, m):  # ints in a fresh result, strings in its JSON
        return m if m in d else str(m)

    for s in result["shapes"]:
        cells = []
        for m in show:
            cublas = max(s["cublas_us"][key(s["cublas_us"], m)], 1e-3)
            cells.append(
                f"{s['row_invariant_us'][key(s['cublas_us'], m)] / cublas:5.2f}x "
                f"{s['previous_launch_us'][key(s['cublas_us'], m)] / cublas:5.2f}x"
            )
        lines.append(
            f"{str(tuple(s['weight'])):>16}  {'  '.join(cells)}  {all(s['rows_equal'].values())}"
        )
    sums = []
    for m in result["rows"]:
        total = {a: sum(s[a][key(s[a], m)] for s in result["shapes"])
                 for a in ("row_invariant_us", "previous_launch_us", "cublas_us")}  # fmt: skip
        sums.append(
            f"M={m}: {total['row_invariant_us'] / total['cublas_us']:.3f}x / "
            f"{total['previous_launch_us'] / total['cublas_us']:.3f}x"
        )
    lines.append(
        "summed over the weights, launch / cuBLAS and previous / cuBLAS: " + ", ".join(sums)
    )
    slower = slower_weights(result)
    lines.append(
        "weights more than 3% slower than the previous launch: "
        + ", ".join(f"M={m}: {len(w)}" for m, w in slower.items())
    )
    return lines


def slower_weights(result, margin=1.03):
    """{rows: [(N, K), ...]} of a ``run`` result (or its JSON): the weights whose launch takes
    more than ``margin`` times the previous launch's time at that row count."""
    out = {}
    for m in result["rows"]:
        out[m] = []
        for s in result["shapes"]:
            key = m if m in s["row_invariant_us"] else str(m)
            if s["row_invariant_us"][key] > margin * s["previous_launch_us"][key]:
                out[m].append(tuple(s["weight"]))
    return out
