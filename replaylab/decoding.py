"""Decoding workloads written only against the cache API: greedy, speculative decoding (draft
model, prompt lookup, or a synthetic drafter with a set acceptance rate), beam search and
best-of-n, tree search. Each takes ``cache``: a strategy name or a ``CacheConfig`` (strategy,
checkpoint interval, log length, kernels, byte budget), and returns a ``DecodeResult`` with the
tokens and the cache's ``CacheStats``.

Glossary: k draft length; a accepted drafts in one round; prompt (batch, T) token ids.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch
from tqdm.auto import tqdm

from replaylab.cache import CacheConfig, CacheStats, as_config
from replaylab.validation import as_int, as_real

__all__ = [
    "DecodeResult",
    "greedy",
    "speculative",
    "beam_search",
    "best_of_n",
    "tree_search",
    "SyntheticDrafter",
    "PromptLookupDrafter",
    "ModelDrafter",
]


@dataclass
class DecodeResult:
    tokens: torch.Tensor  # (batch, n_new) generated ids
    config: CacheConfig  # how the cache kept the recurrent memory
    proposed: int = 0  # drafts proposed (speculative)
    accepted: int = 0  # drafts accepted
    seconds: float = 0.0
    stats: CacheStats = field(default_factory=CacheStats)  # what the cache did and held
    extra: dict = field(default_factory=dict)

    @property
    def strategy(self) -> str:
        return self.config.strategy

    @property
    def acceptance_rate(self):
        return self.accepted / self.proposed if self.proposed else float("nan")

    # the stats a caller reads most, by name
    restores = property(lambda self: self.stats.restores)
    restore_seconds = property(lambda self: self.stats.restore_seconds)  # rollback cost
    recomputed_tokens = property(lambda self: self.stats.recomputed_tokens)
    peak_bytes = property(lambda self: self.stats.peak_bytes)


def _finish(result, cache, t0):
    result.stats = cache.stats
    result.seconds = time.perf_counter() - t0
    return result


def _check_counts(model=None, **counts):
    """Each of ``counts`` an int >= 1 (a bool or float is refused by name); a width of
    candidates per step (``width``, ``branch``) at most the model's vocabulary."""
    vocab = None if model is None else model.cfg.vocab_size
    for name, value in counts.items():
        as_int(name, value, 1, vocab if name in ("width", "branch") else None)


def _check_prompt(prompt):
    if prompt.dim() != 2 or prompt.shape[1] < 1:
        raise ValueError(
            f"prompt: expected token ids of shape (batch, T>=1), got {tuple(prompt.shape)}"
        )


@torch.no_grad()
def greedy(model, prompt, n_new, cache="replay", progress=False) -> DecodeResult:
    """Greedy decoding of ``n_new`` tokens after ``prompt`` (batch, T)."""
    _check_prompt(prompt)
    _check_counts(n_new=n_new)
    config = as_config(cache)
    t0 = time.perf_counter()
    cache = config.build(model, prompt.shape[0])
    logits = model(prompt, cache)
    out = []
    for _ in tqdm(range(n_new), disable=not progress, desc=f"greedy ({config.strategy})"):
        tok = logits[:, -1].argmax(-1, keepdim=True)
        out.append(tok)
        if len(out) < n_new:
            logits = model(tok, cache)
    return _finish(DecodeResult(torch.cat(out, 1), config), cache, t0)


class SyntheticDrafter:
    """Proposes the target's own greedy continuation, each draft right with probability
    ``acceptance`` (a wrong one is the right id + 1): a drafter with a set acceptance rate."""

    def __init__(self, reference, acceptance, seed=0):
        if not isinstance(reference, torch.Tensor) or reference.is_floating_point():
            got = (
                reference.dtype if isinstance(reference, torch.Tensor) else type(reference).__name__
            )
            raise TypeError(f"reference: expected an integer tensor of token ids, got {got}")
        acceptance = as_real("acceptance", acceptance, 0, 1)
        self.reference, self.acceptance = reference.flatten(), acceptance
        self._ids = self.reference.tolist()  # host ints: a proposal is a few list reads
        self.generator = torch.Generator().manual_seed(seed)

    def propose(self, context, k, vocab_size):
        """(k,) drafts after ``context``: the reference's next k ids (0 past its end), each
        replaced by id + 1 with probability 1 - acceptance."""
        pos = context.numel()
        true = self._ids[pos : pos + k]
        true += [0] * (k - len(true))
        right = (torch.rand(k, generator=self.generator) < self.acceptance).tolist()
        drafts = [t if r else (t + 1) % vocab_size for t, r in zip(true, right)]
        return torch.tensor(drafts, dtype=self.reference.dtype, device=self.reference.device)


class PromptLookupDrafter:
    """Proposes the k tokens that followed the latest earlier occurrence of the context's
    last n-gram (n from ``max_ngram`` down to 1); repeats the last token when none is found."""

    def __init__(self, max_ngram=3):
        self.max_ngram = as_int("max_ngram", max_ngram, low=1)

    def propose(self, context, k, vocab_size):
        """(k,) drafts after ``context`` (at least one token); k = 0 gives none."""
        seq = context.flatten().tolist()
        if k < 0:
            raise ValueError(f"k: expected k >= 0 drafts, got {k!r}")
        if not seq:
            raise ValueError("context: expected at least one token to look up, got none")
        if k == 0:
            return torch.zeros(0, dtype=torch.long)
        for n in range(min(self.max_ngram, len(seq) - 1), 0, -1):
            tail = seq[-n:]
            for start in range(len(seq) - n - 1, -1, -1):
                if seq[start : start + n] == tail:
                    follow = seq[start + n : start + n + k]
                    follow += [follow[-1]] * (k - len(follow))
                    return torch.tensor(follow)
        return torch.tensor([seq[-1]] * k)


class ModelDrafter:
    """A smaller hybrid as draft model, decoding greedily with its own cache (``cache``: a
    strategy name or a ``CacheConfig``)."""

    def __init__(self, draft_model, cache="replay"):
        self.model, self.config = draft_model, as_config(cache)
        self.cache, self.handle = None, None

    def propose(self, context, k, vocab_size):
        if k < 0:
            raise ValueError(f"k: expected k >= 0 drafts, got {k!r}")
        if k == 0:  # the engine allows a round without drafts
            return torch.zeros(0, dtype=torch.long)
        if self.model.cfg.vocab_size != vocab_size:
            raise ValueError(
                f"draft model: vocabulary of {self.model.cfg.vocab_size} tokens, "
                f"expected the target's {vocab_size}"
            )
        # the context may live on the host (the serving engine keeps its contexts there)
        context = context.reshape(1, -1).to(self.model.lm_head.weight.device)
        if self.cache is None:
            self.cache = self.config.build(self.model, 1)
        # keep what the draft cache shares with the context, feed the rest
        held = self.cache.tokens[0]
        limit = min(held.numel(), context.shape[1] - 1)
        differ = (held[:limit] != context[0, :limit].to(held.device)).nonzero()
        same = int(differ[0, 0]) if differ.numel() else limit
        if same < self.cache.position:
            self.cache.truncate_to(same)
        if self.handle is not None:
            self.cache.release(self.handle)
        logits = self.model(context[:, same:], self.cache)
        self.handle = self.cache.snapshot()  # the drafts after it may be rolled back next time
        drafts = []
        for i in range(k):
            tok = logits[:, -1].argmax(-1, keepdim=True)
            drafts.append(tok)
            if i < k - 1:
                logits = self.model(tok, self.cache)
        return torch.cat(drafts, 1)[0]


@torch.no_grad()
def speculative(model, prompt, n_new, drafter, k=4, cache="replay", progress=False) -> DecodeResult:
    """Greedy speculative decoding of one sequence: per round, snapshot, verify the pending token
    and k drafts in one forward, keep the agreeing prefix, roll back the rest. Its tokens equal
    ``greedy``'s."""
    _check_prompt(prompt)
    if prompt.shape[0] != 1:
        raise ValueError(
            f"prompt: speculative decoding takes one sequence, got batch {prompt.shape[0]}"
        )
    _check_counts(n_new=n_new, k=k)
    config = as_config(cache)
    t0 = time.perf_counter()
    vocab = model.cfg.vocab_size
    cache = config.build(model, 1)
    pending = model(prompt, cache)[:, -1].argmax(-1, keepdim=True)  # next token, not yet fed
    out, result = [pending], DecodeResult(None, config)
    bar = tqdm(total=n_new, disable=not progress, desc=f"speculative ({config.strategy})")
    while len(out) < n_new:
        context = torch.cat([prompt, torch.cat(out, 1)], 1)
        drafts = drafter.propose(context, k, vocab)
        if not isinstance(drafts, torch.Tensor) or drafts.numel() != k:
            raise ValueError(
                f"drafter: propose(context, k={k}, vocab) must return k token ids, got "
                f"{tuple(drafts.shape) if isinstance(drafts, torch.Tensor) else drafts!r}"
            )
        drafts = drafts.reshape(1, k).to(prompt.device)
        handle = cache.snapshot()
        start = cache.position
        pred = model(torch.cat([pending, drafts], 1), cache)[0].argmax(-1)  # (k+1,)
        agree = (drafts[0] == pred[:k]).long()
        a = int(agree.cumprod(0).sum())
        result.proposed += k
        result.accepted += a
        if a < k:  # keep the pending token and the accepted drafts, drop the rejected ones
            cache.truncate_to(start + 1 + a)
        cache.release(handle)
        new = torch.cat([drafts[:, :a], pred[a].view(1, 1)], 1)
        out.extend(new.split(1, 1))
        bar.update(new.shape[1])
        pending = pred[a].view(1, 1)
    bar.close()
    result.tokens = torch.cat(out, 1)[:, :n_new]
    return _finish(result, cache, t0)


@torch.no_grad()
def beam_search(model, prompt, n_new, width=4, cache="replay") -> DecodeResult:
    """Beam search over summed log-probabilities; returns the best beam (1, n_new)."""
    _check_prompt(prompt)
    if prompt.shape[0] != 1:
        raise ValueError(f"prompt: beam search takes one sequence, got batch {prompt.shape[0]}")
    _check_counts(model, n_new=n_new, width=width)
    config = as_config(cache)
    t0 = time.perf_counter()
    cache = config.build(model, 1)
    logp = torch.log_softmax(model(prompt, cache)[:, -1].float(), -1)
    scores, first = logp[0].topk(width)
    cache.fork(width)
    beams = first.view(width, 1)
    for _ in range(n_new - 1):
        logp = torch.log_softmax(model(beams[:, -1:], cache)[:, -1].float(), -1)
        total = (scores[:, None] + logp).flatten()
        scores, flat = total.topk(width)
        parent, tok = flat // logp.shape[1], flat % logp.shape[1]
        cache.reorder(parent)
        beams = torch.cat([beams[parent], tok[:, None]], 1)
    result = DecodeResult(beams[:1], config, extra={"beams": beams, "scores": scores})
    return _finish(result, cache, t0)


@torch.no_grad()
def best_of_n(model, prompt, n_new, n=8, temperature=1.0, seed=0, cache="replay") -> DecodeResult:
    """Sample n continuations of one prompt (the prompt's state shared by all), return the one
    with the highest mean log-probability."""
    _check_prompt(prompt)
    _check_counts(n_new=n_new, n=n)
    as_real("temperature", temperature, above=0)
    as_int("seed", seed, low=0)
    config = as_config(cache)
    t0 = time.perf_counter()
    g = torch.Generator(device=prompt.device).manual_seed(seed)
    cache = config.build(model, 1)
    logits = model(prompt, cache)[:, -1]
    cache.fork(n)
    logits = logits.expand(n, -1)
    samples, logps = [], torch.zeros(n, device=prompt.device)
    for i in range(n_new):
        probs = torch.softmax(logits.float() / temperature, -1)
        tok = torch.multinomial(probs, 1, generator=g)
        logps += torch.log(probs.gather(1, tok))[:, 0]
        samples.append(tok)
        if i < n_new - 1:
            logits = model(tok, cache)[:, -1]
    samples = torch.cat(samples, 1)
    best = int((logps / n_new).argmax())
    result = DecodeResult(
        samples[best : best + 1], config, extra={"samples": samples, "mean_logp": logps / n_new}
    )
    return _finish(result, cache, t0)


@torch.no_grad()
def tree_search(model, prompt, n_new, branch=3, keep=2, depth=4, cache="replay") -> DecodeResult:
    """Tree exploration: each round, every live branch splits into its ``branch`` most likely
    next tokens, each child continues greedily for ``depth - 1`` more tokens, children are
    scored by summed log-probability and the best ``keep`` continue. Returns the best (1, n_new)."""
    _check_prompt(prompt)
    if prompt.shape[0] != 1:
        raise ValueError(f"prompt: tree search takes one sequence, got batch {prompt.shape[0]}")
    _check_counts(model, n_new=n_new, branch=branch, keep=keep, depth=depth)
    config = as_config(cache)
    t0 = time.perf_counter()
    cache = config.build(model, 1)
    logp = torch.log_softmax(model(prompt, cache)[:, -1].float(), -1)  # (live, V)
    paths, scores = prompt.new_zeros(1, 0), torch.zeros(1, device=prompt.device)
    while paths.shape[1] < n_new:
        live = paths.shape[0]
        top_lp, top_tok = logp.topk(branch, dim=-1)  # (live, branch)
        cache.fork(branch)
        paths = torch.cat([paths.repeat_interleave(branch, 0), top_tok.reshape(-1, 1)], 1)
        scores = scores.repeat_interleave(branch) + top_lp.reshape(-1)
        tok = top_tok.reshape(-1, 1)
        for _ in range(min(depth, n_new - paths.shape[1] + 1) - 1):
            logp = torch.log_softmax(model(tok, cache)[:, -1].float(), -1)
            lp, tok = logp.max(-1, keepdim=True)
            paths, scores = torch.cat([paths, tok], 1), scores + lp[:, 0]
        best = scores.topk(min(keep, live * branch)).indices
        cache.reorder(best)
        paths, scores = paths[best], scores[best]
        if paths.shape[1] < n_new:
            logp = torch.log_softmax(model(paths[:, -1:], cache)[:, -1].float(), -1)
    result = DecodeResult(paths[:1, :n_new], config, extra={"paths": paths, "scores": scores})
    return _finish(result, cache, t0)


@torch.no_grad()
def best_first_search(
    model, prompt, n_new, branch=3, frontier=8, cache="replay", progress=False
) -> DecodeResult:
    """Best-first tree search on one branch of the cache, going back with ``snapshot`` and
    ``restore``: the workload where restores jump *backwards*, to earlier branches.

    A node is a continuation of ``prompt`` (1, T); its score, the summed log-probability of its
    tokens. Repeat: take the best node of the frontier (ties: the earliest pushed). If it has
    ``n_new`` tokens it is the answer. Otherwise expand it: bring the cache to its tokens,
    snapshot there, and push its ``branch`` most likely children; then prune the frontier to
    its ``frontier`` best nodes. Scores only fall along a path, so the first complete node
    taken is the best one of the tree the pruning leaves.

    Going to a node: restore the handle of its deepest ancestor that is still live (the
    branching point: a handle dies when the cache is rolled back past it, so the handles that
    survive are those of the nodes the cache's tokens pass through), then feed the node's
    remaining tokens one at a time, taking a handle at each node on the way.
    ``extra``: ``score``, ``expansions``, ``backward_restores`` (restores to an earlier
    position), ``fed_tokens`` (tokens fed after the prompt, re-fed ones included) and
    ``trace`` (per expansion: the node, the position before, the handle position restored to
    or None, the tokens fed). The tokens fed and the restores asked for are the same under
    every strategy; what each restore costs (``stats``) is the strategy's.
    """
    import heapq

    _check_prompt(prompt)
    if prompt.shape[0] != 1:
        raise ValueError(f"prompt: tree search takes one sequence, got batch {prompt.shape[0]}")
    _check_counts(model, n_new=n_new, branch=branch, frontier=frontier)
    config = as_config(cache)
    t0 = time.perf_counter()
    cache = config.build(model, 1)
    logits = model(prompt, cache)[:, -1]
    handles = {(): cache.snapshot()}  # expanded node -> handle at its position
    heap, pushed = [], 0  # (-score, push order, node)
    extra = dict(expansions=0, backward_restores=0, fed_tokens=0, trace=[])
    node, score = (), 0.0
    bar = tqdm(disable=not progress, desc=f"best-first ({config.strategy})")
    while True:
        logp = torch.log_softmax(logits[0].float(), -1)
        top_lp, top_tok = logp.topk(branch)
        for lp, tok in zip(top_lp.tolist(), top_tok.tolist()):
            heapq.heappush(heap, (-(score + lp), pushed, node + (tok,)))
            pushed += 1
        if len(heap) > frontier:  # prune: keep the best `frontier` nodes
            heap = heapq.nsmallest(frontier, heap)
            heapq.heapify(heap)
        neg, _, node = heapq.heappop(heap)
        score = -neg
        if len(node) == n_new:
            break
        # go to `node`: from the deepest ancestor whose handle is still live, feed the rest
        handles = {n: h for n, h in handles.items() if h.id in cache.live_handles}
        depth = max(i for i in range(len(node)) if node[:i] in handles)
        handle, before = handles[node[:depth]], cache.position
        restored = None
        if handle.position != before:
            cache.restore(handle)
            restored = handle.position
            extra["backward_restores"] += int(handle.position < before)
        for i in range(depth, len(node)):  # one token at a time: a handle at each node
            tok = torch.tensor([[node[i]]], device=prompt.device)
            logits = model(tok, cache)[:, -1]
            handles[node[: i + 1]] = cache.snapshot()
        fed = len(node) - depth
        extra["expansions"] += 1
        extra["fed_tokens"] += fed
        extra["trace"].append(dict(node=node, before=before, restored_to=restored, fed=fed))
        bar.update(1)
    bar.close()
    extra["score"] = score
    result = DecodeResult(torch.tensor([node], device=prompt.device), config, extra=extra)
    return _finish(result, cache, t0)


__all__ += ["best_first_search"]
