"""Exercise checks of notebook 14 (prefix caching of recurrent state): the radix-tree lookup
over token ids on a block grid, the state at position p from a grid checkpoint and the logged
scan inputs after it, and two questions whose answers the library computes at check time. Each
check compares the learner's answer with the library (``prefix.PrefixTree``, a one-shot prefill
of the model and ``scan.ssd_scan`` in float64, ``prefix.PrefixCache``), prints PASS or FAIL
with the first mismatch and what it points at, and records its verdict (``grading``).

Glossary (as in ``replaylab.prefix``):
    b          block_size: node i of a path holds tokens [i*b, (i+1)*b) (a tail node fewer)
    node       ``.start`` (grid position of its first token), ``.tokens`` (a tuple of up to b
               ids), ``.children`` (a list of nodes); the root holds no tokens
    m          matched: the longest prefix of a prompt that the tree holds (it may end inside
               a block: KV rows, and under replay the log, are held for every token)
    g          a grid position (a multiple of b); S_g the recurrent state after g tokens
    j          p - g: logged entries folded onto S_g to get the state at p (0 <= j <= b)
    x, dt, B   one Mamba-2 layer's logged scan inputs, (j, H, P), (j, H) raw, (j, G, N)
    groups     the H heads fall into G groups of H / G contiguous heads: head h reads row
               h // (H / G) of B and C (``repeat_interleave``, as ``scan.ssd_scan`` expands)
    Δ, a       Δ = clamp(softplus(dt + dt_bias), *dt_limit); a = exp(Δ A), one per head
"""

from __future__ import annotations

import random

import torch

from replaylab.checks import max_abs_error
from replaylab.prefix import PrefixCache, PrefixTree, _common, _Node
from replaylab.scan import ssd_scan
from replaylab.teaching.exercises_common import whole_number
from replaylab.teaching.grading import describe_exception, guarded, report

__all__ = [
    "WORKLOAD_STREAM_RESULTS",
    "EARLIER_WORKLOAD_STREAMS",
    "check_stream_bound",
    "block_parts",
    "TokenTree",
    "check_prefix_lookup",
    "fold_case",
    "check_state_at",
    "GROUPED_MODEL",
    "grouped_model",
    "RESUME_SCENARIO",
    "resume_points",
    "check_resume_points",
    "ALIGN_BLOCKS",
    "serve_stream",
    "token_hit_rate",
    "check_align_zero_block",
    "OFFGRID_TTFT",
    "check_offgrid_extra_tokens",
    "check_chunk_resume_extra_tokens",
]

# The H200 TTFT run with the shared prompt off the block grid (notebook 14, section 6)
OFFGRID_TTFT = "data/bench_prefix_ttft_offgrid_gpu.json"
# replay with its hits resumed at the match and on the prefill's chunk grid, beside align (CPU)
CHUNK_RESUME_TTFT = "data/bench_prefix_ttft_resume_chunk_cpu.json"
# the prefix-sharing request streams on an H100 (``replaylab bench workload-stream --preset gpu``)
WORKLOAD_STREAM_RESULTS = {
    w: f"data/bench_workload_stream_gpu_{w}_decode_h100_90b36f1.json"
    for w in ("multi_turn", "system_prompts", "few_shot", "agents")
}
# the same streams run earlier on engines built for k = 4 drafts in every mode, and a budget
# sized on them (notebook 14, section 7)
EARLIER_WORKLOAD_STREAMS = {
    w: f"data/bench_workload_stream_gpu_{w}_h100_6b344e2.json" for w in WORKLOAD_STREAM_RESULTS
}


# --------------------------------------------------------------------------------------------
# What a block holds


def block_parts(model, block_size=16) -> dict:
    """The parts of one full block a replay ``PrefixCache`` over ``model`` holds, in bytes,
    measured from the node it builds for a prompt of ``block_size`` + 1 tokens: ``kv`` the
    block's KV rows over every attention layer, ``state`` one recurrent layer's state + conv
    window (what align also keeps at the block's end), ``entry`` one token's log entry of one
    recurrent layer (replay only), ``recurrent`` the number of recurrent layers, and
    ``state_per_entry`` = state / entry."""
    prefix = _prefix_of_tokens(model, [0] * (block_size + 1), block_size)
    node = prefix.root.children[0]
    n = len(node.end_state)
    state = sum(st.nbytes() for st in node.end_state.values()) // n
    entry = sum(t.numel() * t.element_size() for f in node.log.values() for t in f.values())
    kv = sum(t.numel() * t.element_size() for pair in node.kv.values() for t in pair)
    return dict(
        kv=kv,
        state=state,
        entry=entry // (n * block_size),
        recurrent=n,
        state_per_entry=state / (entry / (n * block_size)),
    )


# --------------------------------------------------------------------------------------------
# Exercise 1: the lookup


class TokenTree(PrefixTree):
    """The library's radix tree over token ids and nothing else (no KV, no states): the same
    nodes, matching and insertion as ``PrefixCache``, for trees built without a model."""

    def __init__(self, block_size, vocab_size=1 << 30, max_len=1 << 20):
        self.strategy, self.eviction = "replay", "lru"
        self.block_size = self.interval = block_size
        self.max_len, self.vocab_size, self.block_bytes = max_len, vocab_size, 1
        self._init_tree(None)

    def insert(self, tokens):
        """Add a prompt's blocks the tree lacks (as ``PrefixCache.serve`` does after a request)."""
        self._insert(list(tokens), lambda seg, g, parent: _Node(g, tuple(seg), parent))


def _lookup_cases(n_random, seed):
    """(block_size, inserted prompts, query): fixed edge cases, then random trees over small
    vocabularies (so prompts share prefixes) queried with prefixes, extensions, one-token edits
    and fresh prompts."""
    cases = [
        (4, [], [1, 2, 3]),  # an empty tree holds nothing
        (4, [[1, 2, 3, 4, 5, 6]], [1, 2, 3, 4, 5, 6]),  # the whole prompt
        (4, [[1, 2, 3, 4, 5, 6]], [1, 2, 9, 9, 9]),  # ends inside the first block
        (4, [[1, 2, 3, 4, 5, 6]], [1, 2, 3, 4, 5, 7, 7]),  # ends inside the tail node
        (4, [[1, 2, 3, 4, 5, 6]], [1, 2, 3, 4, 5, 6, 7, 8, 9]),  # runs past the tail node
        (4, [[1, 2, 3, 4, 5, 6]], [2, 2, 3, 4]),  # differs at the first token
        (4, [[1, 2, 5, 5, 1], [1, 2, 3, 4, 9]], [1, 2, 3, 4, 9, 9]),  # the second child is longer
        (2, [[1, 1, 1, 1, 1, 1, 2]], [1, 1, 1, 1, 1, 1, 1, 1]),  # a chain of equal blocks
        (3, [[4, 4], [4, 4, 4, 5]], [4, 4, 4, 5, 5]),  # a tail node beside a full block
    ]
    rng = random.Random(seed)
    for _ in range(n_random):
        b = rng.choice((2, 3, 4, 8))
        vocab = rng.choice((2, 3, 5))

        def ids(n, vocab=vocab):
            return [rng.randrange(vocab) for _ in range(n)]

        bases = [ids(rng.randint(0, 4 * b)) for _ in range(rng.randint(1, 3))]
        prompts = [rng.choice(bases) + ids(rng.randint(1, 2 * b)) for _ in range(rng.randint(1, 6))]
        kind = rng.random()
        if kind < 0.25:  # a prefix of an earlier prompt
            src = rng.choice(prompts)
            query = src[: rng.randint(1, len(src))]
        elif kind < 0.5:  # an earlier prompt extended
            query = rng.choice(prompts) + ids(rng.randint(1, 2 * b))
        elif kind < 0.75:  # an earlier prompt with one token changed
            query = list(rng.choice(prompts))
            i = rng.randrange(len(query))
            query[i] = (query[i] + 1) % vocab
        else:  # a shared base and a fresh continuation
            query = rng.choice(bases) + ids(rng.randint(1, 3 * b))
        cases.append((b, prompts, query))
    return cases


def _shape(node):
    return [(id(c), c.start, c.tokens, _shape(c)) for c in node.children]


def _short(tokens, limit=40):
    tokens = list(tokens)
    return str(tokens) if len(tokens) <= limit else f"{tokens[:limit]}... ({len(tokens)} ids)"


def _held_path(tree, tokens):
    """The blocks of the tree's match of ``tokens``, as (start, node tokens)."""
    path, _, _ = tree._match(tokens)
    return [(n.start, n.tokens) for n in path]


def _lookup_hint(tree, tokens, got_m, want_m):
    b = tree.block_size
    nodes = list(tree.nodes())
    if got_m > want_m:
        nxt = tokens[want_m] if want_m < len(tokens) else None
        for n in nodes:  # the learner counted a block whose tokens only partly match
            c = _common(n.tokens, tokens[n.start :])
            if n.start <= want_m < n.end and c and n.start + c == want_m:
                if got_m == n.end:
                    return (
                        f"the block at g={n.start} holds {list(n.tokens)}, the prompt has "
                        f"{tokens[n.start : n.end]} there: only its first {c} tokens match, so "
                        f"the tree holds the prompt up to {n.start + c}, not to the block's end "
                        "(count the common prefix, not whole blocks)"
                    )
        return (
            f"the tree holds no continuation of tokens[:{want_m}] with token {nxt} at position "
            f"{want_m}: no earlier prompt had it"
        )
    if want_m % b and got_m == want_m // b * b:
        return (
            f"{got_m} is the last grid position, but the tree holds {want_m - got_m} more tokens "
            f"inside the next block: a match may end inside a block (KV rows, and under replay "
            "the log, are held for every token; only a resume under snapshot rounds down)"
        )
    return (
        f"the tree holds the blocks {_held_path(tree, tokens)} (start, tokens) of this "
        "prompt: at each node take the child with the longest common prefix (several children "
        "may share their first tokens), descend only through a block matched in full, and stop "
        "inside a block or at a tail node shorter than block_size"
    )


def _node_ok(tree, tokens, m, node) -> bool:
    """Does ``node`` belong to the tree and hold token m - 1 of ``tokens`` on its path?"""
    if not any(node is n for n in tree.nodes()):
        return False
    held = node.start + _common(node.tokens, tokens[node.start :])
    return node.start < m <= held and tree._prefix_of(node)[: node.start] == tuple(
        tokens[: node.start]
    )


@guarded("prefix lookup")
def check_prefix_lookup(fn, cases=300, seed=0) -> bool:
    """Exercise (notebook 14): ``fn(root, tokens, block_size) -> (m, node)``, the longest prefix
    of ``tokens`` (a list of ids) the tree below ``root`` holds and the node holding its last
    token (None when m == 0), compared with ``PrefixTree.lookup`` on fixed edge cases and
    ``cases`` random trees (shared and unshared prefixes, partial blocks, tail nodes)."""
    name = "prefix lookup"
    all_cases = _lookup_cases(cases, seed)
    for b, prompts, query in all_cases:
        tree = TokenTree(b)
        for p in prompts:
            tree.insert(p)
        want_m, _ = tree.lookup(query)
        where = (
            f"block_size={b}, earlier prompts {'; '.join(_short(p) for p in prompts) or 'none'}, "
            f"query {_short(query)}"
        )
        before = _shape(tree.root)
        try:
            got = fn(tree.root, list(query), b)
        except NotImplementedError:
            raise
        except Exception as err:  # the learner's code raised on this case
            return report(name, False, f"on {where}: {describe_exception(err)}")
        if _shape(tree.root) != before:
            return report(name, False, f"on {where}: your lookup changed the tree")
        if got is None:
            return report(name, False, "not done yet (the function returned None)")
        try:
            got_m, node = got
            m = whole_number(got_m)
        except (TypeError, ValueError) as err:
            return report(name, False, f"on {where}: expected (m, node), got {got!r} ({err})")
        if m is None:
            return report(name, False, f"on {where}: m must be a whole number, got {got_m!r}")
        got_m = m
        if got_m != want_m:
            hint = _lookup_hint(tree, list(query), got_m, want_m)
            return report(name, False, f"on {where}: m expected {want_m}, got {got_m}: {hint}")
        if want_m == 0:
            if node is not None:
                return report(name, False, f"on {where}: nothing matches, so the node is None")
            continue
        if node is None or not _node_ok(tree, list(query), want_m, node):
            held = f"start={node.start}, tokens={list(node.tokens)}" if node is not None else None
            return report(
                name,
                False,
                f"on {where}: m={want_m} is right, but the node ({held}) does not hold token "
                f"{want_m - 1}: return the tree's node whose block holds the match's last token "
                "(node.start < m <= node.start + its common prefix with the prompt)",
            )
    return report(name, True, f"{len(all_cases)} lookups give the library's PrefixTree match")


# --------------------------------------------------------------------------------------------
# Exercise 2: the state at p from a grid checkpoint and the log after it


def _prefix_of_tokens(model, tokens, block_size):
    prefix = PrefixCache(model, "replay", block_size=block_size, max_len=max(len(tokens), 1))
    prefix.serve(tokens)
    return prefix


def _blocks(prefix, layer):
    shape = prefix.model.cache_spec().recurrent[layer].state_shape
    blocks = []
    for node in sorted(prefix.nodes(), key=lambda n: n.start):
        if node.parent is prefix.root:
            ckpt = torch.zeros(shape, dtype=torch.float64)
        else:
            ckpt = node.parent.end_state[layer].ssm[0].double()
        log = {f: node.log[layer][f][0].double() for f in ("x", "dt", "B", "C")}
        blocks.append((node.start, ckpt, log))
    return blocks


def _params64(model, layer):
    p = model.cache_spec().recurrent[layer].params()
    A, D, bias = (t.detach().double() for t in (p.A, p.D, p.dt_bias))
    return type(p)(A, D, bias, tuple(p.dt_limit))


def fold_case(model, tokens, block_size, layer=None):
    """What a replay prefix cache holds for ``tokens``: ``(blocks, params)``, one entry of
    ``blocks`` per node of the tree the library's ``PrefixCache`` (replay) builds for them,
    ``(g, checkpoint, log)``: checkpoint the state S_g of recurrent layer ``layer`` (the first
    by default), float64 (H, P, N) (zeros at g = 0); log {"x": (n, H, P), "dt": (n, H), "B",
    "C": (n, G, N)} float64, the logged scan inputs of the block's n <= b tokens g, ...,
    g + n - 1. ``params``: the layer's Mamba2Params (A, D, dt_bias (H,) float64, dt_limit)."""
    layer = next(iter(model.cache_spec().recurrent)) if layer is None else layer
    return _blocks(_prefix_of_tokens(model, tokens, block_size), layer), _params64(model, layer)


def _fold64(ckpt, log, j, params, raw_dt=False, bias=True, clamp=True, groups="contiguous"):
    """The float64 oracle: ``ssd_scan`` over the first j entries from ``ckpt``. The other
    arguments give a usual mistake's state instead, for the FAIL hints: ``raw_dt`` the logged
    dt as the step, ``bias=False`` no dt_bias, ``clamp=False`` no dt_limit, ``groups="tiled"``
    B and C expanded to the heads with ``repeat`` (head h reads group h % G) instead of
    ``repeat_interleave`` (group h // (H / G))."""
    B, C = log["B"][None, :j], log["C"][None, :j]
    if groups == "tiled":
        rep = log["x"].shape[1] // B.shape[2]
        B, C = B.repeat(1, 1, rep, 1), C.repeat(1, 1, rep, 1)
    return ssd_scan(
        log["x"][None, :j],
        log["dt"][None, :j],
        params.A,
        B,
        C,
        dt_bias=None if raw_dt or not bias else params.dt_bias,
        dt_softplus=not raw_dt,
        dt_limit=params.dt_limit if clamp and not raw_dt else (0.0, float("inf")),
        initial_state=ckpt[None],
        compute_dtype=torch.float64,
    ).state[0]


def _prefill_states(model, tokens, p):
    """{layer: state after a one-shot prefill of tokens[:p]} (fp32; zeros at p = 0)."""
    from replaylab.cache import HybridCache

    spec = model.cache_spec()
    if p == 0:
        return {layer: torch.zeros(s.state_shape) for layer, s in spec.recurrent.items()}
    cache = HybridCache(model, 1, "snapshot")
    with torch.no_grad():
        model(torch.tensor([tokens[:p]]), cache)
    return {layer: cache.state(layer).ssm[0] for layer in spec.recurrent}


def _relative(got, want) -> float:
    """Largest |got - want| over the largest |want| (the tiny model's states are ~1e-4)."""
    return max_abs_error(got, want) / max(float(want.abs().max()), 1e-30)


def _close(got, want, rel=1e-9) -> bool:
    return _relative(got, want) <= rel


def _clone_log(log):
    return {k: v.clone() for k, v in log.items()}


def _fold_hint(fn, ckpt, log, g, p, params, got):
    """What a wrong state at p points at: another position's state, the checkpoint's decay,
    the writes' decays, or Δ used raw."""
    n, j = log["x"].shape[0], p - g
    for q in range(g, g + n + 1):
        if q != p and _close(got, _fold64(ckpt, log, q - g, params)):
            if q == g + n and n > j:
                what = "the whole logged block"
            elif abs(q - p) == 1:
                what = "one entry too many" if q > p else "one entry too few"
            else:
                what = f"{q - g} entries"
            return (
                f"your state is the state at position {q}, not {p} ({what}): the state at p is "
                f"fold(S_g, log[:p - g]) with p - g = {j} entries (entry i of the log is token "
                "g + i; p = g folds none)"
            )
    H, G = log["x"].shape[1], log["B"].shape[1]
    mistakes = (  # (the mistake's state, what it points at), tried in turn
        (
            dict(raw_dt=True),
            "you used the logged dt as the step: the log holds the raw dt, and the layer's "
            "step is Δ = clamp(softplus(dt + dt_bias), *dt_limit)",
        ),
        (
            dict(bias=False),
            "Δ lacks the bias: the log holds the raw dt, and the layer's step is "
            "Δ = clamp(softplus(dt + dt_bias), *dt_limit), with params.dt_bias (one per head)",
        ),
        (
            dict(clamp=False),
            f"Δ is not clamped (at both ends): the layer's step is Δ = clamp(softplus(dt + dt_bias), "
            f"*dt_limit), dt_limit = {tuple(params.dt_limit)}",
        ),
        (
            dict(groups="tiled"),
            f"B (or C) reaches the wrong heads: the H={H} heads fall into G={G} groups of "
            f"{H // max(G, 1)} contiguous heads, head h reading group h // (H / G) "
            "(B.repeat_interleave(H // G, dim=0) on (G, N)); repeat would tile them (head h "
            "reading group h % G)",
        ),
    )
    for kw, hint in mistakes:
        if (kw.get("groups") != "tiled" or 1 < G < H) and _close(
            got, _fold64(ckpt, log, j, params, **kw)
        ):
            return hint
    zero_x = dict(_clone_log(log), x=torch.zeros_like(log["x"]))
    own_ckpt = fn(ckpt.clone(), zero_x, g, p, params)  # the checkpoint's term alone
    own_writes = fn(torch.zeros_like(ckpt), _clone_log(log), g, p, params)  # the writes alone
    ckpt_ok = own_ckpt is not None and _close(own_ckpt, _fold64(ckpt, zero_x, j, params))
    writes_ok = own_writes is not None and _close(
        own_writes, _fold64(torch.zeros_like(ckpt), log, j, params)
    )
    writes = (
        "token s's write Δ_s x_s B_s^T decays by the tokens after it up to p, prod over "
        "s < u < p of a_u = exp(cs_(p-1) - cs_s) with cs the cumulative sum of Δ A from the "
        "checkpoint (the last folded token's write is not decayed at all), not by a cumulative "
        "decay from the block's start (exp(cs_s)); Δ = clamp(softplus(dt + dt_bias), *dt_limit)"
    )
    if writes_ok and not ckpt_ok and j == 0:
        return "at p = g nothing is folded: the state at p is the checkpoint S_g itself"
    if writes_ok and not ckpt_ok:
        return (
            "the writes are right but the checkpoint's term is wrong: S_g decays by the decays "
            f"of exactly the {j} folded tokens, exp(A * sum of their Δ); a cumulative decay taken "
            "from another origin or over another range (vLLM #23279: from the start of the "
            "kernel's chunk instead of the sequence's) gives this"
        )
    if not writes_ok and not bool(ckpt.abs().max() > 0):
        return f"the checkpoint is zero at g={g}, so the state is the writes alone: they are wrong: {writes}"
    if ckpt_ok and not writes_ok:
        return f"the checkpoint's term is right but the writes are wrong: {writes}"
    return (
        "both terms are wrong: per token s = g, ..., p - 1: S <- a_s S + Δ_s x_s B_s^T, with "
        "a_s = exp(Δ_s A) per head and B expanded from its G groups to the H heads "
        "(repeat_interleave: contiguous heads share a group)"
    )


def _state_mismatch(fn, ckpt, log, g, p, params, got, where):
    """None if ``got`` is the state at p, else the FAIL message."""
    if not isinstance(got, torch.Tensor) or tuple(got.shape) != tuple(ckpt.shape):
        shape = tuple(got.shape) if isinstance(got, torch.Tensor) else type(got).__name__
        return f"on {where}: expected a tensor of shape {tuple(ckpt.shape)} (H, P, N), got {shape}"
    if got.dtype != torch.float64:
        return f"on {where}: compute in float64, as the inputs are (got {got.dtype})"
    want = _fold64(ckpt, log, p - g, params)
    if torch.isfinite(got).all() and _close(got, want):
        return None
    if not torch.isfinite(got).all():
        err = "values not finite"
    elif float(want.abs().max()) == 0:
        err = f"values up to {float(got.abs().max()):.1e} where the state is zero"
    else:
        err = f"relative error {_relative(got, want):.1e}"
    try:
        hint = _fold_hint(fn, ckpt, log, g, p, params, got)
    except Exception:  # the learner's function failed on the probes: no finer diagnosis
        hint = "per token s = g, ..., p - 1: S <- a_s S + Δ_s x_s B_s^T"
    return f"on {where}: {err}: {hint}"


GROUPED_MODEL = dict(ssm_heads=4, n_groups=2)  # the check's second model: G < H
# the second model clamps Δ both ways, at these quantiles of its own Δ on a random prompt: the
# notebook's model clamps at (0.001, inf), which no Δ reaches, so only here a fold without the
# clamp is wrong
CLAMP_QUANTILES = (0.25, 0.75)


def grouped_model(model, seed=3):
    """``model``'s configuration with fewer groups of B and C than heads (``GROUPED_MODEL``), so
    that a wrong head-to-group mapping shows; random weights; each Mamba-2 layer's Δ clamped
    both ways (``dt_limit`` at the ``CLAMP_QUANTILES`` of its Δ on a random 32-token prompt,
    rounded to 0.01), so that a fold that leaves out the clamp (either end) shows."""
    from dataclasses import replace

    from replaylab.model import HybridLM

    grouped = HybridLM(replace(model.cfg, **GROUPED_MODEL), seed=seed).eval()
    g = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, grouped.cfg.vocab_size, (32,), generator=g).tolist()
    prefix = _prefix_of_tokens(grouped, tokens, 8)
    for layer, spec in grouped.cache_spec().recurrent.items():
        p = _params64(grouped, layer)
        dt = torch.cat([log["dt"] for _, _, log in _blocks(prefix, layer)])
        delta = torch.nn.functional.softplus(dt + p.dt_bias)
        lo, hi = (round(float(delta.quantile(q)), 2) for q in CLAMP_QUANTILES)
        unclamped = spec.mixer.params
        spec.mixer.params = lambda base=unclamped, limit=(lo, hi): base()._replace(dt_limit=limit)
    return grouped


def _state_cases(fn, model, block_sizes, rng, g_, label):
    """Run ``fn`` on every block of one random prompt per block size through ``model``:
    (the FAIL message or None, positions checked, worst relative error against a prefill)."""
    recurrent = list(model.cache_spec().recurrent)
    n_cases, worst_prefill = 0, 0.0
    for b in block_sizes:
        tokens = torch.randint(0, model.cfg.vocab_size, (rng.randint(3 * b, 5 * b),), generator=g_)
        tokens = tokens.tolist()
        prefix = _prefix_of_tokens(model, tokens, b)
        blocks = {layer: _blocks(prefix, layer) for layer in recurrent}
        for k, (g, _, log0) in enumerate(blocks[recurrent[0]]):
            n = log0["x"].shape[0]
            for p in sorted({g, g + 1, g + n, rng.randint(g, g + n)}):
                prefill = _prefill_states(model, tokens, p)
                for layer in recurrent:
                    _, ckpt, log = blocks[layer][k]
                    params = _params64(model, layer)
                    H, G = log["x"].shape[1], log["B"].shape[1]
                    where = (
                        f"{label} (H={H} heads, G={G} groups), layer {layer}, block_size={b}, "
                        f"g={g}, p={p} (a log of {n} entries)"
                    )
                    given_ckpt = ckpt.clone()
                    try:
                        got = fn(given_ckpt, _clone_log(log), g, p, params)
                    except NotImplementedError:
                        raise
                    except Exception as err:  # the learner's code raised on this case
                        return f"on {where}: {describe_exception(err)}", n_cases, worst_prefill
                    if got is None:
                        return "not done yet (the function returned None)", n_cases, worst_prefill
                    if not torch.equal(given_ckpt, ckpt):
                        return (
                            f"on {where}: your function changed the checkpoint; the tree's "
                            "state is shared by every request that resumes from it (copy it)",
                            n_cases,
                            worst_prefill,
                        )
                    if isinstance(got, torch.Tensor) and got.data_ptr() == given_ckpt.data_ptr():
                        return (
                            f"on {where}: you returned the checkpoint itself; the caller decodes "
                            "from the state you return, in place, and the tree's checkpoint is "
                            "shared by every request that resumes from it (return a copy)",
                            n_cases,
                            worst_prefill,
                        )
                    wrong = _state_mismatch(fn, ckpt, log, g, p, params, got, where)
                    if wrong:
                        return wrong, n_cases, worst_prefill
                    worst_prefill = max(worst_prefill, _relative(got, prefill[layer]))
                    n_cases += 1
    return None, n_cases, worst_prefill


@guarded("state at p from checkpoint + log")
def check_state_at(fn, model, prompts=3, seed=0) -> bool:
    """Exercise (notebook 14): ``fn(checkpoint, log, g, p, params) -> (H, P, N)``, the state
    after p tokens from the grid checkpoint S_g (float64 (H, P, N)) and the block's log
    ({"x", "dt", "B", "C"}, entry i = token g + i), folding its first p - g entries. Compared
    with ``ssd_scan`` in float64 and with a one-shot prefill's state at p, for ``prompts``
    random prompts at block sizes 4, 8 and 16 in turn (every block; p = g, g + 1, the block's
    end and a random p inside), in every recurrent layer of ``model``; then one prompt at
    block size 8 through ``grouped_model(model)``, whose heads share groups (G < H) and whose Δ is
    clamped both ways."""
    name = "state at p from checkpoint + log"
    rng = random.Random(seed)
    g_ = torch.Generator().manual_seed(seed)
    runs = (
        (model, [(4, 8, 16)[i % 3] for i in range(prompts)], "the notebook's model"),
        (grouped_model(model), [8], "the grouped model"),
    )
    n_cases, worst_prefill = 0, 0.0
    for m, block_sizes, label in runs:
        wrong, n, worst = _state_cases(fn, m, block_sizes, rng, g_, label)
        if wrong:
            return report(name, False, wrong)
        n_cases, worst_prefill = n_cases + n, max(worst_prefill, worst)
    if worst_prefill > 1e-5:
        return report(
            name,
            False,
            f"your folds equal ssd_scan in float64 but differ from a one-shot prefill by "
            f"a relative {worst_prefill:.1e}; report this (the library's log and states disagree)",
        )
    return report(
        name,
        True,
        f"{n_cases} positions (on the grid, at block ends, inside blocks; G = H and G < H) "
        f"equal ssd_scan in float64 and a one-shot prefill's state (fp32, to a relative "
        f"{worst_prefill:.0e})",
    )


# --------------------------------------------------------------------------------------------
# Questions with computed answers

RESUME_SCENARIO = dict(block_size=64, first=240, shared=213, T=250, checkpoint_interval=128)


def resume_points(model, block_size, first, shared, T, checkpoint_interval, seed=0) -> dict:
    """Serve a request of ``first`` tokens, then one of ``T`` that shares its first ``shared``
    tokens, under each strategy (recompute with ``checkpoint_interval``); returns {strategy:
    (resumed_from, computed)} of the second request's hit report."""
    g = torch.Generator().manual_seed(seed)
    vocab = model.cfg.vocab_size
    a = torch.randint(0, vocab, (first,), generator=g)
    b = torch.cat([a[:shared], torch.randint(0, vocab, (T - shared,), generator=g)])
    b[shared] = (a[shared] + 1) % vocab  # the two differ from token `shared` on
    out = {}
    for strategy in ("replay", "snapshot", "recompute"):
        kw = dict(checkpoint_interval=checkpoint_interval) if strategy == "recompute" else {}
        prefix = PrefixCache(model, strategy, block_size=block_size, max_len=max(first, T), **kw)
        prefix.serve(a)
        hit = prefix.serve(b).hit
        out[strategy] = (hit.resumed_from, hit.computed)
    return out


@guarded("where each strategy resumes")
def check_resume_points(answer, model) -> bool:
    """Question (notebook 14): in ``RESUME_SCENARIO``, {strategy: (resumed_from, computed)}
    for the second request, computed by serving it (``resume_points``)."""
    name = "where each strategy resumes"
    if answer is None or answer is Ellipsis:
        return report(name, False, "no answer yet (replace None with your answer)")
    want = resume_points(model, **RESUME_SCENARIO)
    s = RESUME_SCENARIO
    why = {
        "replay": "replay resumes at the match itself (the grid state below it plus a fold of "
        "the log entries after it); it computes the tokens after the match",
        "snapshot": f"snapshot (align) resumes at the last grid position <= the match, a "
        f"multiple of block_size={s['block_size']}, and prefills everything after it",
        "recompute": f"recompute restores its last checkpoint <= the match (a multiple of "
        f"checkpoint_interval={s['checkpoint_interval']}), re-runs the model to the match and "
        "prefills the rest: computed = recomputed + prefilled",
    }
    for strategy, (r, c) in want.items():
        try:
            got = tuple(whole_number(v) for v in answer[strategy])
        except (KeyError, TypeError) as err:  # not a {strategy: pair} dict
            return report(
                name,
                False,
                f"expected {{strategy: (resumed_from, computed)}}: {type(err).__name__} "
                f"at {strategy!r}",
            )
        if None in got:
            return report(
                name, False, f"{strategy}: expected token counts, got {answer[strategy]!r}"
            )
        if got != (r, c):
            return report(
                name, False, f"{strategy}: (resumed_from, computed) is not {got}: {why[strategy]}"
            )
    return report(name, True, f"{want}")


ALIGN_BLOCKS = (16, 32, 64, 128, 256, 512)


def serve_stream(model, strategy, stream, block_size, budget_bytes=None, **kw):
    """Serve the prompts of ``stream`` (lists of ids) in order through one fresh
    ``PrefixCache``; returns (their ``PrefixHit`` s, the cache). ``max_len`` is the longest
    prompt (at least ``block_size``); ``kw`` goes to ``PrefixCache``."""
    max_len = max(max(len(t) for t in stream), block_size)
    prefix = PrefixCache(
        model, strategy, block_size=block_size, max_len=max_len, budget_bytes=budget_bytes, **kw
    )
    return [prefix.serve(t).hit for t in stream], prefix


def token_hit_rate(hits) -> float:
    """Tokens whose computation the tree saved over all prompt tokens: sum of resumed_from over
    sum of prompt lengths (recompute's re-run tokens count as computed)."""
    return sum(h.resumed_from for h in hits) / sum(h.prompt_length for h in hits)


@guarded("smallest block where align saves nothing")
def check_align_zero_block(answer, model, workload="shared_system") -> bool:
    """Question (notebook 14): of ``ALIGN_BLOCKS``, the smallest block size at which align
    (snapshot) saves no prefill token on ``workload`` (``bench.prefix.workload``, seed 0),
    computed by serving the stream at each block size."""
    from replaylab.bench.prefix import workload as make_workload

    name = "smallest block where align saves nothing"
    if answer is None or answer is Ellipsis:
        return report(name, False, "no answer yet (replace None with your answer)")
    if answer not in ALIGN_BLOCKS:
        return report(name, False, f"{answer!r}: expected one of ALIGN_BLOCKS = {ALIGN_BLOCKS}")
    stream = make_workload(workload)
    rate = {}
    for b in ALIGN_BLOCKS:
        rate[b] = token_hit_rate(serve_stream(model, "snapshot", stream, b)[0])
        if rate[b] == 0:
            break
    want = next((b for b, r in rate.items() if r == 0), None)
    if answer == want:
        return report(name, True, f"{answer!r}")
    if answer in rate and rate[answer] > 0:
        hint = (
            f"at block size {answer} align still saves tokens (token hit rate "
            f"{rate[answer]:.3f}): some request's match reaches a grid position past 0. Compare "
            "how far the matches in section 4's reports reach with the block size (align's "
            "first grid position past 0)"
        )
    else:
        hint = (
            f"align saves nothing at block size {answer}, but it already saves nothing at a "
            "smaller one of ALIGN_BLOCKS: the question asks for the smallest"
        )
    return report(name, False, f"{answer!r} - {hint}")


@guarded("align's extra tokens per hit off the grid")
def check_offgrid_extra_tokens(answer, path=OFFGRID_TTFT) -> bool:
    """Question (notebook 14): in the off-grid TTFT run (``path``), how many more prompt tokens
    align (snapshot) computed than replay, per request, with the hit; from the run's computed
    tokens over its batch."""
    from replaylab.results import load_bench

    name = "align's extra tokens per hit off the grid"
    if answer is None or answer is Ellipsis:
        return report(name, False, "no answer yet (replace None with your answer)")
    run = load_bench(path)
    s = run["strategies"]
    extra, batch = (
        s["snapshot"]["prefix_computed_tokens"] - s["replay"]["prefix_computed_tokens"],
        run["batch"],
    )
    want = extra / batch
    if answer == want:
        return report(name, True, f"{answer!r}: align resumes at the grid point below the match")
    if answer == extra:
        hint = (
            f"that is the whole run's difference; the question asks per request ({batch} requests)"
        )
    elif answer == run["block_size"]:
        hint = "align goes back to the grid point below the match, not a whole block"
    else:
        hint = ("align resumes at the largest multiple of the block size at or below the match; "
                "replay at the match itself")  # fmt: skip
    return report(name, False, f"{answer!r} - {hint}")


@guarded("replay's extra tokens per hit under resume='chunk'")
def check_chunk_resume_extra_tokens(answer, path=CHUNK_RESUME_TTFT) -> bool:
    """Question (notebook 14): in the chunk-resume run (``path``), how many more prompt tokens
    replay computed per request with ``resume="chunk"`` than with ``resume="match"``; from the
    run's computed tokens over its batch."""
    from replaylab.results import load_bench

    name = "replay's extra tokens per hit under resume='chunk'"
    if answer is None or answer is Ellipsis:
        return report(name, False, "no answer yet (replace None with your answer)")
    run = load_bench(path)
    s = run["strategies"]
    extra = s["replay:chunk"]["prefix_computed_tokens"] - s["replay"]["prefix_computed_tokens"]
    want = extra / run["batch"]
    if answer == want:
        return report(name, True, f"{answer!r}: the match less the chunk grid point below it")
    S, b, C = run["shared_tokens"], run["block_size"], run["prefill_chunk"]
    if answer == extra:
        hint = (f"that is over all the run's requests; per request, divide by its "
                f"{run['batch']} requests")  # fmt: skip
    elif answer == S - S // b * b:
        hint = "that is align's extra: the chunk grid (multiples of the prefill chunk) is finer"
    elif answer == S // C * C - S // b * b:
        hint = ("those entries are scanned from the block's held inputs, not computed as prompt "
                "tokens")  # fmt: skip
    else:
        hint = "resume='chunk' resumes at the largest multiple of the prefill chunk <= the match"
    return report(name, False, f"{answer!r} - {hint}")


def _bound(probe, objective) -> str:
    """Which bound of ``objective`` a failed rate probe broke: "tpot", "wait" or "both"."""
    tpot = probe["tpot_p99_s"] > objective["tpot_p99_max_s"]
    wait = probe["wait_p90_s"] > objective["wait_p90_max_s"]
    return "both" if tpot and wait else "tpot" if tpot else "wait"


@guarded("what stops each strategy's rate")
def check_stream_bound(answer, paths=WORKLOAD_STREAM_RESULTS) -> bool:
    """Question (notebook 14): ``{"snapshot": bound, "replay_other": workload}``: the bound of
    the objective ("tpot" or "wait") that stopped snapshot's rate search of plain decode on
    every GPU request stream (its failed probe just above its sustainable rate), and the one
    workload on which replay's search was stopped by the other bound."""
    from replaylab.bench.workload_stream import stopping_probe
    from replaylab.results import load_bench

    name = "what stops each strategy's rate"
    if answer is None or answer is Ellipsis:
        return report(name, False, "no answer yet (replace None with your answer)")
    shape = (
        "expected a dict {'snapshot': 'tpot' or 'wait', 'replay_other': a workload's name, "
        f"one of {sorted(paths)}}}"
    )
    if not isinstance(answer, dict):
        try:
            set(answer)  # an answer that raises when read is reported as raised (``guarded``)
        except TypeError:
            pass
        return report(name, False, f"{answer!r} - {shape}")
    if set(answer) != {"snapshot", "replay_other"}:
        keys = set(answer) ^ {"snapshot", "replay_other"}
        return report(
            name, False, f"{answer!r} - {shape}; keys missing or extra: {sorted(map(str, keys))}"
        )
    bound, other = answer["snapshot"], answer["replay_other"]
    bound = bound.strip().lower() if isinstance(bound, str) else bound
    if bound not in ("tpot", "wait"):
        return report(name, False, f"{answer!r} - a bound is 'tpot' or 'wait'; got {bound!r}")
    if not isinstance(other, str):
        return report(
            name,
            False,
            f"{answer!r} - replay_other: a workload's name as a string, one of {sorted(paths)}",
        )
    other = "_".join(other.strip().lower().replace("-", " ").split())
    if other not in paths:
        return report(name, False, f"{answer!r} - replay_other: one of {sorted(paths)}")
    bounds = {"replay": {}, "snapshot": {}}
    for w, path in paths.items():
        run = load_bench(path)["workloads"][w]
        for r in run["rates"]:
            stop = stopping_probe(r) if r["mode"] == "decode" else None
            if stop is not None and r["strategy"] in bounds:  # None: no probe failed
                bounds[r["strategy"]][w] = _bound(stop, run["objective"])
    snapshot = set(bounds["snapshot"].values())
    odd = [w for w, b in bounds["replay"].items() if b not in snapshot]
    if len(snapshot) != 1 or len(odd) != 1:
        raise RuntimeError(f"the runs no longer fit the question: {bounds}")
    if bound not in snapshot:
        return report(name, False, f"{answer!r} - not snapshot's bound: compare its failed "
                      "probe's TPOT and wait with the objective's two bounds, workload by "
                      "workload")  # fmt: skip
    if other != odd[0]:
        return report(name, False, f"{answer!r} - snapshot's bound is right; on {other!r} "
                      "replay's failed probe broke that same bound: find the workload where it "
                      "broke the other one")  # fmt: skip
    return report(name, True, f"{answer!r}: the budget admits only a few snapshot requests at "
                  "once, so arrivals queue for admission and the wait breaks first; replay's "
                  "smaller requests run more at once and reach a higher rate before its queue "
                  "breaks the wait too, except where its slowed decode steps broke the TPOT "
                  "bound first")  # fmt: skip
