"""Decode a transformers hybrid checkpoint with replaylab: greedy, or speculatively (a smaller
hybrid as draft model, or prompt lookup) under any state strategy. transformers up to 5.24
refuses assisted generation for these models ("not supported with stateful models"); from 5.25
it keeps one recorded state per draft token (snapshot). Here the output is identical to greedy
decoding whatever the draft and the strategy.

Text in and out: ``prompt="def fibonacci(n):"`` is encoded with the folder's ``tokenizer.json``
and the new tokens are decoded into ``result.extra["text"]``. Like transformers' ``generate``,
the output ends at the checkpoint's ``eos_token_id`` (the EOS token included) unless
``stop_at_eos=False``.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from replaylab.cache import as_config
from replaylab.decoding import ModelDrafter, PromptLookupDrafter, greedy, speculative
from replaylab.model import load_transformers_hybrid
from replaylab.validation import as_int

__all__ = ["generate", "load_checkpoint", "load_tokenizer", "eos_token_ids"]


def load_tokenizer(folder):
    """The ``tokenizers.Tokenizer`` in ``folder/tokenizer.json``; ValueError naming the problem
    when there is none or it does not parse."""
    from tokenizers import Tokenizer

    path = Path(folder) / "tokenizer.json"
    if not path.is_file():
        raise ValueError(
            f"{folder}: no tokenizer.json, so a text prompt cannot be encoded; "
            f"pass token ids (--prompt-ids) or add the checkpoint's tokenizer"
        )
    try:
        return Tokenizer.from_file(str(path))
    except Exception as err:  # tokenizers raises a bare Exception
        raise ValueError(f"{path}: corrupt tokenizer.json ({err})") from None


def eos_token_ids(folder) -> list[int]:
    """The end-of-sequence ids transformers' ``generate`` stops at: ``generation_config.json``'s
    ``eos_token_id``, else ``config.json``'s (an int or a list; [] when neither sets one)."""
    for name in ("generation_config.json", "config.json"):
        path = Path(folder) / name
        if path.is_file():
            value = json.loads(path.read_text()).get("eos_token_id")
            if value is not None:
                return [value] if isinstance(value, int) else list(value)
    return []


def _check_weights(folder):
    """A clear error for a safetensors file that does not parse (before transformers reads it)."""
    from safetensors import safe_open

    for path in sorted(Path(folder).glob("*.safetensors")):
        try:
            with safe_open(str(path), "pt"):
                pass
        except Exception as err:
            raise ValueError(f"{path}: corrupt safetensors file ({err})") from None


def _tokenizer_model(folder):
    """The parts of a tokenizer.json that decide ids (vocabulary, merges, added tokens)."""
    data = json.loads((Path(folder) / "tokenizer.json").read_text())
    model = data.get("model") or {}
    return model.get("vocab"), model.get("merges"), data.get("added_tokens")


def load_checkpoint(folder, device=None, dtype=None):
    """A ``HybridLM`` (eval mode) from a NemotronH or Bamba folder, after checking its
    safetensors files parse; half-precision weights are upcast to float32 on a CPU unless
    ``dtype`` says otherwise."""
    if isinstance(folder, (str, Path)) and Path(folder).is_dir():
        _check_weights(folder)
    model = load_transformers_hybrid(folder).eval()
    if device is not None:
        model = model.to(device)
    param = next(model.parameters())
    if dtype is None and param.device.type == "cpu" and param.dtype in (torch.bfloat16, torch.half):
        dtype = torch.float32  # CPUs have no fast half-precision matmul; weights upcast exactly
    return model if dtype is None else model.to(dtype)


def generate(
    checkpoint,
    prompt_ids=None,
    max_new_tokens=32,
    cache="replay",
    draft=None,
    k=4,
    device=None,
    progress=False,
    *,
    prompt=None,
    stop_at_eos=True,
    dtype=None,
    engine="auto",
):
    """Tokens after a prompt from a NemotronH or Bamba checkpoint folder.

    prompt_ids: token ids; or ``prompt``: text, encoded with the folder's tokenizer.json.
    cache: a strategy name or a ``CacheConfig`` (used for the target and the draft model).
    draft: None (greedy), "prompt-lookup", or a checkpoint folder of a smaller hybrid with the
    same tokenizer. stop_at_eos: end the output at the first EOS id of the checkpoint's
    (generation) config, as transformers does. dtype: compute dtype (default: the stored one,
    float32 on a CPU for half-precision weights). engine: "auto" (the serving engine,
    ``replaylab.serving.DecodeEngine``, on a GPU for the layouts its fused path takes by default,
    NemotronH's (``serving.layouts.fused_by_default``);
    the teaching cache otherwise), True (the engine, on any device) or False (the teaching cache).

    Returns a ``DecodeResult``: tokens (1, n) with n <= max_new_tokens, acceptance, restores,
    peak bytes, rollback seconds; ``extra`` holds ``text`` (the new tokens decoded, when the
    folder has a tokenizer), ``prompt_ids``, ``stopped_at_eos`` and ``decoded_tokens`` (how many
    tokens were decoded before the output was cut at EOS).
    """
    if (prompt is None) == (prompt_ids is None):
        raise ValueError("give exactly one of prompt (text) and prompt_ids (token ids)")
    if not (engine == "auto" or isinstance(engine, bool)):
        raise ValueError(f"engine: expected 'auto', True or False, got {engine!r}")
    if dtype is not None and not (isinstance(dtype, torch.dtype) and dtype.is_floating_point):
        raise ValueError(f"dtype: expected a floating-point torch.dtype or None, got {dtype!r}")
    if device is not None:
        try:
            device = torch.device(device)
        except (RuntimeError, TypeError):
            raise ValueError(
                f"device: expected a torch device such as 'cpu' or 'cuda', got {device!r}"
            ) from None
        if device.type == "cuda" and not torch.cuda.is_available():
            raise ValueError(f"device: {device} asked for, but this machine has no CUDA device")
    cache = as_config(cache)
    folder = Path(checkpoint) if isinstance(checkpoint, (str, Path)) else None
    tokenizer = None
    if prompt is not None:
        if folder is None:
            raise ValueError("prompt: text needs a checkpoint folder with a tokenizer.json")
        tokenizer = load_tokenizer(folder)
        prompt_ids = tokenizer.encode(prompt).ids
        if not prompt_ids:
            raise ValueError(f"prompt: {prompt!r} encodes to no tokens; give some text")
    elif folder is not None and (folder / "tokenizer.json").is_file():
        tokenizer = load_tokenizer(folder)
    as_int("max_new_tokens", max_new_tokens, low=1)
    if isinstance(prompt_ids, (str, bytes)) or not hasattr(prompt_ids, "__iter__"):
        raise TypeError(
            f"prompt_ids: expected a list of integer token ids, got {type(prompt_ids).__name__} "
            f"{prompt_ids!r}"
        )
    prompt_ids = [as_int(f"prompt_ids[{i}]", t) for i, t in enumerate(prompt_ids)]
    model = load_checkpoint(checkpoint, device, dtype)
    device = next(model.parameters()).device
    if not prompt_ids or min(prompt_ids) < 0 or max(prompt_ids) >= model.cfg.vocab_size:
        raise ValueError(
            f"prompt_ids: expected a non-empty list of ids in [0, "
            f"{model.cfg.vocab_size}), got {prompt_ids}"
        )
    prompt_t = torch.as_tensor(prompt_ids, dtype=torch.long, device=device)[None]
    use_engine = _use_engine(engine, model, cache)
    if draft is None or draft == "none":
        if use_engine:
            run = _engine_decode(model, prompt_t, max_new_tokens, cache, None, k)
        else:
            run = greedy(model, prompt_t, max_new_tokens, cache, progress=progress)
    else:
        if draft == "prompt-lookup":
            drafter = PromptLookupDrafter()
        else:
            if not Path(draft).is_dir():
                raise ValueError(
                    f"draft: expected 'none', 'prompt-lookup' or a checkpoint folder, got {draft!r}"
                )
            if folder is not None and all(
                (f / "tokenizer.json").is_file() for f in (folder, Path(draft))
            ):
                load_tokenizer(draft)  # a clear error if it is corrupt
                if _tokenizer_model(draft) != _tokenizer_model(folder):
                    raise ValueError(
                        f"draft model: its tokenizer ({Path(draft) / 'tokenizer.json'}) differs "
                        f"from the target's ({folder / 'tokenizer.json'}): the same ids would "
                        f"mean different text"
                    )
            draft_model = load_checkpoint(draft, device, next(model.parameters()).dtype)
            if draft_model.cfg.vocab_size != model.cfg.vocab_size:
                raise ValueError(
                    f"draft model: vocabulary of {draft_model.cfg.vocab_size} tokens, "
                    f"expected the target's {model.cfg.vocab_size}"
                )
            drafter = ModelDrafter(draft_model, cache)
        if use_engine:
            run = _engine_decode(model, prompt_t, max_new_tokens, cache, drafter, k)
        else:
            run = speculative(
                model, prompt_t, max_new_tokens, drafter, k=k, cache=cache, progress=progress
            )
    decoded = run.tokens.shape[1]
    stopped = False
    eos = eos_token_ids(folder) if (stop_at_eos and folder is not None) else []
    if eos:
        hits = torch.isin(run.tokens[0], torch.tensor(eos, device=run.tokens.device))
        if hits.any():
            run.tokens = run.tokens[:, : int(hits.nonzero()[0]) + 1]
            stopped = True
    run.extra.update(prompt_ids=prompt_ids, stopped_at_eos=stopped, decoded_tokens=decoded)
    if tokenizer is not None:
        run.extra["text"] = tokenizer.decode(run.tokens[0].tolist(), skip_special_tokens=False)
        run.extra["prompt_text"] = tokenizer.decode(prompt_ids, skip_special_tokens=False)
    return run


def _use_engine(engine, model, cache):
    """Whether ``generate`` decodes with the serving engine (see its ``engine`` argument)."""
    from replaylab.serving import unsupported_reason
    from replaylab.serving.layouts import fused_by_default

    if engine not in ("auto", True, False):
        raise ValueError(f"engine: expected 'auto', True or False, got {engine!r}")
    reason = unsupported_reason(model.cfg, cache.strategy)
    if engine is True and reason:
        raise ValueError(f"engine: the serving engine cannot decode this: {reason}")
    if engine == "auto":  # the engine where its fused path serves the model on a GPU
        fast = fused_by_default(model.cfg)
        return reason is None and fast and next(model.parameters()).is_cuda
    return engine


def _engine_decode(model, prompt, max_new_tokens, config, drafter, k):
    """Greedy (no drafter) or speculative decoding of one prompt (1, T0) on a
    ``DecodeEngine``; a ``DecodeResult`` like the teaching loops' (its stats: the engine's
    rollbacks as restores, the slot's pool bytes as peak bytes)."""
    import time

    from replaylab.decoding import DecodeResult
    from replaylab.serving import DecodeEngine

    t0 = time.perf_counter()
    max_len = prompt.shape[1] + max_new_tokens + k + 1
    engine = DecodeEngine(
        model, 1, max_len, config.strategy, log_length=config.log_length, max_verify=k + 1
    )
    if drafter is None:
        tokens, proposed, accepted = engine.greedy(prompt, max_new_tokens), 0, 0
    else:
        tokens, proposed, accepted = engine.speculative(prompt, max_new_tokens, drafter, k=k)
    if tokens.is_cuda:
        torch.cuda.synchronize()
    result = DecodeResult(tokens, config, proposed, accepted, time.perf_counter() - t0)
    result.stats.restores = engine.stats.rollbacks
    result.stats.peak_bytes = engine.nbytes_per_slot()
    result.extra["engine"] = dict(vars(engine.stats))
    return result
