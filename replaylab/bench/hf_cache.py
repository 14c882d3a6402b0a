"""``replaylab bench hf-cache``: transformers' own assisted generation under its recording cache,
beside replaylab's replay and recompute caches (``replaylab.hf``) on the same weights and prompts
in one run, and replaylab's own speculative decoding of the same pair beside them.

Two measurements:

- **state bytes per sequence** at draft lengths k = 1..8, per family: the recurrent memory a
  cache holds (``replaylab.hf.state_bytes``; attention keys and values left out, they are the
  same under every cache) at its peak, right after the target verified the last token and k
  drafts and before ``crop``. transformers' recording then holds every layer's state after each
  draft token; replay holds its checkpoint and its log, which depends on where the log stands in
  its fold grid of L entries, so both ends are reported (``replay_min``, ``replay_max``: prompts
  of every length modulo L); recompute holds the state and the state at the last commit.
- **assisted-generation tokens/s** on the trained NemotronH pair (``data/models``), batch 1:
  transformers' greedy ``generate``, its assisted generation under its recording, under
  ``ReplayCache`` and ``RecomputeCache``, and ``replaylab.generate`` (replay, k = 4) on the same
  prompts. Each cell is the median of ``repeats`` runs after one warm-up, with whether its tokens
  equal greedy ones.
- with ``presets`` (``--presets 8b-layers`` on a GPU): the same three caches on a random
  NemotronH of a ``replaylab.model`` preset, drafting with itself (no rollback) and with other
  random weights (a rollback every round), k = 4, with the bytes each holds at a round's peak.
  transformers' assisted generation runs batch 1 only, so the regime where state bytes
  dominate a step (large batches) is out of its reach; this is as close as its API allows.

Glossary: k drafts per verification; L the replay log length (``replaylab.hf`` default 16).
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path

import torch

from replaylab.bench.timing import sync

__all__ = ["run", "summary", "state_bytes_rows", "tokens_per_second", "DRAFTS", "PROMPTS"]

MODELS = Path(__file__).resolve().parents[2] / "data" / "models"
TARGET, DRAFT = MODELS / "replaylab-code-10m", MODELS / "replaylab-code-draft"
DRAFTS = tuple(range(1, 9))
PROMPTS = ("def fibonacci(n):", "import os\n\n\ndef list_files(path):")


def _bamba_like(target, device, dtype):
    """A random-weight Bamba with the trained NemotronH's Mamba-2 shapes (H, P, N, G, d_conv,
    hidden size; one attention layer in six): bytes do not depend on the weights."""
    from transformers import BambaConfig, BambaForCausalLM

    c = target.config
    config = BambaConfig(
        vocab_size=c.vocab_size,
        hidden_size=c.hidden_size,
        num_hidden_layers=6,
        attn_layer_indices=[3],
        mamba_n_heads=c.mamba_num_heads,
        mamba_d_head=c.mamba_head_dim,
        mamba_d_state=c.ssm_state_size,
        mamba_n_groups=c.n_groups,
        mamba_d_conv=c.conv_kernel,
        mamba_expand=c.mamba_num_heads * c.mamba_head_dim // c.hidden_size,
        num_attention_heads=c.num_attention_heads,
        num_key_value_heads=c.num_key_value_heads,
        intermediate_size=2 * c.hidden_size,
    )
    return _seeded(0, BambaForCausalLM, config).eval().to(device=device, dtype=dtype)


def _jamba(seed, *, d_state, d_conv, expand, dt_rank, layers, attn_period, attn_offset, **common):
    """A random-weight transformers Jamba (dense MLPs: one expert) drawn under ``seed``;
    ``common``: vocab_size, hidden_size, num_attention_heads, num_key_value_heads,
    intermediate_size."""
    from transformers import JambaConfig, JambaForCausalLM

    config = JambaConfig(
        num_hidden_layers=layers,
        attn_layer_period=attn_period,
        attn_layer_offset=attn_offset,
        expert_layer_period=2,
        expert_layer_offset=1,
        num_experts=1,
        mamba_d_state=d_state,
        mamba_d_conv=d_conv,
        mamba_expand=expand,
        mamba_dt_rank=dt_rank,
        **common,
    )
    return _seeded(seed, JambaForCausalLM, config)


def _qwen3_5(seed, *, k_heads, v_heads, k_dim, v_dim, d_conv, layers, **common):
    """A random-weight transformers Qwen3.5 text model drawn under ``seed`` (its default layer
    types: full attention every fourth layer); ``common`` as ``_jamba``'s, plus head_dim and
    optionally partial_rotary_factor and rope_theta."""
    from transformers import Qwen3_5ForCausalLM, Qwen3_5TextConfig

    config = Qwen3_5TextConfig(
        num_hidden_layers=layers,
        linear_num_key_heads=k_heads,
        linear_num_value_heads=v_heads,
        linear_key_head_dim=k_dim,
        linear_value_head_dim=v_dim,
        linear_conv_kernel_dim=d_conv,
        **common,
    )
    return _seeded(seed, Qwen3_5ForCausalLM, config)


def _common_of(target):
    """The trained target's vocabulary, width and attention heads, and an MLP of twice its
    width: what the random family models of the bytes rows share with it."""
    c = target.config
    return dict(
        vocab_size=c.vocab_size,
        hidden_size=c.hidden_size,
        num_attention_heads=c.num_attention_heads,
        num_key_value_heads=c.num_key_value_heads,
        intermediate_size=2 * c.hidden_size,
    )


def _jamba_like(target, device, dtype):
    """A random-weight Jamba (Mamba-1) of the trained model's hidden size, with Jamba's own
    Mamba-1 shape ratios (expand 2, d_state 16, dt_rank hidden/16; one attention layer in
    six, dense MLPs)."""
    hidden = target.config.hidden_size
    model = _jamba(0, d_state=16, d_conv=4, expand=2, dt_rank=hidden // 16, layers=6,
                   attn_period=6, attn_offset=3, **_common_of(target))  # fmt: skip
    return model.eval().to(device=device, dtype=dtype)


def _qwen3_5_like(target, device, dtype):
    """A random-weight Qwen3.5 (Gated DeltaNet) of the trained model's hidden size, with
    Qwen3.5's head ratios scaled down (4 key heads, 8 value heads, head widths 64; a full
    attention layer in four)."""
    c = target.config
    model = _qwen3_5(0, k_heads=4, v_heads=8, k_dim=64, v_dim=64, d_conv=4, layers=8,
                     head_dim=c.hidden_size // c.num_attention_heads, **_common_of(target))  # fmt: skip
    return model.eval().to(device=device, dtype=dtype)


def _peak_bytes(model, make_cache, prompt_len, k, device):
    """Recurrent bytes a fresh cache holds after a ``prompt_len`` prefill, recording on, and a
    verify forward of 1 + k tokens (before any crop)."""
    from replaylab.hf import state_bytes

    gen = torch.Generator().manual_seed(prompt_len)
    ids = torch.randint(2, model.config.vocab_size, (1, prompt_len + 1 + k), generator=gen)
    ids = ids.to(device)
    cache = make_cache()
    with torch.no_grad():
        model(ids[:, :prompt_len], cache=cache)
        cache.activate_past_recording(recurrent_states_to_keep=k)
        model(ids[:, prompt_len:], cache=cache)
    return state_bytes(cache)


def _layer_shapes(model, device):
    """Per recurrent layer: its state's bytes (fp32) and one replay log entry's bytes (the raw
    conv inputs and the scan fields, in the model dtype), read off a ReplayCache."""
    from replaylab.hf import ReplayCache

    cache = ReplayCache(model)
    with torch.no_grad():
        model(torch.ones((1, 2), dtype=torch.long, device=device), cache=cache)
    layers = cache.recurrent_layers()
    state = layers[0].ckpt[0].numel() * layers[0].ckpt.element_size()
    entry = sum(v[0, 0].numel() * v.element_size() for v in layers[0].log.values())
    return dict(
        recurrent_layers=len(layers),
        state_bytes=state,
        log_entry_bytes=entry,
        state_per_log_entry=round(state / entry, 2),
    )


def state_bytes_rows(model, family, drafts=DRAFTS, prompt_len=40, log_length=16, device="cpu"):
    """One row per draft length: bytes per sequence under recording, replay (min and max over
    the fold grid) and recompute, and replay's worst case over recording."""
    from transformers import DynamicCache

    from replaylab.hf import RecomputeCache, ReplayCache

    rows = []
    for k in drafts:
        recording = _peak_bytes(
            model, lambda: DynamicCache(config=model.config), prompt_len, k, device
        )
        replay = [
            _peak_bytes(model, lambda: ReplayCache(model, log_length), prompt_len + s, k, device)
            for s in range(log_length)
        ]
        recompute = _peak_bytes(model, lambda: RecomputeCache(model), prompt_len, k, device)
        rows.append(
            dict(
                family=family,
                log_length=log_length,
                drafts=k,
                recording=recording,
                replay_min=min(replay),
                replay_max=max(replay),
                recompute=recompute,
                replay_max_over_recording=round(max(replay) / recording, 3),
                recompute_over_recording=round(recompute / recording, 3),
            )
        )
    return rows


def _generated(model, ids, n_new, **kw):
    """transformers' greedy ``generate`` of exactly ``n_new`` tokens after ``ids`` (1, T), with
    ``kw`` (an assistant, a cache): the new ids, a list."""
    with torch.no_grad():
        out = model.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=n_new,
            min_new_tokens=n_new,
            do_sample=False,
            **kw,
        )
    return out[0, ids.shape[1] :].tolist()


def _timed(fn, repeats, device):
    """(median seconds, last result) of ``repeats`` calls after one warm-up."""
    fn()
    times, out = [], None
    for _ in range(repeats):
        sync(device)
        t0 = time.perf_counter()
        out = fn()
        sync(device)
        times.append(time.perf_counter() - t0)
    return statistics.median(times), out


def tokens_per_second(target, draft, prompts, n_new=48, repeats=3, device="cpu", dtype=None):
    """Assisted generation of ``n_new`` tokens after each prompt (ids), batch 1, under each
    cache; rows with tokens/s (all prompts' tokens over their summed median seconds) and
    whether every prompt's tokens equal transformers' greedy ones."""
    from replaylab.generate import generate as replaylab_generate
    from replaylab.hf import RecomputeCache, ReplayCache

    def hf_run(ids, **kw):
        return _generated(target, ids, n_new, **kw)

    runs = {
        "greedy (transformers)": lambda ids: hf_run(ids),
        "assisted, transformers' recording": lambda ids: hf_run(ids, assistant_model=draft),
        "assisted, replaylab.hf ReplayCache": lambda ids: hf_run(
            ids, assistant_model=draft, cache=ReplayCache(target)
        ),
        "assisted, replaylab.hf RecomputeCache": lambda ids: hf_run(
            ids, assistant_model=draft, cache=RecomputeCache(target)
        ),
        "replaylab generate (replay, k=4)": lambda ids: replaylab_generate(
            TARGET,
            ids[0].tolist(),
            n_new,
            cache="replay",
            draft=DRAFT,
            k=4,
            device=device,
            stop_at_eos=False,
            dtype=dtype,
        ),
    }
    greedy, rows = {}, []
    for name, fn in runs.items():
        seconds, equal, internal = 0.0, True, 0.0
        for i, prompt in enumerate(prompts):
            ids = torch.tensor([prompt], device=device)
            t, out = _timed(lambda: fn(ids), repeats, device)  # noqa: B023
            if not isinstance(out, list):  # replaylab's DecodeResult: its own decode seconds
                internal += out.seconds
                out = out.tokens[0].tolist()
            seconds += t
            if name.startswith("greedy"):
                greedy[i] = out
            equal = equal and out == greedy[i]
        row = dict(
            cache=name,
            tokens=n_new * len(prompts),
            seconds=round(seconds, 4),
            tokens_per_s=round(n_new * len(prompts) / seconds, 1),
            tokens_equal_greedy=equal,
        )
        if internal:
            row["decode_seconds_inside"] = round(internal, 4)
        rows.append(row)
    return rows


def _seeded(seed, model_class, config):
    """``model_class(config)`` with its random weights drawn under ``seed``, the caller's
    random state left as it was."""
    devices = [torch.cuda.current_device()] if torch.cuda.is_available() else []
    with torch.random.fork_rng(devices=devices):
        torch.manual_seed(seed)
        return model_class(config)


def _preset_model(name, seed):
    """A random-weight transformers model of a preset: NemotronH for ``replaylab.model``'s
    presets ("tiny", "1b", "8b-layers": Nemotron-H 8B's layer shapes); Qwen3.5 and Jamba for
    ``replaylab.bench.families``' "qwen3.5-9b-layers" and "jamba-1.5-mini-layers" (their
    recurrent and attention layers at the published shapes, 3 recurrent + 1 attention) and
    its toy "tiny-gdn" and "tiny-mamba1"."""
    from replaylab.bench.families import PRESETS, TINY_PRESETS
    from replaylab.model import HybridLM, preset, to_transformers_nemotron_h

    family_presets = {**PRESETS, **TINY_PRESETS}
    if name not in family_presets:
        return to_transformers_nemotron_h(HybridLM(preset(name), seed=seed))
    c = family_presets[name]["config"]
    common = dict(
        vocab_size=c["vocab_size"],
        hidden_size=c["hidden_size"],
        num_attention_heads=c["attn_heads"],
        num_key_value_heads=c["kv_heads"],
        intermediate_size=c.get("intermediate_size", 2 * c["hidden_size"]),
    )
    if "gdn" in c:
        g = c["gdn"]
        return _qwen3_5(
            seed, k_heads=g["k_heads"], v_heads=g["v_heads"], k_dim=g["k_head_dim"],
            v_dim=g["v_head_dim"], d_conv=g.get("d_conv", 4), layers=4, head_dim=c["head_dim"],
            partial_rotary_factor=c["rotary_dim"] / c["head_dim"],
            rope_theta=c.get("rope_theta", 1.0e4), **common,
        )  # fmt: skip
    if "mamba1" in c:
        m = c["mamba1"]
        if m["d_inner"] % c["hidden_size"]:
            raise ValueError(
                f"preset {name!r}: Jamba's d_inner {m['d_inner']} is not a multiple of the hidden "
                f"size {c['hidden_size']} (transformers takes an integer expand)"
            )
        return _jamba(
            seed, d_state=m["d_state"], d_conv=m.get("d_conv", 4),
            expand=m["d_inner"] // c["hidden_size"], dt_rank=m["dt_rank"], layers=4,
            attn_period=4, attn_offset=3, **common,
        )  # fmt: skip
    raise ValueError(f"preset {name!r}: transformers has no model here for {sorted(c)}")


def preset_rows(name, device="cpu", dtype=torch.float32, n_new=32, repeats=3, k=4, prompt_len=32):
    """Assisted generation on a random-weight model of a preset (``_preset_model``: NemotronH,
    Qwen3.5 or Jamba at published layer shapes), batch 1, k drafts a round, with
    two assistants: the target itself (every draft accepted: no rollback) and the same preset
    with other random weights (nearly every draft rejected: a rollback each round). Per
    assistant and cache: tokens/s (median of ``repeats`` after a warm-up), whether the tokens
    equal transformers' greedy ones, and the recurrent bytes at the peak of a round."""
    from transformers import DynamicCache

    from replaylab.bench.families import PRESETS, TINY_PRESETS
    from replaylab.hf import RecomputeCache, ReplayCache

    # transformers' families draw their random weights where they run (GiBs at these shapes);
    # replaylab.model's presets draw theirs from a CPU generator
    where = device if name in {**PRESETS, **TINY_PRESETS} else "cpu"

    def build(seed):
        with torch.device(where):
            hf = _preset_model(name, seed)
        hf = hf.eval().to(device=device, dtype=dtype)
        hf.generation_config.num_assistant_tokens = k
        hf.generation_config.num_assistant_tokens_schedule = "constant"
        hf.generation_config.assistant_confidence_threshold = 0.0
        return hf

    target, other = build(0), build(1)
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(2, target.config.vocab_size, (1, prompt_len), generator=gen).to(device)

    def run_one(**kw):
        return _generated(target, ids, n_new, **kw)

    caches = {
        "transformers' recording": None,
        "replaylab.hf ReplayCache": ReplayCache,
        "replaylab.hf RecomputeCache": RecomputeCache,
    }
    seconds, greedy = _timed(run_one, repeats, device)
    rows = [dict(preset=name, assistant="none (greedy)", cache="transformers", k=0)]
    rows[0].update(tokens_per_s=round(n_new / seconds, 1), tokens_equal_greedy=True)
    for assistant_name, assistant in (("itself", target), ("other weights", other)):
        for cache_name, make in caches.items():

            def fn(assistant=assistant, make=make):
                kw = dict(assistant_model=assistant)
                return run_one(**kw) if make is None else run_one(cache=make(target), **kw)

            seconds, tokens = _timed(fn, repeats, device)
            rows.append(
                dict(
                    preset=name,
                    assistant=assistant_name,
                    cache=cache_name,
                    k=k,
                    tokens_per_s=round(n_new / seconds, 1),
                    tokens_equal_greedy=tokens == greedy,
                )
            )
    fresh = {"transformers' recording": lambda: DynamicCache(config=target.config)}
    fresh.update({n: (lambda m=m: m(target)) for n, m in caches.items() if m is not None})
    held = {n: _peak_bytes(target, f, prompt_len, k, device) for n, f in fresh.items()}
    for row in rows[1:]:
        row["state_bytes_at_peak"] = held[row["cache"]]
    return rows


def run(
    device="cpu",
    dtype="float32",
    drafts=DRAFTS,
    n_new=48,
    repeats=3,
    log_lengths=(16, 4),
    presets=(),
    progress=True,
):
    """The whole benchmark (see the module docstring); a JSON-ready dict. ``progress``: tqdm
    bars on stderr."""
    from tqdm.auto import tqdm
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging

    logging.set_verbosity_error()
    torch_dtype = getattr(torch, dtype)
    load = dict(dtype=torch_dtype)
    target = AutoModelForCausalLM.from_pretrained(TARGET, **load).eval().to(device)
    draft = AutoModelForCausalLM.from_pretrained(DRAFT, **load).eval().to(device)
    tok = AutoTokenizer.from_pretrained(TARGET)
    prompts = [tok(p).input_ids for p in PROMPTS]
    families = {
        "nemotron_h (trained 10M)": target,
        "bamba (random, same Mamba-2 shapes)": _bamba_like(target, device, torch_dtype),
        "jamba (random, Mamba-1 d_state 16)": _jamba_like(target, device, torch_dtype),
        "qwen3_5 (random, Gated DeltaNet 8x64x64)": _qwen3_5_like(target, device, torch_dtype),
    }
    shapes = {name: _layer_shapes(m, device) for name, m in families.items()}
    rows = []
    for name, model in tqdm(families.items(), desc="state bytes", disable=not progress):
        for L in log_lengths:
            rows += state_bytes_rows(model, name, drafts, log_length=L, device=device)
    speed = tokens_per_second(target, draft, prompts, n_new, repeats, device, torch_dtype)
    by_preset = []
    for name in tqdm(presets, desc="presets", disable=not progress):
        by_preset += preset_rows(name, device, torch_dtype, n_new=n_new, repeats=repeats)
    return dict(
        benchmark="hf-cache",
        what=__doc__.split("\n\n")[0],
        settings=dict(
            device=str(device),
            dtype=dtype,
            drafts=list(drafts),
            n_new=n_new,
            repeats=repeats,
            log_lengths=list(log_lengths),
            prompts=list(PROMPTS),
            assistant="the trained draft with transformers' default schedule",
        ),
        shapes=shapes,
        state_bytes=rows,
        assisted=speed,
        presets=by_preset,
    )


def summary(result):
    """Lines for the terminal: bytes at each draft length, then tokens/s."""
    lines = [f"{'family':40} L  k  recording   replay(min-max)   recompute  replay/rec"]
    for r in result["state_bytes"]:
        lines.append(
            f"{r['family']:40} {r['log_length']:2d} {r['drafts']}  {r['recording']:9d}  "
            f"{r['replay_min']:7d}-{r['replay_max']:7d}  {r['recompute']:9d}  "
            f"{r['replay_max_over_recording']:.3f}"
        )
    for r in result["assisted"]:
        lines.append(
            f"{r['cache']:42} {r['tokens_per_s']:8.1f} tok/s  equal to greedy: "
            f"{r['tokens_equal_greedy']}"
        )
    for r in result.get("presets", []):
        lines.append(
            f"{r['preset']:10} draft: {r['assistant']:14} {r['cache']:28} "
            f"{r['tokens_per_s']:8.1f} tok/s  equal to greedy: {r['tokens_equal_greedy']}  "
            f"bytes {r.get('state_bytes_at_peak', '-')}"
        )
    return lines
