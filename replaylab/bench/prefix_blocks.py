"""Prefix-cache token hit rate against bytes held at serving block sizes (issue 22, item 5):
the serving engine's prefix cache (``serving.EnginePrefixCache``) under replay, snapshot
(vLLM's ``mamba_cache_mode=align``) and recompute, at block sizes 16 to 1024, on workloads
whose prompts are up to two blocks of 512 (``block_workload``), over a sweep of equal byte
budgets, beside the attention-only ideal.

The model (``ratio_model``): what a node holds is KV rows per token, one state + conv window
per recurrent layer at each full block, and (replay) one log entry per token and layer. Hit
rates depend on those three sizes only, never on weights; so the model is small (two Mamba-2
layers, one attention layer, vocabulary 50, random weights) but its two byte ratios are
Nemotron-H 8B's (``nemotron_ratios``, from ``replaylab.families`` and ``replaylab.shapes``):

    state_per_entry   (fp32 state H*P*N + bf16 conv window (d_conv - 1) * (H*P + 2*G*N)) per
                      layer / what a node keeps of one token per layer (bf16 xBC and dt, the
                      inputs a seat derives the log's x, B, C from: (H*P + 2*G*N + H) values)
                      = 4,255,744 / 20,736 = 205.2
    kv_per_log        KV bytes per token (4 attention layers, bf16) / node-entry bytes per
                      token (24 Mamba-2 layers) = 16,384 / 497,664 = 0.0329

The model runs in fp32 (every tensor 4 bytes), with H=16, P=64, N=336, G=1 and one KV head of
width 56: ratios 203.9 and 0.0327 (within 1%, ``model_ratios`` measures them from a real node).
Byte counts scale to Nemotron-H 8B by ``nemotron_scale`` (its log bytes per token over the
model's), within those 1%.

The sweep (four workloads x five block sizes x three strategies x 18 budgets) runs the engine
prefix cache's own tree (``PrefixTree``: matching, resume plan, hit report, insertion, budget,
eviction) without the model, since the real cache prefills every request (seconds per stream
at these state sizes on a CPU, against milliseconds): ``ByteTree``, nodes of the shapes and dtypes a real
``EnginePrefixCache`` over the model's engine holds, as one-element stand-ins (so the tree
counts the real bytes without holding them). Everything a hit report and the byte count
depend on is the tree's; ``validate`` runs the real engine cache (the model prefilling every
request) beside it and records that both give the same hit report for every request and the
same bytes held (``tests/test_prefix_blocks.py`` checks it too).

Glossary: b block size, L the engine's log length (replay's block sizes are multiples of it),
token hit rate sum of resumed positions / sum of prompt lengths, ideal an attention-only
model's (every matched token, capped at T - 1), budget the byte cap (None: no cap).
"""

from __future__ import annotations

import math
import time

import torch

from replaylab.prefix import DEFAULT_EVICTION, PREFIX_EVICTION, PrefixTree, _Node
from replaylab.recurrent import LayerState

__all__ = [
    "BLOCK_SIZES",
    "BLOCK_WORKLOADS",
    "block_workload",
    "nemotron_ratios",
    "ratio_model",
    "model_ratios",
    "attention_ideal",
    "ByteTree",
    "run_block_bench",
    "pooled_hit_rate",
    "block_targets",
    "blocks_markdown",
]

BLOCK_SIZES = (16, 64, 256, 512, 1024)
BLOCK_WORKLOADS = ("system_prompts", "shared_docs", "multi_turn", "few_shot")
VOCAB = 50


def _ids(g, n):
    return torch.randint(0, VOCAB, (n,), generator=g).tolist()


def _n(g, low, high):
    return int(torch.randint(low, high + 1, (1,), generator=g))


def block_workload(name, seed=0) -> list[list[int]]:
    """A request stream (token id lists, vocabulary 50) whose prompts are up to two blocks of
    512 (265 to 1,013 tokens; the documents' prompts, 279-457, are shorter than one):
    system_prompts  three system prompts of 300-900 tokens (300, 600, 900 +- 20), each with
                    five unique user turns of 40-160 tokens; 15 requests, round robin
    shared_docs     four documents of 200-480 tokens (shorter than a block), each asked four
                    unique questions of 30-120 tokens; 16 requests, round robin
    multi_turn      three conversations (openings of 200-400 tokens), four turns each, every
                    turn extending the conversation by 80-200 tokens; 12 requests, round robin
    few_shot        two example sets of 700 tokens + a query of 20-80 tokens; 10 requests
    """
    g = torch.Generator().manual_seed(seed)
    if name == "system_prompts":
        systems = [_ids(g, _n(g, c - 20, c + 20)) for c in (300, 600, 900)]
        return [systems[i % 3] + _ids(g, _n(g, 40, 160)) for i in range(15)]
    if name == "shared_docs":
        docs = [_ids(g, _n(g, 200, 480)) for _ in range(4)]
        return [docs[i % 4] + _ids(g, _n(g, 30, 120)) for i in range(16)]
    if name == "multi_turn":
        chats = [_ids(g, _n(g, 200, 400)) for _ in range(3)]
        out = []
        for _ in range(4):
            for c in range(3):
                out.append(list(chats[c]))
                chats[c] = chats[c] + _ids(g, _n(g, 80, 200))
        return out
    if name == "few_shot":
        sets = [_ids(g, 700), _ids(g, 700)]
        return [sets[i % 2] + _ids(g, _n(g, 20, 80)) for i in range(10)]
    raise ValueError(f"block_workload: expected one of {BLOCK_WORKLOADS}, got {name!r}")


def nemotron_ratios(name="Nemotron-H 8B", entry="node") -> dict:
    """A published Mamba-2 hybrid's byte sizes per sequence, as the engine's prefix tree holds
    them (fp32 state; bf16 conv window, node entries and KV): ``state_bytes`` state + conv
    window of one recurrent layer, ``entry_bytes`` what a node keeps of one token of one layer
    (the layer's inputs before the conv, xBC and dt: ``families.minimal_entry_bytes``; a seat
    derives the log's entries from them), ``kv_token_bytes`` KV of one token over every
    attention layer, ``log_token_bytes`` node entries of one token over every recurrent layer,
    and the two ratios ``state_per_entry`` and ``kv_per_log``. ``entry="log"``: the whole log
    entry instead (xBC, x, dt, B, C: what the teaching cache's nodes and the decode log keep)."""
    from replaylab.families import FAMILY_SHAPES, entry_bytes, minimal_entry_bytes, state_bytes
    from replaylab.shapes import PUBLISHED_SHAPES, memory_per_sequence

    if entry not in ("node", "log"):
        raise ValueError(f"entry: expected 'node' or 'log', got {entry!r}")
    fam, shape = FAMILY_SHAPES[name], PUBLISHED_SHAPES[name]
    conv = memory_per_sequence(shape, 1)["conv_state"] // shape.n_ssm
    state = state_bytes(fam) + conv
    entry = minimal_entry_bytes(fam) if entry == "node" else sum(entry_bytes(fam).values())
    kv = shape.kv_elems_per_token * 2
    return _ratios(name, state, entry, kv, shape.n_ssm)


def _ratios(name, state, entry, kv, n_ssm) -> dict:
    return dict(
        model=name,
        state_bytes=state,
        entry_bytes=entry,
        kv_token_bytes=kv,
        log_token_bytes=n_ssm * entry,
        state_per_entry=round(state / entry, 3),
        kv_per_log=round(kv / (n_ssm * entry), 5),
    )


def ratio_model(seed=0):
    """The benchmark's model (see the module docstring): a ``HybridLM`` with pattern "M*M"
    (Mamba-2, attention, Mamba-2; no MLP), hidden 32, vocabulary 50, H=16 heads of P=64,
    N=336, G=1, one KV head of width 56, fp32, random weights (``seed``)."""
    from replaylab.model import HybridConfig, HybridLM

    cfg = HybridConfig(
        vocab_size=VOCAB,
        hidden_size=32,
        pattern="M*M",
        ssm_heads=16,
        ssm_head_dim=64,
        d_state=336,
        n_groups=1,
        attn_heads=2,
        kv_heads=1,
        head_dim=56,
        intermediate_size=64,
    )
    return HybridLM(cfg, seed=seed).eval()


def model_ratios(engine) -> dict:
    """``nemotron_ratios``' fields for ``engine``'s model, measured from the tensors one real
    full node of an ``EnginePrefixCache`` over it holds (a replay engine: a probe block of L
    tokens admitted, its node read back)."""
    from replaylab.serving import EnginePrefixCache

    if engine.strategy != "replay":
        raise ValueError(
            f"engine: expected a replay engine (its nodes hold logs), got {engine.strategy!r}"
        )
    cache = EnginePrefixCache(engine, block_size=engine.L)
    slot, _, _ = cache.admit([0] * (engine.L + 1))
    engine.retire(slot)
    node = cache.root.children[0]
    n_ssm = len(node.end_state)
    state = sum(s.nbytes() for s in node.end_state.values()) // n_ssm
    entry = sum(_bytes(t) for f in node.log.values() for t in f.values()) // (n_ssm * engine.L)
    kv = sum(_bytes(k) + _bytes(v) for k, v in node.kv.values()) // engine.L
    return _ratios("replaylab.bench.prefix_blocks.ratio_model", state, entry, kv, n_ssm)


def _bytes(t) -> int:
    return t.numel() * t.element_size()


def _standin(shape, dtype):
    """A tensor of ``shape`` and ``dtype`` that stores one element (an expanded scalar): its
    numel and element size are a real node's, its memory is not."""
    return torch.zeros((), dtype=dtype).expand(*shape)


class ByteTree(PrefixTree):
    """The tree an ``EnginePrefixCache(engine, block_size, budget_bytes, eviction)`` would
    build, with byte stand-ins for the tensors (``_standin``: the shapes and dtypes of the
    engine's pools, a node of n tokens holding per attention layer k, v (1, kv_heads, n,
    head_dim), per recurrent layer at a full block ``LayerState`` (1, *state) fp32 and
    (1, d_conv - 1, conv_dim), under replay per recurrent layer {field: (1, n, *entry)}).

    ``serve(prompt)`` -> ``PrefixHit``: plan, hit report, insertion and eviction exactly as the
    engine cache's ``admit`` runs them, without the model. The block sizes, budgets and
    prompts refused are the engine cache's (it is built once on ``engine`` to check them)."""

    def __init__(self, engine, block_size, budget_bytes=None, eviction=DEFAULT_EVICTION):
        from replaylab.serving import EnginePrefixCache

        real = EnginePrefixCache(engine, block_size=block_size, eviction=eviction)
        self.strategy, self.eviction = real.strategy, eviction
        self.max_len, self.vocab_size = real.max_len, real.vocab_size
        self.block_size = self.interval = real.block_size
        self.block_bytes, self.block_log_bytes = real.block_bytes, real.block_log_bytes
        self._kv = {l: (p.k.shape[1], p.k.shape[3], p.k.dtype) for l, p in engine.kv.items()}
        self._ssm = {
            l: (
                (tuple(p.state.shape[1:]), p.state.dtype),
                (tuple(p.conv.shape[1:]), p.conv.dtype),
                p.node_layout(),
            )
            for l, p in engine.ssm.items()
        }
        self._init_tree(budget_bytes)

        self._real = real  # its prompt checks

    @property
    def max_prompt(self) -> int:
        return self._real.max_prompt

    def _length_error(self, n) -> str:
        return self._real._length_error(n)

    def _make_node(self, seg, g, parent):
        n = len(seg)
        node = _Node(g, tuple(seg), parent)
        for layer, (heads, width, dtype) in self._kv.items():
            node.kv[layer] = (_standin((1, heads, n, width), dtype),) * 2
        if n == self.block_size:
            node.end_state = {
                l: LayerState(_standin((1, *s), sd), _standin((1, *c), cd))
                for l, ((s, sd), (c, cd), _) in self._ssm.items()
            }
        if self.strategy == "replay":
            node.log = {
                l: {f: _standin((1, n, *shape), dt) for f, (shape, dt) in fields.items()}
                for l, (_, _, fields) in self._ssm.items()
            }
        return node

    def serve(self, prompt):
        """The hit report an engine cache's ``admit(prompt)`` gives, and its tree updates."""
        tokens = self._check_prompt(prompt)
        plan = self._plan(tokens)
        hit = self._hit(len(tokens), plan)
        self._insert(tokens, lambda seg, g, parent: self._make_node(seg, g, parent))
        self._evict_to_budget()
        return hit


def _engine(model, strategy, max_len, L):
    from replaylab.serving import DecodeEngine

    return DecodeEngine(model, 1, max_len, strategy, log_length=L, max_verify=1, prefill_chunk=512)


def attention_ideal(stream) -> float:
    """An attention-only model's token hit rate on ``stream`` with every earlier prompt held:
    per request its longest common prefix with any earlier one, capped at T - 1 (the last
    token is computed for its logits), summed over the stream / its prompt tokens."""
    hit = 0
    for i, tokens in enumerate(stream):
        best = 0
        for other in stream[:i]:
            n = 0
            for a, b in zip(tokens, other):
                if a != b:
                    break
                n += 1
            best = max(best, n)
        hit += min(best, len(tokens) - 1)
    return round(hit / sum(len(t) for t in stream), 4)


def _stream_row(hits, total, tree) -> dict:
    return dict(
        token_hit_rate=round(sum(h.resumed_from for h in hits) / total, 4),
        matched_rate=round(sum(min(h.matched, h.prompt_length - 1) for h in hits) / total, 4),
        computed_tokens=sum(h.computed for h in hits),
        bytes_held=tree.held_bytes,
        evicted_stops=sum(h.limited_by == "evicted" for h in hits),
    )


def _budgets(low=2**21, high=2**29, per_octave=2) -> list[int]:
    """Geometric byte budgets from ``low`` to ``high``, ``per_octave`` per doubling."""
    steps = round(math.log2(high / low) * per_octave)
    return [round(low * 2 ** (i / per_octave)) for i in range(steps + 1)]


def run_block_bench(
    model=None,
    block_sizes=BLOCK_SIZES,
    budgets=None,
    workloads=BLOCK_WORKLOADS,
    strategies=("replay", "snapshot", "recompute"),
    log_length=16,
    validate=(("system_prompts", 512, (None, 2**25)), ("shared_docs", 64, (2**25,))),
    eviction=DEFAULT_EVICTION,
    log=print,
) -> dict:
    """Per workload, block size, strategy and budget (``budgets``: bytes, default 2 MiB to
    512 MiB at two per octave; None: no cap, always run): the token hit rate, the ideal,
    prefill tokens computed, bytes held after the stream and requests stopped by an eviction
    (``rows``; a budget under one block is recorded as ``skipped``). ``validate``: (workload,
    block size, budgets) whose streams the real engine cache also serves (the model prefilling
    every request): ``validation`` rows say whether each request's hit report and the bytes
    held equal the ``ByteTree``'s, with the seconds the real run took. ``eviction``: the
    trees' policy (``prefix.PREFIX_EVICTION``)."""
    if eviction not in PREFIX_EVICTION:
        raise ValueError(f"eviction: expected one of {PREFIX_EVICTION}, got {eviction!r}")
    model = model or ratio_model()
    budgets = [None, *(_budgets() if budgets is None else budgets)]
    streams = {name: block_workload(name) for name in workloads}
    longest = max(len(t) for s in streams.values() for t in s)
    max_len = max(longest, *block_sizes) + 1
    engines = {s: _engine(model, s, max_len, log_length) for s in strategies}
    rows = []
    for name, stream in streams.items():
        total, ideal = sum(len(t) for t in stream), attention_ideal(stream)
        for block in block_sizes:
            for strategy in strategies:
                for budget in budgets:
                    row = dict(
                        workload=name,
                        block_size=block,
                        strategy=strategy,
                        budget=budget,
                        ideal_hit_rate=ideal,
                    )
                    try:
                        tree = ByteTree(engines[strategy], block, budget, eviction)
                    except ValueError as err:
                        rows.append(dict(row, skipped=str(err)))
                        continue
                    hits = [tree.serve(t) for t in stream]
                    tree.check_rebuildable()
                    row.update(requests=len(stream), prompt_tokens=total)
                    row.update(_stream_row(hits, total, tree), block_bytes=tree.block_bytes)
                    rows.append(row)
        log(f"{name}: {len(block_sizes) * len(strategies) * len(budgets)} streams")
    checks = [
        _validate(engines[strategy], name, block, budget, eviction)
        for name, block, check_budgets in validate
        for strategy in strategies
        for budget in check_budgets
    ]
    for c in checks:
        log(
            f"validate {c['workload']} b={c['block_size']} {c['strategy']} budget {c['budget']}: "
            f"hits equal {c['hits_equal']}, bytes equal {c['bytes_equal']} ({c['real_seconds']} s)"
        )
    replay = engines.get("replay") or _engine(model, "replay", max_len, log_length)
    ratios = dict(nemotron=nemotron_ratios(), model=model_ratios(replay))
    scale = ratios["nemotron"]["log_token_bytes"] / ratios["model"]["log_token_bytes"]
    return dict(
        kind="prefix-blocks",
        eviction=eviction,
        model="replaylab.bench.prefix_blocks.ratio_model",
        ratios=ratios,
        nemotron_scale=round(scale, 3),
        log_length=log_length,
        max_len=max_len,
        workloads={
            n: dict(
                requests=len(s),
                prompt_tokens=sum(map(len, s)),
                shortest=min(map(len, s)),
                longest=max(map(len, s)),
            )
            for n, s in streams.items()
        },
        rows=rows,
        validation=checks,
    )


def _validate(engine, name, block, budget, eviction=DEFAULT_EVICTION) -> dict:
    """One stream through the real ``EnginePrefixCache`` over ``engine`` (the model prefills
    every request) and through a ``ByteTree``: whether every hit report and the bytes held
    agree, the real run's token hit rate and seconds."""
    from replaylab.serving import EnginePrefixCache

    stream = block_workload(name)
    tree = ByteTree(engine, block, budget, eviction)
    real = EnginePrefixCache(engine, block_size=block, budget_bytes=budget, eviction=eviction)
    t0, hits, same = time.perf_counter(), [], True
    with torch.no_grad():
        for tokens in stream:
            slot, _, hit = real.admit(tokens)
            engine.retire(slot)
            hits.append(hit)
            same = same and hit == tree.serve(tokens)
    total = sum(len(t) for t in stream)
    return dict(
        workload=name,
        block_size=block,
        strategy=engine.strategy,
        budget=budget,
        hits_equal=same,
        bytes_equal=real.held_bytes == tree.held_bytes,
        token_hit_rate=round(sum(h.resumed_from for h in hits) / total, 4),
        bytes_held=real.held_bytes,
        real_seconds=round(time.perf_counter() - t0, 2),
    )


def pooled_hit_rate(rows, strategy, block, budget, field="token_hit_rate"):
    """Token hit rate over every workload's stream in ``rows`` together (sum of resumed
    positions / sum of prompt tokens; ``field="ideal_hit_rate"``: the ideal's) for one
    strategy, block size and budget; None if a stream was skipped (a budget under one
    block)."""
    got = [
        r
        for r in rows
        if (r["strategy"], r["block_size"], r["budget"]) == (strategy, block, budget)
    ]
    if not got or any("skipped" in r for r in got):
        return None
    total = sum(r["prompt_tokens"] for r in got)
    return sum(r[field] * r["prompt_tokens"] for r in got) / total


def block_targets(result, block=512, within=0.05) -> dict:
    """The issue's two hit-rate targets, from a ``run_block_bench`` result, at ``block``:

    per_budget     for each budget: replay's and align's (snapshot's) token hit rates pooled
                   over the workloads, and their ratio (None where align hits nothing)
    per_workload   per workload and budget the same pair, and ``ceiling``: the attention-only
                   ideal over align's hit rate, the most any prefix cache could reach over
                   align there (no cache resumes past the matched tokens)
    ideal_from     per block size: the smallest budget from which replay's pooled hit rate
                   stays within ``within`` (relative) of the pooled ideal, replay's and
                   align's hit rates there, and the budget from which align's stays within
                   it (``align_from``; "never": not even without a budget)
    """
    rows = result["rows"]
    budgets = sorted({r["budget"] for r in rows if r["budget"] is not None}) + [None]
    names = sorted({r["workload"] for r in rows}, key=list(BLOCK_WORKLOADS).index)
    pooled_ideal = pooled_hit_rate(rows, "replay", block, None, field="ideal_hit_rate")

    def pair(replay, align):
        ratio = None if not align or replay is None else round(replay / align, 3)
        return dict(replay=replay, align=align, ratio=ratio)

    def one(name, strategy, b, budget):
        r = next(
            r
            for r in rows
            if (r["workload"], r["strategy"], r["block_size"], r["budget"])
            == (name, strategy, b, budget)
        )
        return r.get("token_hit_rate")

    per_budget = [
        dict(
            budget=budget,
            **pair(
                _round(pooled_hit_rate(rows, "replay", block, budget)),
                _round(pooled_hit_rate(rows, "snapshot", block, budget)),
            ),
        )
        for budget in budgets
    ]

    def ceiling(name, budget):
        align = one(name, "snapshot", block, budget)
        ideal = next(r["ideal_hit_rate"] for r in rows if r["workload"] == name)
        return None if not align else round(ideal / align, 3)

    per_workload = {
        name: [
            dict(
                budget=budget,
                **pair(one(name, "replay", block, budget), one(name, "snapshot", block, budget)),
                ceiling=ceiling(name, budget),
            )
            for budget in budgets
        ]
        for name in names
    }

    def reaches(strategy, b):
        """The smallest budget from which ``strategy``'s pooled hit rate at block b stays
        within ``within`` of the ideal ("never" if even no budget does not)."""
        held = [
            x
            for x in budgets
            if _close(pooled_hit_rate(rows, strategy, b, x), pooled_ideal, within)
        ]
        return next((x for i, x in enumerate(budgets) if set(budgets[i:]) <= set(held)), "never")

    ideal_from = {}
    for b in sorted({r["block_size"] for r in rows}):
        first = reaches("replay", b)
        at = (
            (lambda s: None)
            if first == "never"
            else (lambda s: _round(pooled_hit_rate(rows, s, b, first)))
        )
        ideal_from[b] = dict(
            budget=first,
            replay=at("replay"),
            align=at("snapshot"),
            align_from=reaches("snapshot", b),
        )
    return dict(
        block_size=block,
        within=within,
        pooled_ideal=round(pooled_ideal, 4),
        per_budget=per_budget,
        per_workload=per_workload,
        ideal_from=ideal_from,
    )


def _round(v):
    return None if v is None else round(v, 4)


def _close(value, ideal, within):
    return value is not None and value >= (1 - within) * ideal


def _mib(budget, scale):
    """A budget as 'model MiB (Nemotron-H 8B GiB)'; None is 'none'."""
    if budget is None:
        return "none"
    return f"{budget / 2**20:.1f} MiB ({budget * scale / 2**30:.2f} GiB)"


def _rate(v):
    return "-" if v is None else f"{v:.3f}"


def blocks_markdown(result, block=512, octave_only=True) -> dict[str, list[str]]:
    """The tables ``data/PREFIX.md`` shows for a ``run_block_bench`` result, as markdown lines:
    ``no_budget`` token hit rate per workload and block size, replay / align / recompute (the
    ideal beside the workload); ``equal_bytes`` replay / align at ``block`` per budget (the
    powers of two when ``octave_only``), per workload and pooled, with their ratio; ``pooled``
    replay / align pooled over the workloads per budget and block size; ``ideal_from`` the
    budget from which replay stays within 5% of the pooled ideal, per block size, and align's
    hit rate there. Budgets read "model MiB (Nemotron-H 8B GiB)"; "-" is a budget under one
    block. ``ratios``: the byte sizes of Nemotron-H 8B and of the model, and their ratios;
    ``block_bytes``: one full node's bytes per block size and strategy."""
    rows, scale = result["rows"], result["nemotron_scale"]
    names = [n for n in BLOCK_WORKLOADS if any(r["workload"] == n for r in rows)]
    blocks = sorted({r["block_size"] for r in rows})
    rate = {
        (r["workload"], r["block_size"], r["strategy"], r["budget"]): r.get("token_hit_rate")
        for r in rows
    }
    ideal = {r["workload"]: r["ideal_hit_rate"] for r in rows}
    t = block_targets(result, block)
    shown = [
        p["budget"]
        for p in t["per_budget"]
        if not (octave_only and p["budget"] is not None and p["budget"] & (p["budget"] - 1))
    ]
    no_budget = [
        "| workload (ideal) | " + " | ".join(f"b={b}" for b in blocks) + " |",
        "|---|" + "---|" * len(blocks),
    ]
    for n in names:
        cells = [
            " / ".join(_rate(rate[(n, b, s, None)]) for s in ("replay", "snapshot", "recompute"))
            for b in blocks
        ]
        no_budget.append(f"| {n} ({ideal[n]:.3f}) | " + " | ".join(cells) + " |")
    equal = [
        "| budget | " + " | ".join(names) + " | pooled | ratio |",
        "|---|" + "---|" * (len(names) + 2),
    ]
    for i, p in enumerate(t["per_budget"]):
        if p["budget"] not in shown:
            continue
        cells = [
            f"{_rate(w[i]['replay'])} / {_rate(w[i]['align'])}" for w in t["per_workload"].values()
        ]
        ratio = "-" if p["ratio"] is None else f"{p['ratio']:.2f}x"
        equal.append(
            f"| {_mib(p['budget'], scale)} | "
            + " | ".join(cells)
            + f" | {_rate(p['replay'])} / {_rate(p['align'])} | {ratio} |"
        )
    pooled = [
        "| budget | " + " | ".join(f"b={b}" for b in blocks) + " |",
        "|---|" + "---|" * len(blocks),
    ]
    for budget in shown:
        cells = [
            " / ".join(
                _rate(_round(pooled_hit_rate(rows, s, b, budget))) for s in ("replay", "snapshot")
            )
            for b in blocks
        ]
        pooled.append(f"| {_mib(budget, scale)} | " + " | ".join(cells) + " |")
    ideal_from = [
        "| block | replay from | replay there | align there | align from |",
        "|---|---|---|---|---|",
    ]
    for b, v in t["ideal_from"].items():
        budget, align = (
            x if x == "never" else _mib(x, scale) for x in (v["budget"], v["align_from"])
        )
        ideal_from.append(
            f"| {b} | {budget} | {_rate(v['replay'])} | {_rate(v['align'])} | {align} |"
        )
    ratios = [
        "| model | state + conv window / layer | node entry / layer, token | KV / token | "
        "node entries / token | state / entry | KV / entries |",
        "|---|---|---|---|---|---|---|",
    ]
    for key in ("nemotron", "model"):
        r = result["ratios"][key]
        ratios.append(
            f"| {r['model']} | {r['state_bytes']:,} | {r['entry_bytes']:,} | "
            f"{r['kv_token_bytes']:,} | {r['log_token_bytes']:,} | {r['state_per_entry']:.1f} | "
            f"{r['kv_per_log']:.4f} |"
        )
    sizes = {(r["block_size"], r["strategy"]): r["block_bytes"] for r in rows if "block_bytes" in r}
    block_bytes = [
        "| block | replay | snapshot (align) | recompute | replay / align |",
        "|---|---|---|---|---|",
    ]
    for b in blocks:
        cells = [_mib(sizes[(b, s)], scale) for s in ("replay", "snapshot", "recompute")]
        ratio = sizes[(b, "replay")] / sizes[(b, "snapshot")]
        block_bytes.append(f"| {b} | " + " | ".join(cells) + f" | {ratio:.1f}x |")
    return dict(
        ratios=ratios,
        block_bytes=block_bytes,
        no_budget=no_budget,
        equal_bytes=equal,
        pooled=pooled,
        ideal_from=ideal_from,
    )
