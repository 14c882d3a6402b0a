"""A prefix cache for the hybrid teaching cache: a radix tree over token ids whose nodes hold, on
a block grid of ``block_size`` tokens, what a later request needs to resume from there.

    prefix = PrefixCache(model, "replay", block_size=16, budget_bytes=2**20, max_len=512)
    served = prefix.serve(prompt)        # prompt: (T,) token ids
    served.cache                         # a HybridCache positioned after the prompt
    served.logits                        # (vocab,) logits of the prompt's last token
    served.hit                           # PrefixHit: what was reused and why not more

Glossary (code name -> meaning):
    block_size  b      the grid: node i of a path holds tokens [i*b, (i+1)*b) (the last may be
                       shorter); KV rows are held for every token, recurrent state only on it
    grid position g    a multiple of b
    end_state          per recurrent layer, the ``LayerState`` (ssm, conv) after the node's last
                       token, kept when the node is a full block (recompute: only where
                       g % checkpoint_interval == 0)
    log                replay only: per recurrent layer the logged scan inputs of the node's
                       tokens (the fields ``RecurrentSpec.log_fields`` names), so the state at
                       g + j is fold(end_state of the parent, log[:j]) for any 0 <= j <= b
    matched m          tokens of the prompt the tree holds (a prefix)
    resumed r          the position the served cache starts computing from: replay r = m;
                       snapshot ("align", vLLM's mamba_cache_mode=align) r = the last grid
                       position <= m; recompute the last checkpoint <= m, then the model re-runs
                       [r, m) ("recomputed") before prefilling [m, T)

What each strategy holds per full node: KV rows (2 * kv_heads * b * head_dim per attention
layer) + end_state (state + conv window per recurrent layer) + replay's log (b entries per
recurrent layer). One byte budget covers all of it. Eviction drops whole leaves, so every node
left has its ancestors and its state can be rebuilt; under replay the logs of blocks that later
blocks extend go first (those blocks then serve align-style hits). After them, by policy:
"lru-fit" (the default) drops the logs of full leaves (each keeps its end state), then a leaf
that cannot fit beside its ancestors, then tails (shorter than a block: no end state, they go
whole), then full leaves, each group least recently used first, so replay never hits less than
align and a budget of one block without its log is served; "lru" drops the least recently used
leaf, log and all; "cost" the leaf saving fewest prefill tokens per byte; "logs-first" every
log before any leaf (the tree then degrades to align's). The served cache holds copies:
decoding, speculation and rollback on it never touch the tree (copy on write).

The tree itself (nodes, matching, the resume plan, the hit report, insertion, the budget and
eviction, ``check_rebuildable``) is ``PrefixTree``, which the serving engine's prefix cache
(``replaylab.serving.prefix.EnginePrefixCache``) shares; ``PrefixCache`` adds what is the
teaching cache's: the probe of a block's bytes, seating a fresh cache, the prefill.

The cache API has no "load this state at position p"; ``_seat`` writes a fresh cache's stores
through their attributes (``ReplayStore.checkpoint/log/n/start``, ``CurrentStateStore.current``)
and fills KV with ``LayerKV.append``.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field

import torch

from replaylab.cache import HybridCache
from replaylab.validation import as_int, check_hybrid_model

__all__ = [
    "PrefixCache",
    "PrefixTree",
    "PrefixHit",
    "Served",
    "PREFIX_STRATEGIES",
    "PREFIX_EVICTION",
    "DEFAULT_EVICTION",
]

PREFIX_STRATEGIES = ("replay", "snapshot", "recompute")
PREFIX_EVICTION = ("lru", "cost", "logs-first", "lru-fit")
# replay never hits less than align under it (data/PREFIX.md), and a budget of one block
# without its log is served
DEFAULT_EVICTION = "lru-fit"
STOP_REASONS = ("end of prompt", "unique tokens", "evicted")


@dataclass(frozen=True)
class PrefixHit:
    """One request's hit report.

    prompt_length   T
    matched         m: tokens of the prompt held by the tree
    resumed_from    r: position the served cache started from (state restored there)
    folded          replay: logged entries folded into the grid checkpoint (at most b; the
                    engine's prefix cache under ``resume="chunk"``: scanned)
    recomputed      recompute: tokens [r, m) re-run through the model
    prefilled       tokens [max(r, m), T) computed because the tree did not hold them
                    (snapshot: [r, T), the matched tokens after the grid point included)
    match_stop      why the match stopped at m: "end of prompt" (the last token is always
                    computed, for its logits), "unique tokens" (no earlier request held the
                    next token), "evicted" (one did, and its node was evicted)
    limited_by      why reuse ended at r: "not on the grid" when r < m (snapshot, recompute),
                    else ``match_stop``
    """

    prompt_length: int
    matched: int
    resumed_from: int
    folded: int
    recomputed: int
    prefilled: int
    match_stop: str
    limited_by: str

    @property
    def computed(self) -> int:
        """Tokens run through the model for this request."""
        return self.recomputed + self.prefilled


@dataclass
class Served:
    cache: HybridCache
    logits: torch.Tensor  # (vocab,) after the prompt's last token
    hit: PrefixHit


@dataclass(eq=False)
class _Node:
    start: int  # grid position of the node's first token
    tokens: tuple  # up to block_size ids
    parent: _Node | None
    kv: dict = field(default_factory=dict)  # layer -> (k, v) each (1, kv_heads, len, head_dim)
    end_state: dict | None = None  # layer -> LayerState (1, ...) after the last token
    log: dict | None = None  # replay: layer -> {field: (1, len, ...)}
    children: list = field(default_factory=list)
    nbytes: int = 0
    last_used: int = 0

    @property
    def end(self) -> int:
        return self.start + len(self.tokens)


def _tensor_bytes(t) -> int:
    return t.numel() * t.element_size()


def _node_bytes(node) -> int:
    total = sum(_tensor_bytes(k) + _tensor_bytes(v) for k, v in node.kv.values())
    total += sum(s.nbytes() for s in (node.end_state or {}).values())
    total += sum(_tensor_bytes(t) for fields in (node.log or {}).values() for t in fields.values())
    return total


def _common(a, b) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


@dataclass(frozen=True)
class _Plan:
    """Where a request resumes: ``path``, ``matched`` m and ``stop`` from the match, ``usable``
    = min(m, T - 1) (the last token is always computed, for its logits), ``r`` the grid
    position whose state is restored, ``j`` (replay) the logged entries of the block at r
    applied after it, ``log_gone`` (replay) that block's log was evicted, so the request
    resumes on the grid."""

    path: list
    matched: int
    stop: str
    usable: int
    r: int
    j: int
    log_gone: bool

    @property
    def resumed(self) -> int:
        return self.r + self.j


class PrefixTree:
    """The radix tree both prefix caches share: the teaching cache's ``PrefixCache`` and the
    serving engine's ``serving.prefix.EnginePrefixCache``. It holds ``_Node`` s on a grid of
    ``block_size`` tokens and does the matching (``_match``), the resume plan (``_plan``), the
    hit report (``_hit``), insertion (``_insert``, nodes from the subclass's maker), the byte
    budget and eviction (``set_budget``, ``_evict_to_budget``) and the checks
    (``check_rebuildable``). A subclass sets ``strategy``, ``eviction``, ``max_len``,
    ``block_size``, ``interval`` (the grid of held states: block_size, or recompute's
    checkpoint interval), ``vocab_size`` and ``block_bytes`` (one full node; replay also
    ``block_log_bytes``, its log's share), then calls ``_init_tree(budget_bytes)``."""

    block_log_bytes = 0  # replay: the bytes of one full block's log (the rest is KV + state)

    def _init_tree(self, budget_bytes):
        self.root = _Node(0, (), None)
        self.resume_step = getattr(self, "resume_step", 1)  # replay resumes on multiples of it
        self.held_bytes = 0
        self.evicted_prefixes: list[tuple] = []  # token prefixes of evicted nodes (newest last)
        self._clock = itertools.count(1)
        self.budget_bytes = None
        self.set_budget(budget_bytes)

    @property
    def max_prompt(self) -> int:
        """The longest prompt served (``max_len`` tokens)."""
        return self.max_len

    def _length_error(self, n) -> str:
        return f"prompt: expected 1..max_len={self.max_len} tokens, got {n}"

    @property
    def floor_bytes(self) -> int:
        """The least bytes one full block can be held in: ``block_bytes``, or under
        ``eviction="logs-first"`` or ``"lru-fit"`` a replay block without its log."""
        logless = self.eviction in ("logs-first", "lru-fit")
        return self.block_bytes - (self.block_log_bytes if logless else 0)

    # --- validation ---------------------------------------------------------------------
    def set_budget(self, budget_bytes):
        """Set (None: lift) the byte budget; evicts at once if over it. A budget under one full
        block (``floor_bytes``) is refused and changes nothing."""
        if budget_bytes is not None:
            budget = as_int("budget_bytes", budget_bytes, low=1)
            if budget < self.floor_bytes:
                held = " without its log" if self.floor_bytes < self.block_bytes else ""
                raise ValueError(
                    f"budget_bytes: expected at least one {self.strategy} block of "
                    f"{self.block_size} tokens{held} ({self.floor_bytes} bytes), got {budget}"
                )
            budget_bytes = budget
        self.budget_bytes = budget_bytes
        self._evict_to_budget()

    def _check_prompt(self, prompt) -> list:
        """``prompt``: ids (T,) or (1, T) as a tensor of any integer dtype or a list of ints
        (numpy integers too) -> a list of ints, checked."""
        if isinstance(prompt, torch.Tensor):
            if prompt.dim() == 2 and prompt.shape[0] == 1:
                prompt = prompt[0]
            if (
                prompt.dim() != 1
                or prompt.dtype.is_floating_point
                or prompt.dtype.is_complex
                or prompt.dtype == torch.bool
            ):
                raise TypeError(
                    f"prompt: expected integer token ids of shape (T,) or (1, T), got "
                    f"{prompt.dtype} of shape {tuple(prompt.shape)}"
                )
            prompt = prompt.tolist()
        elif not isinstance(prompt, (list, tuple, range)):
            shown = repr(prompt) if len(repr(prompt)) <= 60 else repr(prompt)[:57] + "..."
            raise TypeError(
                f"prompt: expected token ids (T,) or (1, T): an integer tensor or a list of "
                f"ints, got {type(prompt).__name__} {shown}"
            )
        if all(type(t) is int for t in prompt):  # the common case, without a call per id
            tokens = list(prompt)
        else:
            tokens = [as_int(f"prompt[{i}]", t) for i, t in enumerate(prompt)]
        if not 1 <= len(tokens) <= self.max_prompt:
            raise ValueError(self._length_error(len(tokens)))
        if min(tokens) < 0 or max(tokens) >= self.vocab_size:
            bad = next(t for t in tokens if not 0 <= t < self.vocab_size)
            raise ValueError(f"prompt: token ids must lie in [0, {self.vocab_size}), got {bad}")
        return tokens

    # --- the tree --------------------------------------------------------------------------
    def nodes(self):
        """Every node below the root, parents before children."""
        stack = list(self.root.children)
        while stack:
            node = stack.pop()
            yield node
            stack.extend(node.children)

    def _match(self, tokens):
        """(path, m, stop): ``path[i]`` the node holding block i of the match (the last one
        possibly matched only in part), m the matched length, stop why it ended."""
        node, path, b = self.root, [], self.block_size
        while True:
            pos = node.end
            want = tokens[pos : pos + b]
            best = max(node.children, key=lambda c: _common(c.tokens, want), default=None)
            c = _common(best.tokens, want) if best is not None else 0
            if c == 0:
                break
            path.append(best)
            if c < b or len(best.tokens) < b:
                pos += c
                break
            node = best
        m = path[-1].start + _common(path[-1].tokens, tokens[path[-1].start :]) if path else 0
        if m == len(tokens):
            return path, m, "end of prompt"
        nxt = tuple(tokens[: m + 1])
        evicted = any(p[: m + 1] == nxt for p in self.evicted_prefixes if len(p) > m)
        return path, m, "evicted" if evicted else "unique tokens"

    def lookup(self, tokens):
        """(matched length, why it stopped) for a prompt, without serving it or touching LRU."""
        tokens = self._check_prompt(tokens)
        _, m, stop = self._match(tokens)
        return m, stop

    def _grid_state(self, path, g):
        """The state each recurrent layer had at grid position g of the path (None: zero)."""
        return None if g == 0 else path[g // self.block_size - 1].end_state

    def _plan(self, tokens) -> _Plan:
        """Match ``tokens`` and choose where to resume: replay at min(m, T - 1) rounded down
        to a multiple of ``resume_step`` (the state at the grid point below it and the logged
        entries after it; on the grid if that block's log was evicted), snapshot and recompute
        at the last grid state <= min(m, T - 1)."""
        b = self.block_size
        path, m, stop = self._match(tokens)
        usable = min(m, len(tokens) - 1)  # the last token is always computed, for its logits
        grid = usable // b * b
        log_gone = False
        if self.strategy == "replay":
            r, j = grid, usable // self.resume_step * self.resume_step - grid
            if j and path[grid // b].log is None:  # its log was evicted: resume on the grid
                r, j, log_gone = grid, 0, True
        else:
            r, j = usable // self.interval * self.interval, 0
        return _Plan(path, m, stop, usable, r, j, log_gone)

    def _hit(self, T, plan) -> PrefixHit:
        """The hit report of a request of T tokens served by ``plan``."""
        resumed, usable, m = plan.resumed, plan.usable, plan.matched
        limited = "not on the grid" if resumed < usable else plan.stop
        if plan.log_gone:
            limited = "evicted"
        if resumed == usable and usable < m:
            limited = "end of prompt"
        recompute = self.strategy == "recompute"
        return PrefixHit(
            prompt_length=T,
            matched=m,
            resumed_from=resumed,
            folded=plan.j,
            recomputed=max(0, usable - resumed) if recompute else 0,
            prefilled=T - usable if recompute else T - resumed,
            match_stop=plan.stop,
            limited_by=limited,
        )

    def _insert(self, tokens, make_node):
        """Add the prompt's blocks the tree lacks; ``make_node(seg, g, parent)`` builds the node
        of tokens ``seg`` at grid position g (its tensors copies, never views)."""
        parent, b = self.root, self.block_size
        for g in range(0, len(tokens), b):
            seg = tuple(tokens[g : g + b])
            same = next((c for c in parent.children if c.tokens == seg), None)
            if same is not None:
                same.last_used = next(self._clock)
                parent = same
                continue
            node = make_node(seg, g, parent)
            node.nbytes = _node_bytes(node)
            node.last_used = next(self._clock)
            # a shorter tail node that this block extends is replaced (its children: none)
            for old in list(parent.children):
                if not old.children and seg[: len(old.tokens)] == old.tokens:
                    parent.children.remove(old)
                    self.held_bytes -= old.nbytes
            parent.children.append(node)
            self.held_bytes += node.nbytes
            parent = node

    # --- eviction --------------------------------------------------------------------------
    def fit(self, nbytes) -> int:
        """Evict, in the budget's order, until the tree holds at most ``nbytes`` (>= 0; 0: empty
        it); the budget itself is unchanged. A scheduler whose one budget also holds running
        requests calls it with what they leave. Returns the bytes held."""
        nbytes = as_int("nbytes", nbytes, low=0)
        budget, self.budget_bytes = self.budget_bytes, nbytes
        try:
            self._evict_to_budget()
        finally:
            self.budget_bytes = budget
        return self.held_bytes

    def _prefix_of(self, node) -> tuple:
        parts = []
        while node is not None and node is not self.root:
            parts.append(node.tokens)
            node = node.parent
        return tuple(t for part in reversed(parts) for t in part)

    def _path_bytes(self, node) -> int:
        """Bytes of ``node`` and its ancestors: what a hit through it needs held."""
        total = 0
        while node is not None and node is not self.root:
            total, node = total + node.nbytes, node.parent
        return total

    def _evict_to_budget(self):
        while self.budget_bytes is not None and self.held_bytes > self.budget_bytes:
            # replay: first the logs of blocks that later blocks extend (a hit passes through
            # them on their end states; only a request diverging inside one needs its log);
            # "logs-first": then every leaf's log before any leaf (a full leaf keeps its end
            # state, a tail its KV: align's tree, so replay never hits less than align)
            logged = [n for n in self.nodes() if n.children and n.log is not None]
            if not logged and self.eviction == "logs-first":
                logged = [n for n in self.nodes() if n.log is not None]
            # "lru-fit": then the logs of full leaves (each keeps its end state); a tail, which
            # has no end state to fall back on, goes whole
            if not logged and self.eviction == "lru-fit":
                logged = [n for n in self.nodes() if n.log is not None and n.end_state is not None]
            if logged:
                victim = min(logged, key=lambda n: n.last_used)
                self.held_bytes -= victim.nbytes
                victim.log = None
                victim.nbytes = _node_bytes(victim)
                self.held_bytes += victim.nbytes
                continue
            leaves = [n for n in self.nodes() if not n.children]
            if self.eviction == "lru-fit":  # a leaf that cannot fit beside its ancestors, then
                # tails (no end state to fall back on) before full leaves: align's states stay
                alone = [n for n in leaves if self._path_bytes(n) > self.budget_bytes]
                tails = [n for n in leaves if n.end_state is None]
                leaves = alone or tails or leaves
            if self.eviction in ("lru", "logs-first", "lru-fit"):
                victim = min(leaves, key=lambda n: n.last_used)
            else:  # fewest prefill tokens saved per byte held (a hit here skips [0, end))
                victim = min(leaves, key=lambda n: (n.end / max(n.nbytes, 1), n.last_used))
            victim.parent.children.remove(victim)
            self.held_bytes -= victim.nbytes
            self.evicted_prefixes.append(self._prefix_of(victim))
            del self.evicted_prefixes[:-4096]

    # --- checks ----------------------------------------------------------------------------
    def check_rebuildable(self):
        """Raise AssertionError unless every node can be rebuilt: its parent is in the tree,
        its KV covers its tokens, the grid states the strategy needs are there (and, replay, a
        log entry per token), and the bytes held add up and fit the budget."""
        total, b = 0, self.block_size
        in_tree = {id(self.root)} | {id(n) for n in self.nodes()}
        for node in self.nodes():
            assert id(node.parent) in in_tree and node in node.parent.children
            assert node.start == node.parent.end and node.start % b == 0
            assert 1 <= len(node.tokens) <= b
            assert node.parent is self.root or len(node.parent.tokens) == b
            for k, v in node.kv.values():
                assert k.shape[2] == v.shape[2] == len(node.tokens)
            full = len(node.tokens) == b
            assert (node.end_state is not None) == (full and node.end % self.interval == 0)
            if self.strategy == "replay" and node.log is not None:
                assert all(
                    t.shape[1] == len(node.tokens) for f in node.log.values() for t in f.values()
                )
            assert node.nbytes == _node_bytes(node)
            total += node.nbytes
        assert total == self.held_bytes, (total, self.held_bytes)
        assert self.budget_bytes is None or total <= self.budget_bytes


class PrefixCache(PrefixTree):
    """A radix tree of prefixes of earlier requests for ``model`` (a ``HybridLM``), under
    ``strategy`` ("replay", "snapshot" or "recompute"), on a grid of ``block_size`` tokens.

    budget_bytes          cap on KV + states + logs held by the tree (None: no cap); at least
                          one full block's bytes (``floor_bytes``: under "lru-fit" and
                          "logs-first" a replay block without its log)
    max_len               longest request served
    checkpoint_interval   recompute only: grid states every this many tokens (a multiple of
                          block_size; default block_size)
    eviction              "lru-fit" (default: full leaves' logs, leaves that cannot fit,
                          tails, full leaves), "lru" (whole leaves), "cost" (the leaf saving
                          fewest tokens per byte) or "logs-first" (replay: every log first)
    chunk_size            prefill chunk (chunks also break at every grid position)

    Raises ValueError naming the value and the allowed range for a block size the strategy
    cannot serve, a budget under one block, a request longer than ``max_len``; nothing in the
    tree changes when ``serve`` or ``set_budget`` refuses.
    """

    def __init__(
        self,
        model,
        strategy="replay",
        *,
        block_size=16,
        budget_bytes=None,
        max_len=2048,
        checkpoint_interval=None,
        eviction=DEFAULT_EVICTION,
        chunk_size=None,
    ):
        check_hybrid_model(model)
        if strategy not in PREFIX_STRATEGIES:
            raise ValueError(f"strategy: expected one of {PREFIX_STRATEGIES}, got {strategy!r}")
        if eviction not in PREFIX_EVICTION:
            raise ValueError(f"eviction: expected one of {PREFIX_EVICTION}, got {eviction!r}")
        self.model, self.strategy, self.eviction = model, strategy, eviction
        self.max_len = as_int("max_len", max_len, low=1)
        self.block_size = self._check_block_size(block_size, checkpoint_interval)
        self.interval = (
            self.block_size
            if strategy != "recompute" or checkpoint_interval is None
            else checkpoint_interval
        )
        self.chunk_size = (
            self.max_len if chunk_size is None else as_int("chunk_size", chunk_size, low=1)
        )
        self.vocab_size = model.cfg.vocab_size
        self.block_bytes = self._probe_block_bytes()
        self._init_tree(budget_bytes)

    # --- validation ---------------------------------------------------------------------
    def _check_block_size(self, block_size, checkpoint_interval):
        b = as_int("block_size", block_size, low=1)
        if checkpoint_interval is not None and self.strategy != "recompute":
            raise ValueError(
                f"checkpoint_interval: only the recompute strategy keeps checkpoints between "
                f"blocks; the {self.strategy!r} strategy takes none (leave it None), got "
                f"{checkpoint_interval!r}"
            )
        if self.strategy == "recompute" and checkpoint_interval is not None:
            ci = as_int("checkpoint_interval", checkpoint_interval, low=1)
            can = [d for d in range(1, min(ci, self.max_len) + 1) if ci % d == 0]
            if b not in can:
                raise ValueError(
                    f"block_size: the recompute strategy with checkpoint_interval={ci} serves "
                    f"block sizes that divide it: {can}; got {b}"
                )
        if b > self.max_len:
            raise ValueError(
                f"block_size: the {self.strategy} strategy serves block sizes 1..max_len="
                f"{self.max_len}; got {b}"
            )
        return b

    def _probe_block_bytes(self) -> int:
        """Bytes of one full node (KV + end state + log), measured on a probe block."""
        probe = torch.zeros(self.block_size, dtype=torch.long)
        cache, _, states = self._prefill(probe, self._fresh_cache(), 0, keep_every=self.block_size)
        node = self._make_node(probe.tolist(), 0, None, cache, states, log_start=0)
        if node.end_state is None:  # recompute, block_size < checkpoint_interval: count one
            node.end_state = states[self.block_size]
        fields = (t for f in (node.log or {}).values() for t in f.values())
        self.block_log_bytes = sum(_tensor_bytes(t) for t in fields)
        return _node_bytes(node)

    # --- serving ---------------------------------------------------------------------------
    def _fresh_cache(self):
        # replay: a log long enough never to fold during a prompt, so the entries after the
        # resume checkpoint can be read back for the tree
        return HybridCache(self.model, 1, self.strategy, log_length=self.max_len + 1)

    def _seat(self, cache, tokens, path, r, j):
        """Position a fresh ``cache`` at r + j: KV rows [0, r + j) from the path, the state at
        grid position r, and (replay) the first j log entries of the block starting at r."""
        upto = r + j
        for layer, kv in cache.kv.items():
            parts = [n.kv[layer] for n in path if n.start < upto]
            if parts:
                k = torch.cat([p[0] for p in parts], dim=2)[:, :, :upto]
                v = torch.cat([p[1] for p in parts], dim=2)[:, :, :upto]
                kv.append(k.clone(), v.clone())
        cache.tokens = torch.tensor([tokens[:upto]], dtype=torch.long, device=cache.device)
        state = self._grid_state(path, r)
        store = cache.ssm
        for layer in cache.spec.recurrent:
            if state is not None:
                seated = state[layer].clone()
                if self.strategy == "replay":
                    store.checkpoint[layer] = seated
                else:
                    store.current[layer] = seated
            if self.strategy == "replay" and j:
                entries = path[r // self.block_size].log[layer]
                store.log[layer] = {f: t[:, :j].clone() for f, t in entries.items()}
                store.n[layer] = j
        if self.strategy == "replay":
            store.start = r

    def _prefill(self, tokens, cache, start, keep_every):
        """Run tokens[start:] through ``cache`` in chunks that break at every grid position and
        every ``chunk_size`` tokens. Returns (cache, last logits (vocab,), {position: state})
        with the state at each position > start that is a multiple of ``keep_every``."""
        ids = torch.as_tensor(tokens, dtype=torch.long).reshape(1, -1)
        T, states, logits = ids.shape[1], {}, None
        pos = start
        with torch.no_grad():
            while pos < T:
                step = min(self.chunk_size, self.block_size - pos % self.block_size)
                nxt = min(T, pos + step)
                logits = self.model(ids[:, pos:nxt], cache)[0, -1]
                pos = nxt
                if pos % keep_every == 0:
                    states[pos] = {l: cache.state(l).clone() for l in cache.spec.recurrent}
        return cache, logits, states

    def _make_node(self, seg, g, parent, cache, states, log_start):
        end = g + len(seg)
        node = _Node(g, tuple(seg), parent)
        for layer, kv in cache.kv.items():
            k, v = kv.keys_values()
            node.kv[layer] = (k[:, :, g:end].clone(), v[:, :, g:end].clone())
        if len(seg) == self.block_size and end % self.interval == 0:
            node.end_state = states[end]
        if self.strategy == "replay":
            store = cache.ssm
            node.log = {
                layer: {f: t[:, g - log_start : end - log_start].clone() for f, t in buf.items()}
                for layer, buf in store.log.items()
            }
        return node

    def serve(self, prompt) -> Served:
        """Serve one request: reuse what the tree holds of ``prompt`` (T,), prefill the rest,
        insert the prompt's blocks, evict to the budget. The returned cache is the request's
        own (a copy): decode on it freely."""
        tokens = self._check_prompt(prompt)
        plan = self._plan(tokens)
        cache = self._fresh_cache()
        self._seat(cache, tokens, plan.path, plan.r, plan.j)
        cache, logits, states = self._prefill(tokens, cache, plan.resumed, self.interval)
        hit = self._hit(len(tokens), plan)
        self._insert(
            tokens,
            lambda seg, g, parent: self._make_node(seg, g, parent, cache, states, plan.r),
        )
        self._evict_to_budget()
        return Served(cache, logits, hit)
