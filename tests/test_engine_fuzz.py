"""A differential fuzz of the serving engine (issue 34): a hypothesis state machine runs admit,
begin_admit + advance (interleaved prefill, also seated from the prefix cache), prefix-cache
hits under a byte budget that changes (evictions, also of nodes a prefilling prompt was seated
from), steps with per-slot counts, rollbacks, retires and batched speculation on the tiny
preset model, under each strategy, and compares every row the
engine returns with a fresh teaching-cache prefill of that slot's whole sequence
(``test_engine_validation.prefill_logits``, to 2e-4). Before every rule one bad input is tried
(ids outside the vocabulary or of a float dtype, wrong shapes and lengths, counts and keeps out
of range, slots not live, a drafter proposing bad ids, a prompt that is not ids, ...): it must
be refused and leave every pool tensor, host number and the prefix tree bitwise as they were.

Replay runs twice: with a ring of L rows and of L + MAX_VERIFY - 1 (a step passes the fold grid).
On a GPU each strategy runs once more on the fast path (a CUDA copy of the model, the fused
kernels, CUDA graphs), fewer examples since each captures its graphs, against the same oracle.

Size: per strategy ``EXAMPLES`` runs of ``STEPS`` rules (a few hundred rules in all);
derandomized, so every run of the suite tries the same programs."""

import copy

import pytest
import torch
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule
from test_engine_prefix import one_thread_no_grad  # noqa: F401 (autouse: one thread, no grad)
from test_engine_validation import (
    MODEL,
    VOCAB,
    assert_same,
    engine_state,
    prefill_logits,
    tree_state,
)

from replaylab.decoding import PromptLookupDrafter
from replaylab.serving import DecodeEngine, EnginePrefixCache
from replaylab.serving.prefix import PrefixAdmission

STRATEGIES = ("snapshot", "recompute", "replay")
EXAMPLES, STEPS = 12, 50
SLOTS, MAX_LEN, L, MAX_VERIFY = 3, 32, 4, 3
STEM = [3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5, 8]  # shared prompt starts: prefix-cache hits
TOL = 2e-4


class FixedDrafter:
    def __init__(self, ids):
        self.ids = ids

    def propose(self, context, k, vocab):
        return self.ids


def ids(data, n_min, n_max, vocab=VOCAB):
    return data.draw(st.lists(st.integers(0, vocab - 1), min_size=n_min, max_size=n_max))


class EngineMachine(RuleBasedStateMachine):
    """The engine and its model of it: ``seq[slot]`` the tokens the slot holds, ``last[slot]``
    the tokens of its last step a rollback may drop."""

    strategy = "replay"
    log_capacity = None  # replay's ring rows (None: L)
    model = MODEL  # the engine's; the oracle is always the teaching cache on MODEL (CPU)
    engine_options = {}

    def __init__(self):
        super().__init__()
        self.engine = DecodeEngine(
            self.model, SLOTS, MAX_LEN, self.strategy, log_length=L, max_verify=MAX_VERIFY,
            log_capacity=self.log_capacity, **self.engine_options,
        )  # fmt: skip
        self.prefix = EnginePrefixCache(self.engine, block_size=L)
        self.seq, self.last = {}, {}
        self.admission = None  # (Admission, its prompt) while one prefills

    # --- the oracle ----------------------------------------------------------------------------
    def check_rows(self, got, tokens):
        """``got`` (n, vocab): the logits of the last n positions of ``tokens``."""
        want = prefill_logits(tokens, self.strategy)[-got.shape[0] :]
        torch.testing.assert_close(got.float().cpu(), want.float(), atol=TOL, rtol=TOL)

    def live(self):
        return sorted(self.seq)

    def went_live(self, slot, prompt, logits):
        assert slot not in self.seq and self.engine.live[slot]
        self.seq[slot], self.last[slot] = list(prompt), 0
        self.check_rows(logits[None], prompt)

    def prompt(self, data):
        """A prompt that often starts with part of ``STEM`` (so the prefix cache hits)."""
        head = STEM[: data.draw(st.integers(0, len(STEM)))]
        return head + ids(data, 0 if head else 1, 6)

    # --- bad input, before every rule ----------------------------------------------------------
    def poke(self, data):
        """One bad call, drawn; it must raise and change nothing."""
        e, live = self.engine, self.live()
        s = live[0] if live else 0
        T = MAX_VERIFY
        bad = [
            (lambda: e.admit([1, 2, 3]), TypeError),
            (lambda: e.admit(torch.tensor([VOCAB])), ValueError),
            (lambda: e.admit(torch.zeros(MAX_LEN, dtype=torch.long)), ValueError),
            (lambda: e.retire(SLOTS), ValueError),
            (lambda: self.prefix.admit(None), TypeError),
            (lambda: self.prefix.admit([1, VOCAB]), ValueError),
            (lambda: self.prefix.set_budget(self.prefix.floor_bytes - 1), ValueError),
            (lambda: e.step(torch.zeros(len(live) + 1, 1, dtype=torch.long)), ValueError),
        ]
        if live:
            one = [s]
            bad += [
                (lambda: e.step(torch.full((1, 1), VOCAB), slots=one), ValueError),
                (lambda: e.step(torch.full((1, 1), -1), slots=one), ValueError),
                (lambda: e.step(torch.ones(1, 1), slots=one), TypeError),
                (lambda: e.step(torch.ones(1, T + 1, dtype=torch.long), slots=one), ValueError),
                (lambda: e.step(torch.ones(1, T, dtype=torch.int32), [0], slots=one), ValueError),
                (lambda: e.step(torch.ones(1, 1, dtype=torch.long), [2], slots=one), ValueError),
                (lambda: e.rollback(0, slots=one), ValueError),
                (lambda: e.rollback(T + 1, slots=one), ValueError),
                (lambda: e.rollback([1, 1], slots=one), ValueError),
            ]
            one_prompt, lookup = [torch.tensor([1])], [PromptLookupDrafter()]
            bad += [  # speculate_batch(prompts, pending, n_new, drafters) for slot s, k = 2
                (self.speculation(one_prompt, [[VOCAB]], 3, lookup, one), ValueError),
                (
                    self.speculation(one_prompt, [[1]], 3, [FixedDrafter([0, VOCAB])], one),
                    ValueError,
                ),
                (self.speculation(one_prompt * 2, [[1]], 3, lookup, one), ValueError),
                (self.speculation(one_prompt, [[1]], MAX_LEN + 2, lookup, one), ValueError),
                (self.speculation(one_prompt, [[1, 2]], 3, lookup, one), ValueError),
            ]
            if e.last[s] == 0:
                bad.append((lambda: e.rollback(1, slots=one), ValueError))
        free = [x for x in range(SLOTS) if not e.live[x] and x not in e.prefilling]
        if free:
            bad.append((lambda: e.step(torch.ones(1, 1, dtype=torch.long), slots=free), ValueError))
        if self.admission is not None:
            bad.append((lambda: self.admission[0].advance(0), ValueError))
        call, error = bad[data.draw(st.integers(0, len(bad) - 1), label="bad input")]
        before = engine_state(e), tree_state(self.prefix)
        with pytest.raises(error):
            call()
        assert_same(before, (engine_state(e), tree_state(self.prefix)), "a refused call")

    def speculation(self, prompts, pending, n_new, drafters, slots):
        """A call of ``speculate_batch`` with k = 2."""
        pending = torch.tensor(pending)
        return lambda: self.engine.speculate_batch(prompts, pending, n_new, drafters, 2, slots)

    # --- rules -------------------------------------------------------------------------------
    @precondition(lambda self: self.engine.n_free > 0)
    @rule(data=st.data())
    def admit(self, data):
        self.poke(data)
        prompt = self.prompt(data)
        if data.draw(st.booleans(), label="through the prefix cache"):
            slot, logits, hit = self.prefix.admit(prompt)
            assert 0 <= hit.resumed_from <= hit.matched <= len(prompt)
        else:
            slot, logits = self.engine.admit(torch.tensor(prompt, dtype=torch.int32))
        self.went_live(slot, prompt, logits)

    @precondition(lambda self: self.engine.n_free > 0 and self.admission is None)
    @rule(data=st.data())
    def begin_admit(self, data):
        self.poke(data)
        prompt = self.prompt(data)
        if data.draw(st.booleans(), label="interleaved through the prefix cache"):
            adm = self.prefix.begin_admit(prompt)
            assert 0 <= adm.hit.resumed_from <= adm.hit.matched <= len(prompt)
        else:
            adm = self.engine.begin_admit(torch.tensor(prompt))
        self.admission = (adm, prompt)

    @rule(data=st.data())
    def budget(self, data):
        """The tree's byte budget: lifted, one to four blocks, or one or two blocks without
        their logs (``floor_bytes``: the default eviction, lru-fit, then keeps replay's blocks
        without logs), so evictions come (also while a prompt prefills from a node they
        drop)."""
        self.poke(data)
        p = self.prefix
        budget = data.draw(
            st.sampled_from(
                [None, p.floor_bytes, 2 * p.floor_bytes, *(b * p.block_bytes for b in (1, 2, 4))]
            ),
            label="budget in bytes",
        )
        p.set_budget(budget)
        assert budget is None or p.held_bytes <= budget

    @precondition(
        lambda self: (
            self.admission is not None
            and isinstance(self.admission[0], PrefixAdmission)
            and self.admission[0].plan.resumed > 0
        )
    )
    @rule()
    def squeeze_while_prefilling(self):
        """The budget falls to one block without its log while a prompt seated from the tree
        prefills: the nodes it came from (or their logs) may go, and the prompt must still
        come out right."""
        self.prefix.set_budget(self.prefix.floor_bytes)

    @precondition(lambda self: self.admission is not None)
    @rule(data=st.data())
    def advance(self, data):
        self.poke(data)
        adm, prompt = self.admission
        if adm.advance(data.draw(st.integers(1, 5), label="chunk")):
            self.admission = None
            self.went_live(adm.slot, prompt, adm.logits)

    @precondition(lambda self: self.seq)
    @rule(data=st.data())
    def step(self, data):
        self.poke(data)
        e = self.engine
        chosen = [s for s in self.live() if data.draw(st.booleans())] or self.live()[:1]
        T = data.draw(st.integers(1, MAX_VERIFY), label="T")
        room = [min(T, MAX_LEN - e.pos[s], e.room(s)) for s in chosen]
        if min(room) < 1:
            return
        counts = [data.draw(st.integers(1, r), label="count") for r in room]
        rows = [ids(data, T, T) for _ in chosen]
        dtype = data.draw(st.sampled_from([torch.long, torch.int32, torch.uint8]))
        logits = e.step(torch.tensor(rows).to(dtype), counts, slots=chosen)
        for s in self.live():
            self.last[s] = 0
        for i, (s, c) in enumerate(zip(chosen, counts)):
            self.seq[s] += rows[i][:c]
            self.last[s] = c
            self.check_rows(logits[i, :c], self.seq[s])
        if data.draw(st.booleans(), label="roll back at once"):
            self.rollback(data)

    @precondition(lambda self: self.seq)
    @rule(data=st.data())
    def decode(self, data):
        """``step`` again: steps drawn twice as often as each other rule."""
        self.step(data)

    @precondition(lambda self: any(self.last.values()))
    @rule(data=st.data())
    def rollback(self, data):
        self.poke(data)
        slots = [s for s in self.live() if self.last[s]]
        keep = [data.draw(st.integers(1, self.last[s]), label="keep") for s in slots]
        self.engine.rollback(keep, slots=slots)
        for s, k in zip(slots, keep):
            del self.seq[s][len(self.seq[s]) - self.last[s] + k :]
            self.last[s] = k

    @precondition(lambda self: len(self.seq) > 1)
    @rule(data=st.data())
    def retire(self, data):
        self.poke(data)
        slot = data.draw(st.sampled_from(self.live()), label="retire")
        self.engine.retire(slot)
        del self.seq[slot], self.last[slot]

    @precondition(lambda self: self.seq)
    @rule(data=st.data())
    def speculate(self, data):
        """Batched speculation: each returned token after the first is the argmax (up to the
        tolerance) of the prefill's logits at its position."""
        self.poke(data)
        e = self.engine
        slots = [s for s in self.live() if data.draw(st.booleans())] or self.live()[:1]
        k = data.draw(st.integers(1, MAX_VERIFY - 1), label="k")  # PromptLookupDrafter: k >= 1
        n_new = data.draw(st.integers(1, 1 + min(MAX_LEN - e.pos[s] for s in slots)))
        pending = torch.tensor(ids(data, len(slots), len(slots)))
        drafters = [PromptLookupDrafter() for _ in slots]
        prompts = [torch.tensor(self.seq[s]) for s in slots]
        tokens, proposed, accepted = e.speculate_batch(
            prompts, pending[:, None], n_new, drafters, k=k, slots=slots
        )
        for s, out in zip(slots, tokens):
            out = out.tolist()
            assert len(out) == n_new
            held = e.pos[s] - len(self.seq[s])  # tokens the slot took
            want = prefill_logits(self.seq[s] + out[: n_new - 1], self.strategy)
            rows = want[len(self.seq[s]) :]  # the logits after each returned token but the last
            for i in range(1, n_new):
                row = rows[i - 1]
                assert float(row.max() - row[out[i]]) <= TOL, (s, i)
            if held != n_new - 1:  # the last round kept tokens past the n_new returned ones
                assert held > n_new - 1
                e.retire(s)
                del self.seq[s], self.last[s]
                continue
            self.seq[s] += out[: n_new - 1]
        for s in self.live():
            self.last[s] = 0  # rollbacks after a speculation: not modelled
        assert all(0 <= a <= p for a, p in zip(accepted, proposed))

    @invariant()
    def positions(self):
        e = self.engine
        for s in range(SLOTS):
            assert e.live[s] == (s in self.seq)
        for s, tokens in self.seq.items():
            assert e.pos[s] == len(tokens)
            if self.strategy == "replay":
                assert (e.pos[s] - e.log_len[s]) % L == 0 and 0 <= e.log_len[s] <= e.capacity


SETTINGS = settings(
    max_examples=EXAMPLES,
    stateful_step_count=STEPS,
    derandomize=True,
    database=None,
    deadline=None,
    suppress_health_check=list(HealthCheck),
)


def machine(strategy, log_capacity=None, on_the_gpu=False, settings=SETTINGS):
    """The machine's pytest case under ``strategy`` (replay: a ring of ``log_capacity``).
    ``on_the_gpu``: the engine runs a CUDA copy of the model with the GPU's defaults (the
    fused path's kernels and CUDA graphs), against the same CPU oracle."""
    name = f"Engine{strategy.title()}{log_capacity or ''}{'Gpu' * on_the_gpu}Machine"
    fields = {"strategy": strategy, "log_capacity": log_capacity}
    if on_the_gpu:  # use_kernels, graphs and the row-invariant product: the GPU's defaults
        fields.update(model=GPU_MODEL, engine_options={"fused": True})
    cls = type(name, (EngineMachine,), fields)
    cls.TestCase.settings = settings
    if on_the_gpu:
        return pytest.mark.skipif(GPU_MODEL is None, reason="needs a CUDA device")(cls.TestCase)
    return cls.TestCase


GPU_MODEL = copy.deepcopy(MODEL).cuda() if torch.cuda.is_available() else None
GPU_SETTINGS = settings(SETTINGS, max_examples=4)  # each example captures its graphs anew

TestSnapshot, TestRecompute, TestReplay = (machine(s) for s in STRATEGIES)
TestReplayPastTheFoldGrid = machine("replay", L + MAX_VERIFY - 1)  # a step may pass a fold
# issue 38: zero mismatches on the GPU's fast path too (hits, evictions, interleaved prefill,
# speculation)
TestSnapshotGpu, TestRecomputeGpu, TestReplayGpu = (
    machine(s, on_the_gpu=True, settings=GPU_SETTINGS) for s in STRATEGIES
)
