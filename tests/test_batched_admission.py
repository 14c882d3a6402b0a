"""``DecodeEngine(batched_admission=True)``: ``admit_many`` prefills several prompts in one pass
(``serving.prefill.prefill_many``) and a prompt's bits do not depend on the prompts beside it:
its logits, its slot's pools and the steps after equal those of the prompt admitted alone,
bit for bit, under every strategy and on both paths; bad input is refused before any slot
changes; a scheduler with it serves each request its greedy tokens."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from replaylab.decoding import SyntheticDrafter, greedy
from replaylab.serving import STRATEGIES, DecodeEngine, Request, Scheduler
from replaylab.testing import tiny_hybrid

# the fused path's kernels on CPU tensors run through Triton's interpreter, which is off on a
# GPU machine (its GPU test below runs the fused path there)
interpreted = pytest.mark.skipif(
    os.environ.get("TRITON_INTERPRET") != "1", reason="Triton's interpreter is off (a GPU machine)"
)
MODEL = tiny_hybrid()
VOCAB = MODEL.cfg.vocab_size
GEN = torch.Generator().manual_seed(3)
PROMPTS = [torch.randint(0, VOCAB, (n,), generator=GEN) for n in (5, 9, 3, 12)]


@pytest.fixture(autouse=True)
def one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _buffers(engine):
    """Every pool tensor of the engine (recurrent and KV), by name."""
    out = {}
    for kind, pools in (("ssm", engine.ssm), ("kv", engine.kv)):
        for layer, pool in pools.items():
            for name, value in vars(pool).items():
                if torch.is_tensor(value):
                    out[kind, layer, name] = value
            if kind == "ssm":
                for name, value in pool.log.items():
                    out[kind, layer, "log", name] = value
    return out


def _engine(strategy, fused, **kw):
    paths = dict(fused=True, use_kernels=True, prefill_kernels=True) if fused else {}
    return DecodeEngine(MODEL, 4, 40, strategy, 4, batched_admission=True, **paths, **kw)


@pytest.mark.parametrize(
    "strategy, fused",
    [(s, False) for s in STRATEGIES]
    + [pytest.param(s, True, marks=interpreted) for s in ("replay", "snapshot")],
)
def test_prompts_admitted_together_equal_each_admitted_alone_bit_for_bit(strategy, fused):
    together, alone = _engine(strategy, fused), _engine(strategy, fused)
    got = together.admit_many(PROMPTS)
    want = [alone.admit(p) for p in PROMPTS]
    assert [s for s, _ in got] == [s for s, _ in want] == [0, 1, 2, 3]
    for (_, a), (_, b) in zip(got, want):
        assert torch.equal(a, b)
    mine, theirs = _buffers(together), _buffers(alone)
    assert mine.keys() == theirs.keys() and len(mine) > 4
    for name in mine:
        assert torch.equal(mine[name], theirs[name]), name
    tokens = torch.tensor([[int(logits.argmax())] for _, logits in got])
    assert torch.equal(together.step(tokens), alone.step(tokens))
    # the row-invariant products round as torch's to float32 rounding, not to the bit
    plain = DecodeEngine(MODEL, 4, 40, strategy, 4)
    for (_, a), p in zip(got, PROMPTS):
        ref = plain.admit(p)[1]
        assert torch.allclose(a, ref, rtol=1e-5, atol=1e-5)


def test_a_cpu_engine_admits_together_where_triton_cannot_launch():
    """On a GPU machine the interpreter is off: a CPU engine's row-invariant products and sums
    go row by row through torch (a launch on CPU tensors would raise), and a prompt admitted
    together still equals the prompt alone, bit for bit."""
    code = (
        "import torch; from replaylab.serving import DecodeEngine; "
        "from replaylab.testing import tiny_hybrid; m = tiny_hybrid(); torch.set_num_threads(1); "
        "g = torch.Generator().manual_seed(3); "
        "ps = [torch.randint(0, m.cfg.vocab_size, (n,), generator=g) for n in (5, 9, 3)]; "
        "e = [DecodeEngine(m, 3, 40, 'replay', 4, batched_admission=True) for _ in 'ab']; "
        "got = e[0].admit_many(ps); want = [e[1].admit(p) for p in ps]; "
        "print(all(torch.equal(a, b) for (_, a), (_, b) in zip(got, want)))"
    )
    env = dict(os.environ, TRITON_INTERPRET="0", CUDA_VISIBLE_DEVICES="")
    root = Path(__file__).resolve().parents[1]
    out = subprocess.run([sys.executable, "-c", code], env=env, cwd=root, capture_output=True,
                         text=True, timeout=300)  # fmt: skip
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "True"


def test_a_prompt_longer_than_a_chunk_is_prefilled_alone_beside_the_others():
    together = DecodeEngine(MODEL, 4, 40, "replay", 4, prefill_chunk=6, batched_admission=True)
    alone = DecodeEngine(MODEL, 4, 40, "replay", 4, prefill_chunk=6, batched_admission=True)
    got = together.admit_many(PROMPTS)  # 9 and 12 tokens: two chunks of 6 or more, alone
    want = [alone.admit(p) for p in PROMPTS]
    assert all(torch.equal(a, b) for (_, a), (_, b) in zip(got, want))
    assert together.slots == [0, 1, 2, 3] and together.pos[:4] == [5, 9, 3, 12]


def test_bad_input_is_refused_before_any_slot_changes():
    engine = DecodeEngine(MODEL, 4, 40, "replay", 4, batched_admission=True)
    engine.admit(PROMPTS[0])
    before = {k: v.clone() for k, v in _buffers(engine).items()}
    with pytest.raises(ValueError, match="expected a non-empty list of prompts"):
        engine.admit_many([])
    with pytest.raises(ValueError, match="expected a non-empty list of prompts"):
        engine.admit_many(PROMPTS[1])
    with pytest.raises(ValueError, match=r"4 prompts, 3 free slots \(max_batch=4, 1 live"):
        engine.admit_many(PROMPTS)
    with pytest.raises(ValueError, match=r"prompts\[1\]: token id 50 .* outside the vocabulary"):
        engine.admit_many([PROMPTS[1], torch.tensor([1, VOCAB])])
    with pytest.raises(ValueError, match=r"prompts\[0\]: length 40: expected 1 <= length"):
        engine.admit_many([torch.zeros(40, dtype=torch.long)])
    assert engine.slots == [0] and engine.n_free == 3
    for name, value in _buffers(engine).items():
        assert torch.equal(value, before[name]), name
    with pytest.raises(ValueError, match="batched_admission: expected True or False, got 1"):
        DecodeEngine(MODEL, 4, 40, "replay", 4, batched_admission=1)


def test_without_the_switch_admit_many_admits_each_as_admit_does():
    many = DecodeEngine(MODEL, 4, 40, "replay", 4)
    one = DecodeEngine(MODEL, 4, 40, "replay", 4)
    got = many.admit_many(PROMPTS)
    assert all(torch.equal(a, one.admit(p)[1]) for (_, a), p in zip(got, PROMPTS))


@pytest.mark.parametrize("strategy", STRATEGIES)
@pytest.mark.parametrize("speculate", [False, True])
def test_a_scheduler_admitting_together_serves_each_request_its_greedy_tokens(strategy, speculate):
    n_new = [6, 3, 8, 5, 4, 7]
    prompts = PROMPTS + PROMPTS[:2]
    alone = [greedy(MODEL, p[None], n, "snapshot").tokens[0] for p, n in zip(prompts, n_new)]
    engine = DecodeEngine(MODEL, 4, 40, strategy, 4, max_verify=4, batched_admission=True)
    requests = [
        Request(i, p, n, arrival=0.0,
                drafter=SyntheticDrafter(torch.cat([p, alone[i]]), 0.6, seed=i) if speculate else None)
        for i, (p, n) in enumerate(zip(prompts, n_new))
    ]  # fmt: skip
    sched, seated = Scheduler(engine, k=3 if speculate else 0), []
    admit_many = engine.admit_many
    engine.admit_many = lambda prompts: seated.append(len(prompts)) or admit_many(prompts)
    done = sched.run(requests)
    assert sorted(r.id for r in done) == list(range(len(prompts)))
    for r in done:
        assert torch.equal(torch.tensor(r.tokens), alone[r.id]), r.id
    assert seated[0] == 4  # the first four in one prefill; a lone one goes through admit
    assert [len(h.admitted) for h in sched.history if len(h.admitted) > 1] == seated


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the GPU's fused path and kernels")
def test_on_a_gpu_prompts_admitted_together_equal_each_alone_and_a_float64_reference():
    """bf16 on the engine's GPU defaults (fused path, prompt kernels, CUDA graphs): together
    equals alone bit for bit; each prompt's last logits against the float64 model's."""
    model = tiny_hybrid().to("cuda", torch.bfloat16)
    reference = tiny_hybrid().double()
    engines = [DecodeEngine(model, 4, 40, "replay", 4, batched_admission=True) for _ in "ab"]
    got = engines[0].admit_many([p.cuda() for p in PROMPTS])
    want = [engines[1].admit(p.cuda()) for p in PROMPTS]
    for (_, a), (_, b), p in zip(got, want, PROMPTS):
        assert torch.equal(a, b)
        with torch.no_grad():
            exact = reference(p[None], None)[0, -1]  # the whole prompt, no cache
        scale = exact.abs().max()
        assert (a.double().cpu() - exact).abs().max() / scale < 3e-2


@pytest.mark.parametrize("preset", ["tiny-gdn", "tiny-mamba1", "tiny-bamba"])
def test_every_family_admitted_together_equals_alone(preset):
    """Gated DeltaNet with gated attention, Mamba-1, and Mamba-2 with RoPE attention (Bamba):
    nothing in their layers mixes the concatenated prompts' tokens outside the pools."""
    from replaylab.bench.families import load_preset
    from replaylab.model import HybridLM

    model = HybridLM(load_preset(preset)[1], seed=0).eval()
    gen = torch.Generator().manual_seed(4)
    prompts = [torch.randint(0, model.cfg.vocab_size, (n,), generator=gen) for n in (7, 4, 11)]
    engines = [DecodeEngine(model, 3, 40, "replay", 4, batched_admission=True) for _ in "ab"]
    got = engines[0].admit_many(prompts)
    want = [engines[1].admit(p) for p in prompts]
    for (_, a), (_, b) in zip(got, want):
        assert torch.equal(a, b)
    mine, theirs = _buffers(engines[0]), _buffers(engines[1])
    assert all(torch.equal(mine[name], theirs[name]) for name in mine)


@pytest.mark.parametrize("batched", [False, True])
def test_an_admission_that_fails_loses_no_request_and_holds_no_bytes(batched):
    """The engine's prefill raises at the third admission of an iteration (one by one) or at
    the iteration's one ``admit_many``: the requests it had not seated are back at the head
    of the queue, in order, with their bytes released; those seated before keep running; the
    next run serves every request its greedy tokens."""
    n_new = [4, 3, 5, 2]
    alone = [greedy(MODEL, p[None], n, "snapshot").tokens[0] for p, n in zip(PROMPTS, n_new)]
    engine = DecodeEngine(MODEL, 4, 40, "replay", 4, batched_admission=batched)
    sched = Scheduler(engine)
    calls = {"n": 0}
    admit, admit_many = engine.admit, engine.admit_many

    def failing(*args):
        calls["n"] += 1
        if calls["n"] == (1 if batched else 3):
            raise RuntimeError("out of memory (simulated)")
        return (admit_many if batched else admit)(*args)

    setattr(engine, "admit_many" if batched else "admit", failing)
    requests = [Request(i, p, n, arrival=0.0) for i, (p, n) in enumerate(zip(PROMPTS, n_new))]
    with pytest.raises(RuntimeError, match="simulated"):
        sched.run(requests)
    seated = [] if batched else [0, 1]
    assert [r.id for r in sched.waiting] == [i for i in range(4) if i not in seated]
    assert [r.id for r in sched.running] == seated and engine.slots == seated
    assert sched.used == sum(requests[i].reserved for i in seated)
    assert all(r.admitted_at is None and r.slot is None for r in sched.waiting)
    done = sched.run()
    assert sorted(r.id for r in done) == [0, 1, 2, 3]
    for r in done:
        assert torch.equal(torch.tensor(r.tokens), alone[r.id]), r.id
    assert sched.used == 0
