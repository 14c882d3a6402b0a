"""Device operations a cold admission launches, counted on CPU: the serving engine's prefill is
host-bound on the GPU (``data/prefill_profile.json``: the device busy 23-26 ms of a 98-155 ms
admission, some 2,900 operations launched one by one), so the operations it launches set its
host time. Counted here: every PyTorch operation but views and allocations (a
``TorchDispatchMode``; allocations, which launch nothing, are counted apart), every Triton
kernel launch (the interpreter's ``run``), and torch's attention with a lower-right causal bias
as one launch (what flash attention is on a GPU in 16 bits; on CPU torch materialises the
mask; the bias is patched where ``serving.prefill`` imports it at each call), for one
admission of a T-token prompt after a warm-up, per strategy and prefill arm:

- ``default``: the teaching modules, the spec's chunked scan in PyTorch (``prefill_kernels=False``,
  the default until 2026-12-05, and on CPU still);
- ``triton scan``: ``DecodeEngine(prefill_kernels=True)``, the Mamba-2 scan in one launch;
- ``fused kernels``: the same on the fused path, whose chunks also run the fused decode's
  norm and MLP kernels.

The model has ``8b-layers``' block layout ("M-M*-M-") at small widths (the operations do not
depend on the widths); the engine is the TTFT bench's (L = 16, chunks of 256, no graphs) with
``use_kernels=True`` as on a GPU (replay folds through its Triton kernel there).

    python tools/prefill_launch_count.py OUT.json [--tokens 2048]
    python tools/prefill_launch_count.py OUT.json --hit 2000,48 [--resume match] [--sites]

``--hit S,N``: instead, one prefix hit on the fused path with the prompt kernels (the TTFT
bench's engine): a shared prompt of S tokens admitted and retired through an
``EnginePrefixCache`` (block 512), one warm-up hit, then a counted hit of those S tokens and N
new ones (the tree's match, its seat, the prefill of the rest and the insertion of its blocks),
per strategy (replay under ``--resume``); with ``--sites`` each launch also counted by the
innermost line of replaylab that made it (allocations left out).
"""

from __future__ import annotations

import argparse
import collections
import traceback

import torch
from torch.utils._python_dispatch import TorchDispatchMode

import replaylab  # noqa: F401 (sets TRITON_INTERPRET on a machine without a GPU)
from replaylab.bench.provenance import write_tool_result
from replaylab.model import PRESETS, HybridConfig, HybridLM
from replaylab.serving import DecodeEngine

VIEWS = {"view", "_unsafe_view", "unsqueeze", "squeeze", "permute", "select", "slice", "t",
         "expand", "transpose", "alias", "split", "split_with_sizes", "unflatten", "detach",
         "as_strided", "reshape", "unbind", "chunk", "narrow", "view_as", "lift_fresh"}  # fmt: skip
ALLOCATIONS = {"empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided"}
ARMS = {"default": dict(prefill_kernels=False), "triton scan": dict(prefill_kernels=True),
        "fused kernels": dict(prefill_kernels=True, fused=True)}  # fmt: skip


class _Launches(TorchDispatchMode):
    """Counts non-view aten operations; Triton launches are counted by ``_count_triton``.
    ``sites``: also count each launch by the innermost line of replaylab that made it."""

    def __init__(self, sites=False):
        super().__init__()
        self.ops = collections.Counter()
        self.sites = collections.Counter() if sites else None
        self.inside_kernel = 0  # the interpreter's own tensor work is the kernel, not launches

    def count(self, name):
        self.ops[name] += 1
        if self.sites is not None and name not in ALLOCATIONS:
            ours = [f for f in traceback.extract_stack() if "/replaylab/" in f.filename]
            where = (
                f"{ours[-1].filename.rsplit('/replaylab/', 1)[-1]}:{ours[-1].lineno}"
                if ours
                else "?"
            )
            self.sites[f"{where} {name}"] += 1

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.overloadpacket.__name__
        if name not in VIEWS and not self.inside_kernel:
            self.count(name)
        return func(*args, **(kwargs or {}))


def _count_triton(mode):
    from triton.runtime.interpreter import InterpretedFunction

    run = InterpretedFunction.run

    def counted(self, *args, **kwargs):
        if not kwargs.get("warmup") and not mode.inside_kernel:
            mode.count(f"triton:{self.fn.__name__}")
        mode.inside_kernel += 1
        try:
            return run(self, *args, **kwargs)
        finally:
            mode.inside_kernel -= 1

    InterpretedFunction.run = counted
    return lambda: setattr(InterpretedFunction, "run", run)


def _count_lower_right_attention(mode):
    """torch's attention with a lower-right causal bias (``serving.prefill`` under
    ``prefill_kernels``) counted as one launch, as flash attention runs it on a GPU: the bias
    is a tensor subclass, which cannot be made under a dispatch mode, so it and the attention
    run with the mode set aside (on CPU the attention materialises the mask instead)."""
    from torch.nn.attention import bias
    from torch.utils._python_dispatch import _disable_current_modes

    make, dispatch = bias.causal_lower_right, bias.CausalBias._dispatch

    def made(*size):
        with _disable_current_modes():
            return make(*size)

    def dispatched(*args, **kwargs):
        if not mode.inside_kernel:
            mode.count("scaled_dot_product_attention (lower-right causal)")
        with _disable_current_modes():
            return dispatch(*args, **kwargs)

    bias.causal_lower_right, bias.CausalBias._dispatch = made, staticmethod(dispatched)

    def restore():
        bias.causal_lower_right, bias.CausalBias._dispatch = make, staticmethod(dispatch)

    return restore


def _counting(mode):
    """Install the launch counters beside ``mode``; returns the function that removes them."""
    undo = [_count_triton(mode), _count_lower_right_attention(mode)]
    return lambda: [u() for u in undo]


def count(model, strategy, arm, prompt):
    kw = dict(log_length=16, max_verify=1, prefill_chunk=256, use_kernels=True, graphs=False)
    kw.update({"fused": False, **ARMS[arm]})
    engine = DecodeEngine(model, 1, prompt.numel() + 1, strategy, **kw)
    with torch.no_grad():
        engine.retire(engine.admit(prompt)[0])  # warm-up
        mode = _Launches()
        restore = _counting(mode)
        try:
            with mode:
                engine.retire(engine.admit(prompt)[0])
        finally:
            restore()
    return mode.ops


def count_hit(model, strategy, shared, suffix, resume="match", sites=False):
    """The operations of one prefix hit (see the module docstring), the hit's report and,
    with ``sites``, the launches by the line of replaylab that made them (else None)."""
    from replaylab.serving import EnginePrefixCache

    gen = torch.Generator().manual_seed(1)
    vocab = model.cfg.vocab_size
    head = torch.randint(0, vocab, (shared,), generator=gen).tolist()
    prompts = [head + torch.randint(0, vocab, (suffix,), generator=gen).tolist() for _ in range(2)]
    engine = DecodeEngine(model, 2, shared + suffix + 1, strategy, log_length=16, max_verify=1,
                          prefill_chunk=256, use_kernels=True, graphs=False, fused=True,
                          prefill_kernels=True)  # fmt: skip
    with torch.no_grad():
        cache = EnginePrefixCache(engine, block_size=512,
                                  resume=resume if strategy == "replay" else "match")  # fmt: skip
        engine.retire(cache.admit(head)[0])
        engine.retire(cache.admit(prompts[0])[0])  # warm-up
        mode = _Launches(sites)
        restore = _counting(mode)
        try:
            with mode:
                slot, _, hit = cache.admit(prompts[1])
        finally:
            restore()
    return mode.ops, hit, mode.sites


def layouts(families):
    """name -> (HybridConfig at small widths, the arms that apply)."""
    small = dict(hidden_size=256, attn_heads=4, kv_heads=2, head_dim=64, intermediate_size=512,
                 vocab_size=1000)  # fmt: skip
    mamba2 = dict(ssm_heads=8, ssm_head_dim=32, d_state=32, n_groups=2)
    out = {"8b-layers": (HybridConfig(**{**PRESETS["8b-layers"], **small, **mamba2}), tuple(ARMS))}
    if families:
        from replaylab.gated_deltanet import GDNConfig
        from replaylab.mamba1 import Mamba1Config

        gdn = GDNConfig(k_heads=2, v_heads=4, k_head_dim=16, v_head_dim=16, d_conv=4)
        out["qwen3.5-9b-layers"] = (
            HybridConfig(
                pattern="G-G-G-*-", gdn=gdn, attention="gated", rotary_dim=16, mlp="swiglu", **small
            ),  # fmt: skip
            ("default", "triton scan"),
        )
        s6 = Mamba1Config(d_inner=64, d_state=16, d_conv=4, dt_rank=8)
        out["jamba-1.5-mini-layers"] = (
            HybridConfig(pattern="S-S-S-*-", mamba1=s6, mlp="swiglu", **small),
            ("default", "triton scan"),
        )
    return out


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("out")
    p.add_argument("--tokens", type=int, default=2048)
    p.add_argument("--families", action="store_true", help="the Qwen3.5 and Jamba layouts too")
    p.add_argument("--hit", default=None, help="S,N: one prefix hit of S shared + N new tokens")
    p.add_argument("--resume", default="match", choices=("match", "chunk"))
    p.add_argument("--sites", action="store_true", help="--hit: launches by replaylab's line")
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    rows = []
    if args.hit:
        shared, suffix = (int(v) for v in args.hit.split(","))
        cfg = layouts(False)["8b-layers"][0]
        model = HybridLM(cfg, seed=0).eval()
        for strategy in ("snapshot", "replay"):
            ops, hit, sites = count_hit(model, strategy, shared, suffix, args.resume, args.sites)
            triton_n = sum(v for k, v in ops.items() if k.startswith("triton:"))
            allocs = sum(ops.pop(k, 0) for k in ALLOCATIONS)
            rows.append(dict(layout="8b-layers", strategy=strategy, shared=shared, suffix=suffix,
                             resume=args.resume if strategy == "replay" else "match",
                             resumed_from=hit.resumed_from, computed=hit.computed,
                             launches=sum(ops.values()), triton_launches=triton_n,
                             allocations=allocs, top=dict(ops.most_common(12))))  # fmt: skip
            if sites is not None:
                rows[-1]["sites"] = dict(sorted(sites.items()))
            print(f"hit {strategy:8s} resumed at {hit.resumed_from}, {hit.computed} computed: "
                  f"{sum(ops.values())} launches ({triton_n} Triton), {allocs} allocations")  # fmt: skip
        write_tool_result(args.out, "prefill_launch_count.py", rows)
        return
    for name, (cfg, arms) in layouts(args.families).items():
        model = HybridLM(cfg, seed=0).eval()
        gen = torch.Generator().manual_seed(0)
        prompt = torch.randint(0, cfg.vocab_size, (args.tokens,), generator=gen)
        for strategy in ("snapshot", "replay"):
            for arm in arms:
                ops = count(model, strategy, arm, prompt)
                triton_n = sum(v for k, v in ops.items() if k.startswith("triton:"))
                allocs = sum(ops.pop(k, 0) for k in ALLOCATIONS)
                rows.append(dict(layout=name, strategy=strategy, arm=arm, tokens=args.tokens,
                                 pattern=cfg.pattern, launches=sum(ops.values()),
                                 triton_launches=triton_n, allocations=allocs,
                                 top=dict(ops.most_common(12))))  # fmt: skip
                print(f"{name:22s} {strategy:8s} {arm:13s} {sum(ops.values()):6d} launches "
                      f"({triton_n} Triton), {allocs} allocations", flush=True)  # fmt: skip
    write_tool_result(args.out, "prefill_launch_count.py", rows)


if __name__ == "__main__":
    main()
