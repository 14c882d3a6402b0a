"""Continuous batching over a ``DecodeEngine`` under one byte budget: requests arrive, wait in
a first-come-first-served queue, are admitted between steps while the budget and the free
slots allow (with the engine's ``batched_admission``, an iteration's admissions in one
prefill), decode one token per step (or, speculating, verify k drafts of their own drafter
and keep their own accepted prefix), and leave when they have their tokens.

The split follows nano-vllm's: ``Request`` (``serving.request``) is the sequence, this module
is the scheduler, and the engine is the model runner. The scheduler never touches the model:
it only calls ``engine.admit``, ``engine.step``, ``engine.rollback`` and ``engine.retire``, so
the tokens it produces are the engine's greedy tokens whatever the batch looks like.

One byte budget covers KV + recurrent state + logs (``serving.budget``: what a request holds,
``request_bytes``, and the admission rule, ``admissible``).

Clock: ``now`` is the scheduler's clock in seconds. Work is timed with ``time.perf_counter``
(after ``torch.cuda.synchronize()`` on a GPU) and moves the clock by the time it took; when
nothing runs and nobody waits, the clock jumps to the next arrival instead of sleeping (a
server's idle time, skipped). Timings are therefore real except that idle gaps cost nothing.

Glossary: S running requests in a step, k drafts per verify round (0: plain decode), T = k + 1
tokens per step, keep = 1 + accepted drafts.
"""

from __future__ import annotations

import math
import numbers
import time
from dataclasses import dataclass

import numpy as np
import torch

from replaylab.serving.adaptive_k import policy_for
from replaylab.serving.admission import check_interleaving, grid_grant
from replaylab.serving.budget import SlotBytes, admissible, request_bytes, slot_bytes
from replaylab.serving.contexts import SlotContexts, accepted
from replaylab.serving.drafters import check_scheduler_drafter
from replaylab.serving.request import FINISHED, RUNNING, WAITING, Request
from replaylab.serving.validate import as_drafts, as_int, as_token_ids, given

__all__ = ["Scheduler", "SlotBytes", "slot_bytes", "request_bytes", "admissible", "StepRecord"]


@dataclass
class StepRecord:
    """One scheduler iteration: ``start`` / ``end`` on the clock, ``admitted`` request ids,
    ``running`` requests in the engine step (S), ``T`` its width, ``used`` bytes held after
    admission (the most the iteration held), ``step_s`` / ``rollback_s`` seconds of the engine
    step and of the rollback, ``rejected`` drafts rolled back, ``rolled_back`` slots rolled
    back, ``tokens`` output tokens the step produced, ``prefilled`` prompt tokens an
    interleaved prefill ran in it, ``tree_bytes`` what the prefix cache's tree held after the
    iteration's admissions and prefill (``used + tree_bytes <= budget_bytes``), ``captures``
    CUDA graphs the engine captured in it (their eager runs are inside its time)."""

    start: float
    end: float = 0.0
    admitted: tuple = ()
    running: int = 0
    T: int = 0
    used: int = 0
    step_s: float = 0.0
    rollback_s: float = 0.0
    rejected: int = 0
    rolled_back: int = 0
    tokens: int = 0
    prefilled: int = 0
    tree_bytes: int = 0
    captures: int = 0


class Scheduler:
    """Continuous batching of ``Request`` s over ``engine`` (an empty ``DecodeEngine``).

    budget_bytes: the byte budget for KV + state + logs of the running requests (default: the
    engine's pools, max_batch x nbytes_per_slot); k: drafts per verify round (0: plain
    decode; 1 <= k + 1 <= engine.max_verify), used by requests that carry a drafter;
    kv_accounting: "request" or "slot" (``request_bytes``); max_running: at most this many
    requests at once (default: the engine's max_batch); admission: the rule, a function with
    ``admissible``'s signature (notebook 13's exercise plugs in here); an answer that would
    break the budget or the free slots is refused with a ValueError before anything is
    admitted; prefix: an ``EnginePrefixCache`` over ``engine`` (``serving.prefix``) that
    admissions go through (each request's ``prefix_hit`` says what it reused). Its tree's bytes
    count inside ``budget_bytes``: the running requests' reservations come first, and after
    each iteration's admissions and prefill the tree is evicted (``PrefixTree.fit``, in its
    eviction order) down to what they leave; its own budget, if set, caps it further.
    prefill_per_step: None
    (default) prefills each admitted prompt whole before the iteration's engine step; a
    number n interleaves: each iteration prefills at most n prompt tokens of the admitted
    requests (first come, first served, a chunk of each in turn through
    ``engine.begin_admit``, or with ``prefix`` its ``begin_admit``: seated from the tree, the
    rest in chunks), then steps the running requests, so an arrival delays each decoder by one
    chunk instead of its whole prompt; where n >= the engine's ``prefill_chunk``, each chunk
    ends where a cold admission's would (``admission.grid_grant``), so its bits are the same.
    A request runs from the iteration its prefill ends (its first token). drafter: one batched
    drafter (``serving.drafters``: ``propose_batch``) that drafts for every running request at
    once, its rows the requests' engine slots (a ``BatchModelDrafter`` keeps a draft slot per
    row and re-seats a row whose context does not extend what it holds); requests then carry no
    drafter of their own. adaptive_k: False (default) drafts k every round; True makes k the
    most, and each round drafts the k in 0 .. k with the best measured rate at its batch
    (``serving.adaptive_k``; the tokens are the same greedy ones), or pass an ``AdaptiveK``.

    >>> sched = Scheduler(engine, budget_bytes=2**30, k=4)          # doctest: +SKIP
    >>> sched.add(Request(0, prompt, 32, arrival=0.0, drafter=d))
    >>> finished = sched.run()          # every request, served; or sched.step() one by one
    """

    def __init__(
        self,
        engine,
        budget_bytes=None,
        k=0,
        kv_accounting="request",
        max_running=None,
        admission=admissible,
        prefix=None,
        prefill_per_step=None,
        drafter=None,
        adaptive_k=False,
    ):
        from replaylab.serving.engine import DecodeEngine

        if not isinstance(engine, DecodeEngine):
            raise TypeError(f"engine: expected a DecodeEngine, got {given(engine)}")
        if engine.batch:
            raise ValueError(
                f"engine: {engine.batch} slots are live ({engine.slots}); the scheduler needs "
                "an engine with every slot free (retire them first)"
            )
        self.engine = engine
        self.k = as_int("k", k, 0, engine.max_verify - 1)
        if kv_accounting not in ("request", "slot"):
            raise ValueError(f"kv_accounting: expected 'request' or 'slot', got {kv_accounting!r}")
        self.kv_accounting = kv_accounting
        self.sizes = slot_bytes(engine)
        smallest = request_bytes(self.sizes, 1, 1, self.k, kv_accounting)
        if budget_bytes is None:
            budget_bytes = engine.max_batch * self.sizes.slot
        self.budget = as_int("budget_bytes", budget_bytes, low=1)
        if self.budget < smallest:
            raise ValueError(
                f"budget_bytes: {self.budget} is smaller than one slot: a request holds at "
                f"least {smallest} bytes ({self.sizes.recurrent} recurrent + KV) under "
                f"{engine.strategy}; expected budget_bytes >= {smallest}"
            )
        self.max_running = as_int(
            "max_running",
            engine.max_batch if max_running is None else max_running,
            1,
            engine.max_batch,
        )
        if not callable(admission):
            raise TypeError(f"admission: expected a function, got {type(admission).__name__}")
        self.admission = admission
        if prefix is not None and getattr(prefix, "engine", None) is not engine:
            raise ValueError("prefix: expected an EnginePrefixCache over this scheduler's engine")
        self.prefix = prefix
        if prefill_per_step is not None:
            prefill_per_step = as_int("prefill_per_step", prefill_per_step, low=1)
        check_interleaving(engine, prefix, prefill_per_step)
        self.prefill_per_step = prefill_per_step
        check_scheduler_drafter(engine, drafter, self.k, self.max_running)
        self.drafter = drafter
        self.adaptive_k = policy_for(adaptive_k, self.k, engine)
        # what the batched drafter reads, kept across rounds (a context is at most max_len + 1)
        self._contexts = (
            None if drafter is None else SlotContexts(engine.max_batch, engine.max_len + self.k + 2)
        )
        self.prefilling: list[Request] = []  # admitted, prefill unfinished (interleaving)
        self.waiting: list[Request] = []
        self.running: list[Request] = []
        self.finished: list[Request] = []
        self.used = 0
        self.now = 0.0
        self.peak_used = 0
        self.peak_running = 0
        self.history: list[StepRecord] = []
        self._ids = set()
        self._cuda = engine.device.type == "cuda"

    # --- requests ----------------------------------------------------------------------------
    def need(self, request) -> int:
        """Bytes ``request`` will hold while it runs."""
        return request_bytes(
            self.sizes, request.prompt_len, request.max_new_tokens, self.k, self.kv_accounting
        )

    def add(self, request):
        """Queue ``request`` (FCFS by arrival; equal arrivals in the order added). Raises,
        leaving the scheduler as it was, for a duplicate id, a prompt that is not (T0,)
        integer ids in the vocabulary, max_new_tokens < 1, a request longer than the engine's
        max_len, or one that needs more bytes than the whole budget."""
        self._queue(request, *self._check_request(request, self._ids))

    def _check_request(self, request, ids):
        """``add``'s checks against the ids taken (``ids``): (prompt (T0,) int64, arrival,
        bytes needed); nothing changes."""
        if not isinstance(request, Request):
            raise TypeError(f"request: expected a Request, got {type(request).__name__}")
        try:
            taken = request.id in ids
        except TypeError:
            raise TypeError(f"request: id {request.id!r}: expected a hashable id") from None
        if taken:
            raise ValueError(f"request: id {request.id!r} was already added")
        if request.status != WAITING or request.tokens:
            raise ValueError(f"request {request.id}: already served (status {request.status})")
        if request.drafter is not None and self.drafter is not None:
            raise ValueError(
                f"request {request.id}: carries its own drafter, but the scheduler's batched "
                "drafter drafts for every request; give one or the other"
            )
        if request.drafter is not None and not callable(getattr(request.drafter, "propose", None)):
            raise TypeError(
                f"request {request.id}: drafter: expected an object with propose(context, k, "
                f"vocab), got {given(request.drafter)}"
            )
        if request.drafter is not None and not self.k:
            raise ValueError(
                f"request {request.id}: carries a drafter, but the scheduler drafts k=0 tokens a "
                "round; build the Scheduler with k >= 1 to speculate"
            )
        vocab = self.engine.cfg.vocab_size
        prompt = as_token_ids(f"request {request.id}: prompt", request.prompt, vocab, ("T0",))
        T0 = prompt.numel()
        n = as_int(f"request {request.id}: max_new_tokens", request.max_new_tokens, low=1)
        max_len = self.engine.max_len
        if not 1 <= T0 < max_len or T0 + n - 1 > max_len:
            raise ValueError(
                f"request {request.id}: prompt of {T0} tokens + max_new_tokens={n} needs "
                f"{T0 + n - 1} positions: expected 1 <= prompt < max_len and prompt + "
                f"max_new_tokens - 1 <= max_len={max_len}"
            )
        if isinstance(request.arrival, bool) or not isinstance(request.arrival, numbers.Real):
            raise TypeError(
                f"request {request.id}: arrival: expected seconds (a real number), got "
                f"{given(request.arrival)}"
            )
        arrival = float(request.arrival)
        if not 0 <= arrival < math.inf:
            raise ValueError(
                f"request {request.id}: arrival: expected a finite time >= 0 s, got {arrival}"
            )
        need = request_bytes(self.sizes, T0, n, self.k, self.kv_accounting)
        if need > self.budget:
            raise ValueError(
                f"request {request.id}: needs {need} bytes, more than the whole "
                f"budget_bytes={self.budget}: it could never be admitted"
            )
        return prompt, arrival, need

    def _queue(self, request, prompt, arrival, need):
        """Queue a checked request."""
        request.prompt, request.arrival, request.reserved = prompt, arrival, need
        at = len(self.waiting)
        while at and self.waiting[at - 1].arrival > arrival:
            at -= 1
        self.waiting.insert(at, request)
        self._ids.add(request.id)

    @property
    def idle(self) -> bool:
        """Nothing waiting, prefilling or running."""
        return not self.waiting and not self.prefilling and not self.running

    # --- the clock -----------------------------------------------------------------------
    def _sync(self):
        if self._cuda:
            torch.cuda.synchronize()

    def _clock(self, t0, start):
        """The scheduler clock now: ``start`` plus the seconds since ``t0``."""
        self._sync()
        return start + time.perf_counter() - t0

    # --- one iteration -------------------------------------------------------------------
    def step(self):
        """One iteration: admit what the rule allows (prefill each, its first token), one
        engine step for every running request, retire the finished. Returns the requests
        that finished in it (a list, maybe empty)."""
        if self.idle:
            return []
        if not self.running and not self.prefilling and self.waiting[0].arrival > self.now:
            self.now = self.waiting[0].arrival  # idle: jump to the next arrival
        start, t0 = self.now, time.perf_counter()
        record, captured = StepRecord(start=start), self.engine.stats.graph_captures
        done = self._admit(record, t0, start)
        if self.prefilling:
            done += self._prefill_chunks(record, t0, start)
        if self.running:
            done += self._decode(record, t0, start)
        for r in done:
            self._retire(r, self._clock(t0, start))
        self.now = record.end = self._clock(t0, start)
        record.captures = self.engine.stats.graph_captures - captured
        self.history.append(record)
        return done

    def _admit(self, record, t0, start):
        arrived = [r for r in self.waiting if r.arrival <= start]
        free = min(self.engine.n_free, self.max_running - len(self.running) - len(self.prefilling))
        needs = [r.reserved for r in arrived]
        n = self.admission(list(needs), self.used, self.budget, free)
        if self.admission is not admissible:
            n = _checked_admission(self, n, needs, free)
        admitted = arrived[:n]
        try:
            done = _seat(self, admitted, t0, start)
        except BaseException:  # those not seated wait again, their bytes released
            _requeue(self, admitted)
            raise
        record.admitted = tuple(r.id for r in arrived[:n])
        record.used = self.used
        self._fit_tree(record)
        self.peak_used = max(self.peak_used, self.used)
        self.peak_running = max(self.peak_running, len(self.running))
        return done

    def _fit_tree(self, record):
        """One budget: the prefix tree holds at most what the running requests leave."""
        if self.prefix is not None:
            record.tree_bytes = self.prefix.fit(self.budget - self.used)

    def _start_running(self, r, logits, t0, start) -> bool:
        """``r``'s prompt is in: its first token, from the prompt's last logits; True if that
        was its only one."""
        r.tokens.append(int(logits.argmax()))
        r.token_times.append(self._clock(t0, start))
        if self._contexts is not None:
            self._contexts.start(r.slot, r.prompt, r.tokens)
        r.status = RUNNING
        self.running.append(r)
        return r.done

    def _prefill_chunks(self, record, t0, start):
        """Interleaving: at most ``prefill_per_step`` prompt tokens of the prefilling
        requests, first come first served; those whose prompt is in start running."""
        left, done = self.prefill_per_step, []
        for r in list(self.prefilling):
            if not left:
                break
            n = grid_grant(r.admission, left, self.prefill_per_step, self.engine.prefill_chunk)
            if not n:  # no chunk boundary within reach: wait a step (later ones may go)
                continue
            left -= n
            record.prefilled += n
            if r.admission.advance(n):
                self.prefilling.remove(r)
                logits, r.admission = r.admission.logits, None  # the slot is live: let it go
                if self._start_running(r, logits, t0, start):
                    done.append(r)
        self._fit_tree(record)  # a finished prompt's blocks went into the tree
        return done

    def _decode(self, record, t0, start):
        """One engine step of every running request: a row (S, T) of its last token and its
        drafts (T = k + 1 when any running request speculates, k the scheduler's or, with
        adaptive_k, the round's choice; padded past its count), then each keeps its accepted
        prefix and the target's next token."""
        going = [r for r in self.running if not r.done]
        if not going:
            return []
        batched = self.drafter is not None
        slots = [r.slot for r in going]
        k = self.k if batched or any(r.drafter is not None for r in going) else 0
        choosing = bool(k) and self.adaptive_k is not None
        if choosing:  # the round's k for this bucket, and the round timed for the next choice
            bucket = self.engine.table.bucket(slots)
            k = as_int("adaptive_k: the round's k", self.adaptive_k.choose(bucket), 0, self.k)
            self._sync()
            r0 = time.perf_counter()
        T, proposed, taken = k + 1, (), ()
        if T == 1:  # plain decode: one token each, nothing to accept or roll back
            tokens = torch.tensor([[r.tokens[-1]] for r in going])
            pred = self._step(record, tokens, None, slots)
            for r, p in zip(going, pred[:, 0].tolist()):
                r.tokens.append(p)
                r.rounds += 1
            keep = [1] * len(going)
            if self._contexts is not None:  # a round of k = 0 (adaptive_k): the drafter reads on
                self._contexts.extend(slots, pred, np.ones(len(going), dtype=np.int64))
        else:
            proposed, taken, keep = self._verify(record, going, slots, T)
        now = self._clock(t0, start)
        if choosing:
            seconds = time.perf_counter() - r0
            proposed, taken = (v.tolist() if hasattr(v, "tolist") else v for v in (proposed, taken))
            self.adaptive_k.observe(bucket, T, seconds, proposed, taken)
        for r, m in zip(going, keep):
            r.token_times += [now] * m
        record.running, record.T, record.tokens = len(going), T, sum(keep)
        return [r for r in going if r.done]

    def _step(self, record, tokens, counts, slots):
        """The engine's step of ``tokens`` (S, T) on the host and its greedy ids, an (S, T)
        int64 numpy array (reading them back ends the step), timed into ``record.step_s``."""
        self._sync()
        s0 = time.perf_counter()
        logits = self.engine.step(tokens, counts=counts, slots=slots, check=False)
        pred = logits.argmax(-1).cpu().numpy()
        record.step_s = time.perf_counter() - s0
        return pred

    def _verify(self, record, going, slots, T):
        """A speculation round of T - 1 drafts: drafts, one verify step, acceptance, one
        rollback. Returns the drafts each request proposed and accepted, (S,) int64 arrays,
        and the tokens each keeps (1 + accepted, a list). The host's part is numpy: a round
        costs it a few microseconds an operation, not a tensor operation's dispatch each."""
        # fewer drafts than k near the end, and under replay near the fold grid (room)
        room = self.engine.policy.room  # the engine's ``room`` without its check of the slot
        wants = [min(T - 1, r.remaining - 1, room(r.slot) - 1) for r in going]
        drafts, n = _round_drafts(self, going, wants, T, self.engine.cfg.vocab_size)
        tokens = np.empty((len(going), T), dtype=np.int64)
        tokens[:, 0] = [r.tokens[-1] for r in going]
        tokens[:, 1:] = drafts
        pred = self._step(record, torch.from_numpy(tokens), (n + 1).tolist(), slots)
        taken = accepted(drafts, pred, n)  # (S,)
        keep = (taken + 1).tolist()
        for r, p, m, d in zip(going, pred.tolist(), keep, n.tolist()):
            r.tokens += p[:m]  # the accepted drafts are the target's own tokens
            r.proposed, r.accepted, r.rounds = r.proposed + d, r.accepted + m - 1, r.rounds + 1
        record.rejected += int((n - taken).sum())
        record.rolled_back += int((taken < n).sum())
        if self._contexts is not None:
            self._contexts.extend(slots, pred, taken + 1)
        self._sync()
        r0 = time.perf_counter()
        self.engine.rollback(keep, slots=slots)
        self._sync()
        record.rollback_s = time.perf_counter() - r0
        return n, taken, keep

    def _retire(self, r, now):
        self.engine.retire(r.slot)
        self.running.remove(r)
        self.used -= r.reserved
        r.status, r.finished_at = FINISHED, now
        self.finished.append(r)

    def run(self, requests=(), max_steps=None):
        """Add ``requests`` and step until every request is served (or ``max_steps``
        iterations); returns the finished requests in the order they finished."""
        if max_steps is not None:
            max_steps = as_int("max_steps", max_steps, low=0)
        requests, ids, checked = list(requests), set(self._ids), []
        for r in requests:  # every request checked before any is queued
            checked.append(self._check_request(r, ids))
            ids.add(r.id)
        for r, c in zip(requests, checked):
            self._queue(r, *c)
        steps = 0
        while not self.idle and (max_steps is None or steps < max_steps):
            self.step()
            steps += 1
        return list(self.finished)


def _checked_admission(sched, n, needs, free):
    """A custom admission rule's answer n, checked before anything changes: a count of the
    arrived requests within the free slots and the budget, and not 0 where nothing runs, every
    waiting request has arrived and the head fits (the queue would never move; a rule that
    waits for later arrivals may admit none before they come)."""
    n = as_int("admission: the rule's count n", n)
    if not 0 <= n <= min(free, len(needs)):
        raise ValueError(
            f"admission: the rule admitted n={n}; expected 0 <= n <= {min(free, len(needs))} "
            f"({len(needs)} requests arrived, {free} slots free)"
        )
    held = sched.used + sum(needs[:n])
    if held > sched.budget:
        raise ValueError(
            f"admission: the rule admitted {n} request{'s' * (n != 1)} holding {held} bytes "
            f"with the running ones; expected at most budget_bytes={sched.budget}"
        )
    idle = not sched.running and not sched.prefilling and len(needs) == len(sched.waiting)
    if n == 0 and idle and needs and free and sched.used + needs[0] <= sched.budget:
        raise ValueError(
            f"admission: the rule admitted none of {len(needs)} waiting requests, all arrived, "
            f"with none running, though the head ({needs[0]} bytes) fits "
            f"budget_bytes={sched.budget}: the queue would never move; expected n >= 1"
        )
    return n


def _seat(sched, admitted, t0, start):
    """Seat ``admitted`` (requests leaving ``sched``'s queue, in order): each prompt's prefill
    (all at once with the engine's ``batched_admission``), or its first chunk's admission
    under interleaving; returns those that finished with their first token."""
    done = []
    alone = sched.prefix is not None or sched.prefill_per_step is not None  # seated apart
    if len(admitted) > 1 and sched.engine.batched_admission and not alone:  # one ``admit_many``
        for r in admitted:
            sched.waiting.remove(r)
            r.admitted_at = sched._clock(t0, start)
            sched.used += r.reserved
        seated = sched.engine.admit_many([r.prompt for r in admitted])
        for r, (slot, logits) in zip(admitted, seated):
            r.slot = slot
            if sched._start_running(r, logits, t0, start):
                done.append(r)
        admitted = []  # seated
    for r in admitted:
        sched.waiting.remove(r)
        r.admitted_at = sched._clock(t0, start)
        sched.used += r.reserved
        if sched.prefill_per_step is not None:
            if sched.prefix is None:
                r.admission = sched.engine.begin_admit(r.prompt.to(sched.engine.device))
            else:  # seated from the tree; the rest a chunk at a time
                r.admission = sched.prefix.begin_admit(r.prompt)
                r.prefix_hit = r.admission.hit
            r.slot = r.admission.slot
            sched.prefilling.append(r)
            continue
        if sched.prefix is None:
            r.slot, logits = sched.engine.admit(r.prompt.to(sched.engine.device))
        else:
            r.slot, logits, r.prefix_hit = sched.prefix.admit(r.prompt)
        if sched._start_running(r, logits, t0, start):
            done.append(r)
    return done


def _requeue(sched, admitted):
    """``_seat`` raised: the requests it had not seated go back to the head of the queue, in
    order, and give back their bytes; the ones seated before stay."""
    back = [r for r in admitted if r.slot is None and r not in sched.waiting]
    for r in back:
        sched.used -= r.reserved
        r.admitted_at = None
    sched.waiting[:0] = back


def _round_drafts(sched, going, wants, T, vocab):
    """(drafts (S, T - 1), n (S,)), int64 numpy arrays: each request of ``sched``'s round its
    first ``wants[i]`` proposals of k = T - 1, zeros past them; from the scheduler's batched
    drafter (one call for every request that wants any, reading its contexts table), else
    from each request's own."""
    k = T - 1
    drafts = np.zeros((len(going), k), dtype=np.int64)
    if sched.drafter is None:
        n = np.zeros(len(going), dtype=np.int64)
        for i, (r, w) in enumerate(zip(going, wants)):
            if r.drafter is not None and w > 0:
                got = r.drafter.propose(r.context(), k, vocab)
                got = as_drafts(f"request {r.id}: drafts", got, vocab)[:w]
                drafts[i, : len(got)], n[i] = got, len(got)
        return drafts, n
    n = np.maximum(np.array(wants, dtype=np.int64), 0)
    asked = np.flatnonzero(n)
    if not len(asked):
        return drafts, n
    slots = np.array([r.slot for r in going])[asked]
    contexts, lengths = sched._contexts.rows(slots, k + 1)
    got = sched.drafter.propose_batch(contexts, lengths, torch.from_numpy(slots), k, vocab)
    shape = (("requests drafted for", len(asked)), ("k", k))
    got = as_token_ids("drafts of the scheduler's drafter", got, vocab, shape).cpu().numpy()
    drafts[asked] = np.where(np.arange(k) < n[asked, None], got, 0)
    return drafts, n
