"""A fast decode path beside the teaching cache: preallocated pools indexed by slot, and decode
and verify steps that can be captured in CUDA graphs.

The teaching ``HybridCache`` grows dictionaries, gathers KV segments and runs the model through
Python on every token; that is what the notebooks read. ``DecodeEngine`` runs the same model
(``HybridLM``, NemotronH layout) over fixed buffers so a step is one graph replay on a GPU:

    pools, per Mamba-2 layer (rows are slots; the batch is slots 0 .. B-1):
        state      (slots, H, P, N) fp32      snapshot: the current state; replay: the checkpoint
        conv       (slots, d_conv-1, conv_dim) the current conv window (both strategies)
        log_*      (slots, L + T_max, ...)    replay: x, dt, B, C since the checkpoint (and xBC,
                                              the conv inputs, on the unfused path)
        draft_*    (slots, T_max, ...)        snapshot: the state and window after each verified
                                              token, for rollback (the per-draft-snapshot path)
    per attention layer:
        k, v       (slots, Hkv, max_len, Dh)  a static KV buffer; the mask hides unused rows

Strategies: "snapshot" (the state is read and written every token; a verify keeps a copy per
token) and "replay" (outputs from checkpoint + log with ``replay_step``, no state write; the
log is folded into the checkpoint before it would exceed ``log_length``). On CPU (graphs off)
the engine runs the same reference operations as the teaching cache, so the two give the same
tokens. On a GPU it runs fused: ``replaylab.kernels.decode`` folds each group of element-wise
operations into one kernel (residual add + RMSNorm, conv + SiLU + split, gated RMSNorm,
relu^2, snapshot's state update, attention over the static KV buffer), replay's
``replay_step`` appends to the log itself; a step at small batch is then a few dozen kernels
instead of a few hundred. The fused kernels round differently from the teaching model's
operations (another summation order), so on a GPU the two paths agree to rounding and their
greedy tokens part only where two logits nearly tie. Within the engine, every fused kernel
computes a row of a (k+1)-token verify exactly as a single-token step would (replay's step
included); what can still round differently is the matrix products over B*T rows (cuBLAS may
pick another reduction order for another row count) and, under replay, the fold, which a
verify may trigger earlier than single steps would. Speculative decoding therefore returns the
engine's greedy tokens up to such near-ties (``replaylab bench engine`` records both).

Glossary: B batch (active slots), T tokens per step (1 decode, k + 1 verify), L log length.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from replaylab.cache import HybridCache
from replaylab.recurrent import windows_per_token
from replaylab.validation import as_int, check_token_ids

__all__ = ["DecodeEngine", "EngineStats", "measured_log_length"]

STRATEGIES = ("snapshot", "replay")


def measured_log_length(batch, path="data/bench_kernels.json", default=16):
    """Replay's L with the lowest measured amortised decode cost, step + fold(L)/L, at the
    benchmarked batch nearest to ``batch`` (``replaylab.bench.kernels.amortised_decode`` over
    a committed GPU run); ``default`` when no such file can be read."""
    from replaylab.bench.kernels import amortised_decode
    from replaylab.results import load_bench

    try:
        rows = amortised_decode(load_bench(path))
    except (OSError, KeyError, ValueError):
        return default
    if not rows:
        return default
    nearest = min({r["batch"] for r in rows}, key=lambda b: (abs(b - batch), b))
    return min((r for r in rows if r["batch"] == nearest), key=lambda r: r["amortised_us"])["L"]


@dataclass
class EngineStats:
    steps: int = 0
    verify_steps: int = 0
    folds: int = 0
    folded_tokens: int = 0
    rollbacks: int = 0
    graph_replays: int = 0


class _MambaPool:
    """Preallocated memory of one Mamba-2 layer, and its scan parameters processed once
    (A = -exp(A_log), D, dt_bias in fp32: the engine serves frozen weights)."""

    def __init__(self, mixer, slots, strategy, log_capacity, max_verify, dtype, device, fused):
        c = mixer.cfg
        self.mixer, self.spec = mixer, mixer.state_spec
        K, C = self.spec.conv_shape
        H, P, N, G = c.ssm_heads, c.ssm_head_dim, c.d_state, c.n_groups
        zeros = lambda *shape, dt=dtype: torch.zeros(shape, dtype=dt, device=device)  # noqa: E731
        p = self.spec.params()
        self.A, self.D = p.A.detach().float(), p.D.detach().float()
        self.dt_bias, self.dt_limit = p.dt_bias.detach().float(), p.dt_limit
        self.conv_weight = mixer.conv1d.weight.detach().view(C, -1)
        self.conv_bias = None if mixer.conv1d.bias is None else mixer.conv1d.bias.detach()
        self.state = zeros(slots, H, P, N, dt=torch.float32)
        self.conv = zeros(slots, K, C)
        if strategy == "replay":
            Lc = log_capacity
            self.log = dict(
                x=zeros(slots, Lc, H, P),
                dt=zeros(slots, Lc, H),
                B=zeros(slots, Lc, G, N),
                C=zeros(slots, Lc, G, N),
            )
            if not fused:  # the reference path keeps the conv inputs as the teaching log does
                self.log["xBC"] = zeros(slots, Lc, C)
        else:
            self.draft_state = zeros(slots, max_verify, H, P, N, dt=torch.float32)
        self.draft_conv = zeros(slots, max_verify, K, C)  # windows after each verified token


class _KVPool:
    def __init__(self, cfg, slots, max_len, dtype, device):
        shape = (slots, cfg.kv_heads, max_len, cfg.head_dim)
        self.k = torch.zeros(shape, dtype=dtype, device=device)
        self.v = torch.zeros(shape, dtype=dtype, device=device)


class DecodeEngine:
    """Decode and verify for up to ``max_batch`` sequences of at most ``max_len`` tokens.

    model: a ``HybridLM`` without RoPE (NemotronH layout). strategy: "snapshot" or "replay".
    log_length: replay's L, or "auto": the L of lowest measured amortised decode cost at this
    batch (``measured_log_length``). max_verify: the most tokens one step may take (k + 1).
    use_kernels: replay through the Triton kernels (default: on a GPU). graphs: capture each
    (batch, T) step in a CUDA graph (default: on a GPU). fused: the fused decode kernels of
    ``replaylab.kernels.decode`` (default: on a GPU; on CPU they run through Triton's
    interpreter, for the tests).

    >>> engine = DecodeEngine(model, max_batch=4, max_len=256)         # doctest: +SKIP
    >>> logits = engine.prefill(prompts)   # (B, T0) -> last logits (B, vocab)
    >>> logits = engine.step(tokens)       # (B, T)  -> (B, T, vocab)
    >>> engine.rollback(keep)              # keep the first `keep` tokens of the last step
    """

    def __init__(
        self,
        model,
        max_batch,
        max_len,
        strategy="replay",
        log_length=16,
        max_verify=5,
        use_kernels=None,
        graphs=None,
        fused=None,
    ):
        if strategy not in STRATEGIES:
            raise ValueError(f"strategy: expected one of {STRATEGIES}, got {strategy!r}")
        cfg = model.cfg
        if cfg.rotary_dim:
            raise ValueError(
                "DecodeEngine: models with RoPE (Bamba) are not supported yet; use "
                "the teaching HybridCache"
            )
        self.max_batch = as_int("max_batch", max_batch, low=1)
        self.max_len = as_int("max_len", max_len, low=2)
        if log_length == "auto":
            log_length = measured_log_length(self.max_batch)
        self.L = as_int("log_length", log_length, low=1)
        self.max_verify = as_int("max_verify", max_verify, low=1)
        param = next(model.parameters())
        self.model, self.cfg, self.strategy = model, cfg, strategy
        self.dtype, self.device = param.dtype, param.device
        cuda = self.device.type == "cuda"
        self.use_kernels = cuda if use_kernels is None else use_kernels
        self.graphs = cuda if graphs is None else graphs
        self.fused = (cuda and self.use_kernels) if fused is None else fused
        if self.graphs and not cuda:
            raise ValueError("graphs: CUDA graphs need a CUDA device")
        if self.fused and not self.use_kernels:
            raise ValueError("fused: the fused path runs the replay kernels; use_kernels=True")
        unsupported = set(cfg.pattern) - set("M*-")
        if unsupported or cfg.mlp != "relu2":
            raise ValueError(
                f"DecodeEngine: NemotronH layouts only (Mamba-2 'M', attention '*', relu2 MLP "
                f"'-'); got pattern {cfg.pattern!r}, mlp {cfg.mlp!r}"
            )
        slots = self.max_batch
        self.ssm = {
            l: _MambaPool(
                model.model.layers[l].mixer,
                slots,
                strategy,
                self.L + self.max_verify,
                self.max_verify,
                self.dtype,
                self.device,
                self.fused,
            )
            for l in cfg.ssm_layers
        }
        self._qkv_weight = {  # fused: one matrix product for q, k and v
            l: torch.cat(
                [getattr(model.model.layers[l].mixer, f"{n}_proj").weight for n in "qkv"]
            ).detach()
            for l in (cfg.attn_layers if self.fused else ())
        }
        self.kv = {
            l: _KVPool(cfg, slots, max_len, self.dtype, self.device) for l in cfg.attn_layers
        }
        self.batch = 0  # active slots 0 .. batch-1
        self.position = 0  # tokens held per sequence (the same for every slot)
        self.log_len = 0  # replay: entries in every slot's log
        self.last_T = 0  # tokens of the last step (what rollback may drop)
        self._pos = torch.zeros((), dtype=torch.long, device=self.device)
        self._log_len = torch.zeros(slots, dtype=torch.int32, device=self.device)
        self._rows = torch.arange(slots, dtype=torch.int32, device=self.device)
        self._steps = torch.arange(self.max_verify, device=self.device)
        self._graphs = {}  # (B, T) -> (graph, static tokens, static logits)
        self.stats = EngineStats()

    # --- filling slots -------------------------------------------------------------------
    @torch.no_grad()
    def prefill(self, prompts):
        """Fill slots 0 .. B-1 with ``prompts`` (B, T0), one length for all; returns the last
        logits (B, vocab). The prompt runs once through the teaching cache under the same
        strategy, and what its store holds is copied into the pools (replay: the checkpoint,
        the log and its length), so both paths continue from the same numbers."""
        if not isinstance(prompts, torch.Tensor) or prompts.dim() != 2:
            raise TypeError("prompts: expected an integer tensor (batch, T0)")
        B, T0 = prompts.shape
        if not 1 <= B <= self.max_batch:
            raise ValueError(
                f"prompts: batch {B} does not fit the pools: expected 1 <= batch "
                f"<= max_batch={self.max_batch}"
            )
        if not 1 <= T0 < self.max_len:
            raise ValueError(f"prompts: length {T0}: expected 1 <= length < max_len={self.max_len}")
        check_token_ids(prompts, B, self.cfg.vocab_size)
        cache = HybridCache(
            self.model, B, self.strategy, log_length=self.L, use_kernels=self.use_kernels
        )
        logits = self.model(prompts.to(self.device), cache)[:, -1]
        store, n = cache.ssm, 0
        for l, pool in self.ssm.items():
            pool.conv[:B].copy_(cache.state(l).conv)
            if self.strategy == "replay":
                n = store.n[l]
                pool.state[:B].copy_(store.checkpoint[l].ssm[store.rows])
                for k, buf in pool.log.items() if n else ():
                    buf[:B, :n].copy_(store.log[l][k][:, :n])
            else:
                pool.state[:B].copy_(store.state(l).ssm)
        for l, pool in self.kv.items():
            k, v = cache.kv[l].keys_values()
            pool.k[:B, :, :T0].copy_(k)
            pool.v[:B, :, :T0].copy_(v)
        self.batch, self.position, self.log_len, self.last_T = B, T0, n, 0
        self._log_len.zero_()
        self._log_len[:B].fill_(n)
        return logits

    # --- one step ------------------------------------------------------------------------
    @torch.no_grad()
    def step(self, tokens, check=True):
        """Logits (B, T, vocab) of T new tokens per sequence (``tokens`` (B, T)), advancing
        every slot by T. ``check=False`` skips the id range check, which reads the ids back
        from the device (a host sync per step); shapes are always checked."""
        if self.batch == 0:
            raise ValueError("step: no slot was filled: call prefill first")
        if check:
            check_token_ids(tokens, self.batch, self.cfg.vocab_size)
        elif tokens.dim() != 2 or tokens.shape[0] != self.batch:
            raise ValueError(
                f"tokens: expected shape (batch={self.batch}, T), got {tuple(tokens.shape)}"
            )
        T = tokens.shape[1]
        if not 1 <= T <= self.max_verify:
            raise ValueError(
                f"tokens: {T} per step, expected 1 <= T <= max_verify="
                f"{self.max_verify} (the captured verify size)"
            )
        if self.position + T > self.max_len:
            raise ValueError(f"tokens: {self.position} + {T} exceeds max_len={self.max_len}")
        if self.strategy == "replay" and self.log_len + T > self.L:
            self._fold()
        self._pos.fill_(self.position)
        tokens = tokens.to(self.device)
        if self.graphs:
            logits = self._graph_step(tokens)
        else:
            logits = self._forward(tokens)
        self.position += T
        self.log_len += T if self.strategy == "replay" else 0
        self.last_T = T
        self.stats.steps += 1
        self.stats.verify_steps += int(T > 1)
        return logits

    def rollback(self, keep):
        """Keep the first ``keep`` tokens of the last step (0 <= keep <= its T); drop the rest."""
        keep = as_int("keep", keep, 0, self.last_T)
        drop = self.last_T - keep
        if drop == 0:
            return
        if keep == 0:
            raise ValueError(
                "keep: the engine keeps copies after each verified token; keep at "
                "least the first (the pending token)"
            )
        B = self.batch
        for pool in self.ssm.values():
            pool.conv[:B].copy_(pool.draft_conv[:B, keep - 1])
            if self.strategy == "snapshot":
                pool.state[:B].copy_(pool.draft_state[:B, keep - 1])
        if self.strategy == "replay":  # a cursor move
            self.log_len -= drop
            self._log_len[:B].fill_(self.log_len)
        self.position -= drop
        self.last_T = keep
        self.stats.rollbacks += 1

    def _fold(self):
        """Fold every slot's log into its checkpoint (replay)."""
        B, n = self.batch, self.log_len
        if n == 0:
            return
        for pool in self.ssm.values():
            if self.use_kernels:
                from replaylab.kernels.replay import fold

                rows = self._rows[:B]
                fold(
                    pool.state,
                    rows,
                    pool.state,
                    rows,
                    pool.log["x"],
                    pool.log["dt"],
                    pool.log["B"],
                    self._log_len[:B],  # n in every slot
                    pool.A,
                    pool.dt_bias,
                    True,
                    pool.dt_limit,
                    check=False,
                )
            else:
                log = {k: v[:B, :n] for k, v in pool.log.items()}
                pool.state[:B].copy_(pool.spec.fold(pool.state[:B], log))
        self.stats.folds += 1
        self.stats.folded_tokens += n * B
        self.log_len = 0
        self._log_len[:B].zero_()
        self.last_T = 0  # what was folded can no longer be rolled back

    # --- the model over the pools --------------------------------------------------------
    def _forward(self, tokens):
        if self.fused:
            return self._forward_fused(tokens)
        B, T = tokens.shape
        h = self.model.model.embeddings(tokens)
        for i, block in enumerate(self.model.model.layers):
            x = block.norm(h)
            kind = self.cfg.pattern[i]
            if kind == "M":
                h = h + self._mamba(i, x, B, T)
            elif kind == "*":
                h = h + self._attention(i, x, B, T)
            else:
                h = h + block.mixer(x, None)
        if self.strategy == "replay":
            self._log_len[:B] += T
        return self.model.lm_head(self.model.model.norm_f(h))

    def _mamba(self, layer, h, B, T):
        pool = self.ssm[layer]
        mixer, c = pool.mixer, self.cfg
        inner = c.ssm_heads * c.ssm_head_dim
        gate, xBC, dt = mixer.in_proj(h).split([inner, c.conv_dim, c.ssm_heads], dim=-1)
        window = pool.conv[:B]
        entries = pool.spec.prepare(window, dict(xBC=xBC, dt=dt))
        K = window.shape[1]
        if T > 1:
            pool.draft_conv[:B, :T].copy_(windows_per_token(window, xBC))
        if self.strategy == "snapshot":
            result = pool.spec.scan(pool.state[:B], entries, return_states=T > 1)
            if T > 1:
                pool.draft_state[:B, :T].copy_(result.states)
            pool.state[:B].copy_(result.state)
            y = result.y
        else:
            y = self._replay_outputs(pool, B, T, entries)
        if K:
            pool.conv[:B].copy_(torch.cat([window, xBC.to(window.dtype)], 1)[:, -K:])
        return mixer.out_proj(mixer.norm(y.flatten(-2), gate))

    def _replay_outputs(self, pool, B, T, entries):
        """y of the new tokens from checkpoint + log; appends the entries to the log."""
        idx = self._log_len[:B].long()[:, None] + torch.arange(T, device=self.device)
        rows = torch.arange(B, device=self.device)[:, None]
        if self.use_kernels:
            y = self._replay_step(
                pool, B, entries["x"], entries["dt"], entries["B"], entries["C"], append=False
            )
        else:
            n = self.log_len
            log = {k: v[:B, :n] for k, v in pool.log.items()}
            y = pool.spec.scan(pool.spec.fold(pool.state[:B], log), entries).y
        for k, buf in pool.log.items():
            buf[rows, idx] = entries[k].to(buf.dtype)
        return y

    def _replay_step(self, pool, B, x, dt, Bm, Cm, append):
        """``kernels.replay.replay_step`` over slots 0 .. B-1 of a layer's pools; with
        ``append`` the kernel writes the new entries to the log itself, and the one log length
        all layers share is moved by the forward."""
        from replaylab.kernels.replay import replay_step

        return replay_step(
            pool.state,
            self._rows[:B],
            pool.log["x"],
            pool.log["dt"],
            pool.log["B"],
            pool.log["C"],
            self._log_len[:B],
            x,
            dt,
            Bm,
            Cm,
            pool.A,
            pool.D,
            pool.dt_bias,
            True,
            pool.dt_limit,
            append=append,
            advance=False,
            check=False,
            kernel="per_token",  # a verify rounds as single steps do (see the docstring)
        )

    def _attention(self, layer, h, B, T):
        att, pool, c = self.model.model.layers[layer].mixer, self.kv[layer], self.cfg
        q = att.q_proj(h).view(B, T, c.attn_heads, c.head_dim).transpose(1, 2)
        k = att.k_proj(h).view(B, T, c.kv_heads, c.head_dim).transpose(1, 2)
        v = att.v_proj(h).view(B, T, c.kv_heads, c.head_dim).transpose(1, 2)
        at = self._pos + torch.arange(T, device=self.device)  # (T,) positions written
        pool.k[:B].index_copy_(2, at, k.to(pool.k.dtype))
        pool.v[:B].index_copy_(2, at, v.to(pool.v.dtype))
        rep = c.attn_heads // c.kv_heads
        keys = pool.k[:B].repeat_interleave(rep, 1)
        values = pool.v[:B].repeat_interleave(rep, 1)
        scores = (q @ keys.transpose(2, 3)) * c.head_dim**-0.5
        visible = torch.arange(self.max_len, device=self.device)[None, :] <= at[:, None]
        scores = scores.masked_fill(~visible, float("-inf"))
        out = torch.softmax(scores, dim=-1, dtype=torch.float32).to(q.dtype) @ values
        return att.o_proj(out.transpose(1, 2).reshape(B, T, -1))

    # --- the fused path (GPU) ------------------------------------------------------------
    def _forward_fused(self, tokens):
        """``_forward`` with the fused kernels: the residual add and the next block's norm
        are one kernel, and so on (see the module docstring)."""
        from replaylab.kernels.decode import add_rmsnorm, relu2

        B, T = tokens.shape
        layers = self.model.model.layers
        norms = [block.norm for block in layers[1:]] + [self.model.model.norm_f]
        h, x = add_rmsnorm(
            self.model.model.embeddings(tokens), layers[0].norm.weight, layers[0].norm.eps
        )
        for i, block in enumerate(layers):
            kind = self.cfg.pattern[i]
            if kind == "M":
                out = self._mamba_fused(i, x, B, T)
            elif kind == "*":
                out = self._attention_fused(i, x, B, T)
            else:
                mlp = block.mixer
                out = mlp.down_proj(relu2(mlp.up_proj(x)))
            h, x = add_rmsnorm(h, norms[i].weight, norms[i].eps, delta=out)
        if self.strategy == "replay":
            self._log_len[:B] += T
        return self.model.lm_head(x)

    def _mamba_fused(self, layer, h, B, T):
        from replaylab.kernels.decode import conv_step, gated_rmsnorm, state_update

        pool, c = self.ssm[layer], self.cfg
        mixer = pool.mixer
        H, P, N, G = c.ssm_heads, c.ssm_head_dim, c.d_state, c.n_groups
        inner = H * P
        zx = mixer.in_proj(h).view(B * T, -1)  # gate | xBC | dt
        x, Bm, Cm, dt = conv_step(
            zx,
            pool.conv[:B],
            pool.conv_weight,
            pool.conv_bias,
            inner,
            inner + c.conv_dim,
            inner,
            G * N,
            H,
            T,
            drafts=pool.draft_conv if T > 1 else None,
        )
        x, Bm, Cm = x.view(B, T, H, P), Bm.view(B, T, G, N), Cm.view(B, T, G, N)
        if self.strategy == "snapshot":
            y = state_update(
                pool.state,
                x,
                dt,
                Bm,
                Cm,
                pool.A,
                pool.D,
                pool.dt_bias,
                pool.dt_limit,
                drafts=pool.draft_state if T > 1 else None,
            )
        else:
            y = self._replay_step(pool, B, x, dt, Bm, Cm, append=True)
        y = gated_rmsnorm(y.view(B * T, inner), zx[:, :inner], mixer.norm.weight, G, mixer.norm.eps)
        return mixer.out_proj(y).view(B, T, -1)

    def _attention_fused(self, layer, h, B, T):
        """Attention over the static KV buffer with ``kernels.decode.attention``: each token
        reads only the rows up to its position, and the query heads of one KV head share
        them (no repeated keys and values)."""
        from replaylab.kernels.decode import attention

        att, pool, c = self.model.model.layers[layer].mixer, self.kv[layer], self.cfg
        Hq, Hkv, Dh = c.attn_heads, c.kv_heads, c.head_dim
        q, k, v = torch.nn.functional.linear(h, self._qkv_weight[layer]).split(
            [Hq * Dh, Hkv * Dh, Hkv * Dh], dim=-1
        )
        at = self._pos + self._steps[:T]  # (T,) positions written
        pool.k[:B].index_copy_(2, at, k.view(B, T, Hkv, Dh).transpose(1, 2).to(pool.k.dtype))
        pool.v[:B].index_copy_(2, at, v.view(B, T, Hkv, Dh).transpose(1, 2).to(pool.v.dtype))
        out = attention(q.reshape(B, T, Hq, Dh), pool.k, pool.v, self._pos, Dh**-0.5)
        return att.o_proj(out.view(B, T, Hq * Dh))

    # --- CUDA graphs ---------------------------------------------------------------------
    def _graph_step(self, tokens):
        B, T = tokens.shape
        key = (B, T)
        if key not in self._graphs:
            static = tokens.clone()
            saved = self._save_for_capture(B)
            stream = torch.cuda.Stream()
            stream.wait_stream(torch.cuda.current_stream())  # after the copies above
            with torch.cuda.stream(stream):
                for _ in range(2):  # warm-up: Triton compiles, allocator settles
                    self._forward(static)
                    self._restore_after_capture(saved, B)
            torch.cuda.current_stream().wait_stream(stream)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                out = self._forward(static)
            self._restore_after_capture(saved, B)
            self._graphs[key] = (graph, static, out)
        graph, static, out = self._graphs[key]
        static.copy_(tokens)
        graph.replay()
        self.stats.graph_replays += 1
        return out

    def _save_for_capture(self, B):
        """The warm-up runs the step for real (capture records without running): keep what it
        overwrites in place (state, conv window, log length); the log, draft and KV rows past
        the current position are rewritten by the real step before anything reads them."""
        saved = {"log_len": self._log_len.clone()}
        for l, pool in self.ssm.items():
            saved[l] = (pool.state[:B].clone(), pool.conv[:B].clone())
        return saved

    def _restore_after_capture(self, saved, B):
        self._log_len.copy_(saved["log_len"])
        for l in self.ssm:
            state, conv = saved[l]
            self.ssm[l].state[:B].copy_(state)
            self.ssm[l].conv[:B].copy_(conv)
        # logs and KV rows past the current position are rewritten by the real step

    # --- workloads -----------------------------------------------------------------------
    @torch.no_grad()
    def greedy(self, prompts, n_new):
        """Greedy decoding of ``n_new`` tokens after ``prompts`` (B, T0): (B, n_new)."""
        logits = self.prefill(prompts)
        out = []
        for i in range(n_new):
            tok = logits.argmax(-1, keepdim=True)
            out.append(tok)
            if i < n_new - 1:
                logits = self.step(tok, check=False)[:, -1]
        return torch.cat(out, 1)

    @torch.no_grad()
    def speculative(self, prompt, n_new, drafter, k=4):
        """Greedy speculative decoding of one sequence with ``drafter.propose(context, k,
        vocab)``: (1, n_new) tokens, equal to ``greedy``'s. Returns (tokens, proposed,
        accepted)."""
        if k + 1 > self.max_verify:
            raise ValueError(
                f"k: a verify of k + 1 = {k + 1} tokens exceeds max_verify={self.max_verify}"
            )
        if prompt.shape[0] != 1:
            raise ValueError(f"prompt: one sequence, got batch {prompt.shape[0]}")
        pending = self.prefill(prompt).argmax(-1, keepdim=True)
        return self.speculate(prompt, pending, n_new, drafter, k)

    @torch.no_grad()
    def speculate(self, prompt, pending, n_new, drafter, k=4):
        """The decode part of ``speculative``, after ``prefill(prompt)`` gave the first token
        ``pending`` (1, 1): (tokens (1, n_new), proposed, accepted)."""
        if k + 1 > self.max_verify:
            raise ValueError(
                f"k: a verify of k + 1 = {k + 1} tokens exceeds max_verify={self.max_verify}"
            )
        out, proposed, accepted = [pending], 0, 0
        while sum(t.shape[1] for t in out) < n_new:
            context = torch.cat([prompt, torch.cat(out, 1).to(prompt.device)], 1)
            drafts = drafter.propose(context, k, self.cfg.vocab_size).reshape(1, k)
            drafts = drafts.to(self.device)
            pred = self.step(torch.cat([pending, drafts], 1))[0].argmax(-1)
            a = int((drafts[0] == pred[:k]).long().cumprod(0).sum())
            proposed, accepted = proposed + k, accepted + a
            self.rollback(1 + a)
            out.append(torch.cat([drafts[:, :a], pred[a].view(1, 1)], 1))
            pending = pred[a].view(1, 1)
        return torch.cat(out, 1)[:, :n_new], proposed, accepted
