"""The engine's prefill with the prompt-scan kernels (``DecodeEngine(prefill_kernels=True)``)
against its default prefill (``prefill_kernels=False``), shared by the three kernels' tests.

The prompt is longer than a prefill chunk, so the kernel resumes from its own state; after the
admission every buffer of every recurrent pool (state, conv window, the strategy's checkpoints,
replay's log) and the logits must agree to fp32 rounding, relative to their scale; then two
decode steps and a prefix-cache hit that resumes inside the prompt."""

import torch

from replaylab import assert_close
from replaylab.serving import DecodeEngine, EnginePrefixCache

STRATEGIES = ("snapshot", "recompute", "replay")


def pool_buffers(engine, slot):
    """name -> the slot's row of each tensor a recurrent pool keeps (its log fields too)."""
    rows = {}
    for layer, pool in engine.ssm.items():
        tensors = {k: v for k, v in vars(pool).items() if torch.is_tensor(v)}
        tensors.update({f"log.{k}": v for k, v in pool.log.items()})
        slots = pool.state.shape[0]
        for name, t in tensors.items():
            if t.dim() and t.shape[0] == slots:  # per-slot buffers (not conv weights)
                rows[f"layer {layer} {name}"] = t[slot].double()
    return rows


def _close(got, want, what):
    scale = max(float(want.abs().max()), 1e-6)
    assert_close(got, want, atol=2e-5 * scale, rtol=1e-4, name=what)


def check_prefill_kernels(model, prompt, resume_at, block, *, family, fused=False, seed=0):
    """For each strategy, ``prefill_kernels=True`` against ``False`` on ``model``: the pools of
    ``family`` report the kernel; buffers and logits agree after a ``prompt`` of token ids
    (1-D, on the model's device) admitted in chunks of a third of it, after two steps, and
    after a prefix hit of ``prompt[:resume_at]`` plus a fresh suffix (cache ``block``), which
    replay resumes at ``resume_at`` and the others at its last block boundary."""
    vocab, device = model.cfg.vocab_size, prompt.device
    gen = torch.Generator().manual_seed(seed)
    steps = torch.randint(0, vocab, (2, 1, 1), generator=gen).to(device)
    suffix = torch.randint(0, vocab, (7,), generator=gen).to(device)
    other = torch.cat([prompt[:resume_at], suffix])
    chunk = -(-len(prompt) // 3)
    with torch.no_grad():
        for strategy in STRATEGIES:
            kw = dict(log_length=8, max_verify=2, use_kernels=True, graphs=False, fused=fused)
            outputs, buffers = {}, {}
            for on in (True, False):
                engine = DecodeEngine(model, 1, len(prompt) + 32, strategy, prefill_chunk=chunk,
                                      prefill_kernels=on, **kw)  # fmt: skip
                pools = [p for p in engine.ssm.values() if p.spec.family == family]
                assert pools and all(p.prompt_kernel == on for p in pools)
                slot, logits = engine.admit(prompt)
                buffers[on] = pool_buffers(engine, slot)
                outputs[on] = [logits] + [engine.step(t)[0, -1] for t in steps]
                engine.retire(slot)
                prefix = EnginePrefixCache(engine, block_size=block)
                prefix.engine.retire(prefix.admit(prompt.tolist())[0])
                slot, logits, hit = prefix.admit(other.tolist())
                want_resume = resume_at if strategy == "replay" else resume_at // block * block
                assert hit.resumed_from == want_resume, (strategy, hit)
                outputs[on].append(logits)
                buffers[on].update({f"hit {k}": v for k, v in pool_buffers(engine, slot).items()})
            assert buffers[True] and buffers[True].keys() == buffers[False].keys()
            for name in buffers[True]:
                _close(buffers[True][name], buffers[False][name], f"{strategy} {name}")
            for i, (a, b) in enumerate(zip(outputs[True], outputs[False])):
                _close(a.double(), b.double(), f"{strategy} logits {i}")
