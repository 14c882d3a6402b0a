"""What a cache holds and does, call by call: a recorder that reads a real ``HybridCache`` after
each call of a workload, one speculative round run under each strategy, and a figure of it.

    rec = Recorder(cache)                 read the cache now and after every call you make
    model(prompt, cache); rec.record("prefill")
    handle = cache.snapshot(); rec.record("snapshot")
    ...
    rec.steps                             one ``Step`` per recorded call

    speculative_round(model, "replay").steps
                                          prefill, snapshot, verify k drafts, reject after j,
                                          roll back, release, one more decode step: recorded
    timeline_figure({s: speculative_round(model, s).steps for s in STRATEGY_NAMES})

Nothing here changes the cache: the recorder reads ``cache.position``, the KV lengths,
``cache.nbytes()``, ``cache.stats`` and what the store keeps (its snapshot copies, its
checkpoints, its log cursor). Only the figure needs plotly (imported when it is drawn).

Glossary: k drafts verified in one forward (with the pending token: k + 1 tokens); j drafts
accepted; c a checkpoint position; L the replay log length at which the log is folded.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from replaylab.cache import CacheConfig, HybridCache

__all__ = ["Step", "Recorder", "store_view", "speculative_round", "timeline_figure", "SERIES"]


@dataclass(frozen=True)
class Step:
    """The cache after one call. Counts are of copies of *all* recurrent layers at one
    position (a "copy" is one position's memory, whatever the number of layers)."""

    index: int  # 0, 1, ... in the order recorded
    event: str  # what the call was, e.g. "verify 5"
    position: int  # tokens in the cache
    kv_rows: int  # KV rows held per branch (positions with keys and values)
    copies_held: int  # snapshot: state copies kept (handles + one per verified token)
    copies_made: int  # snapshot: copies made by this call
    checkpoints_held: int  # recompute: checkpoints stored (the zero state at 0 is free, not
    # counted); replay: 1, its checkpoint
    checkpoint_positions: tuple  # where those checkpoints stand
    log_cursor: int  # replay: log entries in use (the cursor: c + cursor = position)
    rerun_tokens: int  # tokens re-run through the model by this call (cache.stats)
    folds: int  # replay: 1 if the checkpoint moved forward in this call (the log folded)
    folded_tokens: int  # logged tokens folded into a state by this call, all layers (stats)
    restores: int  # restores by this call (cache.stats)
    nbytes: dict = field(default_factory=dict)  # cache.nbytes() after the call

    @property
    def total_bytes(self) -> int:
        return sum(self.nbytes.values())


def store_view(cache: HybridCache) -> dict:
    """What the cache's store keeps, read from the store: ``copies`` (snapshot: the kept copy
    objects, one per handle and per verified token), ``checkpoints`` (positions of stored
    checkpoints), ``cursor`` (replay: log entries in use, else 0)."""
    store = cache.ssm
    if cache.strategy == "snapshot":
        copies = [copy for _, copy in store.handles.values()] + list(store.per_token.values())
        return dict(copies=copies, checkpoints=(), cursor=0)
    if cache.strategy == "recompute":
        kept = tuple(sorted(p for p, c in store.checkpoints.items() if c is not None))
        return dict(copies=[], checkpoints=kept, cursor=0)
    if cache.strategy == "replay":
        return dict(copies=[], checkpoints=(store.start,), cursor=store.log_length())
    raise ValueError(f"store_view: no view of the {cache.strategy!r} store")


class Recorder:
    """Records a ``Step`` each time ``record(event)`` is called; call it after each cache call
    (a forward counts as one call). The first record's deltas count from the cache's state when
    the recorder was made. It keeps a reference to every snapshot copy it has seen, so that a
    new copy is never mistaken for an old one whose id was reused."""

    def __init__(self, cache: HybridCache):
        self.cache = cache
        self.steps: list[Step] = []
        self._seen = {id(c): c for c in store_view(cache)["copies"]}  # kept alive: ids stay
        self._stats = self._counters()
        self._start = self._checkpoint_start()

    def _counters(self):
        s = self.cache.stats
        return s.recomputed_tokens, s.folded_tokens, s.restores

    def _checkpoint_start(self):
        return self.cache.ssm.start if self.cache.strategy == "replay" else None

    def record(self, event: str) -> Step:
        cache, view = self.cache, store_view(self.cache)
        made = [c for c in view["copies"] if id(c) not in self._seen]
        self._seen.update((id(c), c) for c in made)
        counters = self._counters()
        rerun, folded, restores = (now - before for now, before in zip(counters, self._stats))
        start = self._checkpoint_start()
        folds = int(start is not None and start > self._start)
        self._stats, self._start = counters, start
        kv = max((kv.length for kv in cache.kv.values()), default=cache.position)
        step = Step(
            index=len(self.steps),
            event=event,
            position=cache.position,
            kv_rows=kv,
            copies_held=len(view["copies"]),
            copies_made=len(made),
            checkpoints_held=len(view["checkpoints"]),
            checkpoint_positions=tuple(view["checkpoints"]),
            log_cursor=view["cursor"],
            rerun_tokens=rerun,
            folds=folds,
            folded_tokens=folded,
            restores=restores,
            nbytes=dict(cache.nbytes()),
        )
        self.steps.append(step)
        return step


@torch.no_grad()
def speculative_round(
    model,
    strategy="replay",
    prompt_len=10,
    k=4,
    accepted=1,
    interval=8,
    log_length=8,
    seed=0,
) -> Recorder:
    """One round of greedy speculative decoding as ``replaylab.decoding.speculative`` runs it,
    recorded call by call: prefill the prompt; ``snapshot``; verify the pending token and k
    drafts in one forward; ``truncate_to`` after the ``accepted`` right drafts; ``release``;
    decode the next token. The drafts are the model's own greedy tokens with draft
    ``accepted + 1`` made wrong, so exactly ``accepted`` are kept (checked). Returns the
    ``Recorder``: ``.steps`` the round, ``.cache`` the cache it ran on."""
    if not 0 <= accepted < k:
        raise ValueError(f"accepted: expected 0 <= accepted < k = {k}, got {accepted}")
    vocab = model.cfg.vocab_size
    g = torch.Generator().manual_seed(seed)
    prompt = torch.randint(0, vocab, (1, prompt_len), generator=g)
    config = CacheConfig(strategy, checkpoint_interval=interval, log_length=log_length)
    cache = config.build(model, 1)
    rec = Recorder(cache)

    pending = model(prompt, cache)[:, -1].argmax(-1, keepdim=True)
    rec.record(f"prefill {prompt_len}")
    # the greedy continuation after the pending token, from a separate cache
    ref_cache = CacheConfig("snapshot").build(model, 1)
    logits, greedy_tokens = model(torch.cat([prompt, pending], 1), ref_cache), []
    for _ in range(k):
        greedy_tokens.append(logits[:, -1].argmax(-1, keepdim=True))
        logits = model(greedy_tokens[-1], ref_cache)
    drafts = torch.cat(greedy_tokens, 1)
    drafts[0, accepted] = (drafts[0, accepted] + 1) % vocab  # the first wrong draft

    handle = cache.snapshot()
    rec.record("snapshot")
    start = cache.position
    pred = model(torch.cat([pending, drafts], 1), cache)[0].argmax(-1)
    rec.record(f"verify {k + 1}")
    a = int((drafts[0] == pred[:k]).long().cumprod(0).sum())
    if a != accepted:
        raise AssertionError(f"expected {accepted} drafts accepted, the model accepted {a}")
    cache.truncate_to(start + 1 + a)
    rec.record(f"truncate_to {start + 1 + a}")
    cache.release(handle)
    rec.record("release")
    model(pred[a].view(1, 1), cache)
    rec.record("decode 1")
    return rec


# quantity -> (label, colour, drawn as "line" (held) or "bar" (done by the call))
SERIES = {
    "kv_rows": ("KV rows held", "#7f7f7f", "line"),
    "copies_held": ("state copies held", "#d62728", "line"),
    "copies_made": ("state copies made", "#ff9896", "bar"),
    "checkpoints_held": ("checkpoints held", "#1f77b4", "line"),
    "log_cursor": ("replay log cursor", "#2ca02c", "line"),
    "rerun_tokens": ("tokens re-run", "#ff7f0e", "bar"),
    "folds": ("folds into the checkpoint", "#9467bd", "bar"),
}
# which quantities each strategy's panel shows (re-run tokens everywhere: zero is the point;
# ``folded_tokens``, the CPU reference's per-step work, is in the steps, not in the figure)
PANELS = {
    "snapshot": ("kv_rows", "copies_held", "copies_made", "rerun_tokens"),
    "recompute": ("kv_rows", "checkpoints_held", "rerun_tokens"),
    "replay": ("kv_rows", "checkpoints_held", "log_cursor", "folds", "rerun_tokens"),
}


def timeline_figure(timelines: dict, title=None):
    """One panel per strategy (``timelines``: strategy -> list of ``Step``), x = the call of
    the round, one y-axis per panel, the same fixed range on all: held quantities as lines,
    what a call did as bars; one colour per quantity throughout."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    names = list(timelines)
    fig = make_subplots(
        rows=len(names),
        cols=1,
        shared_xaxes=False,
        vertical_spacing=0.08,
        subplot_titles=[f"{s}" for s in names],
    )
    top = max(
        getattr(step, q) for s in names for step in timelines[s] for q in PANELS.get(s, SERIES)
    )
    shown = set()
    for row, strategy in enumerate(names, start=1):
        steps = timelines[strategy]
        x = [f"{st.index}. {st.event}" for st in steps]
        for q in PANELS.get(strategy, tuple(SERIES)):
            label, colour, kind = SERIES[q]
            y = [getattr(st, q) for st in steps]
            common = dict(name=label, legendgroup=q, showlegend=q not in shown)
            if kind == "bar":
                trace = go.Bar(x=x, y=y, marker_color=colour, opacity=0.8, **common)
            else:
                trace = go.Scatter(
                    x=x, y=y, mode="lines+markers", line=dict(color=colour, width=2), **common
                )
            fig.add_trace(trace, row=row, col=1)
            shown.add(q)
        fig.update_yaxes(range=[0, top + 1], title_text="count", row=row, col=1)
    fig.update_layout(
        barmode="group",
        height=260 * len(names) + 60,
        title=title or "One speculative round, call by call, as each store keeps it",
        legend=dict(orientation="h", y=-0.08),
    )
    return fig
