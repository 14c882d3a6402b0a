"""Decode a transformers hybrid checkpoint with replaylab: greedy, or speculatively (a smaller
hybrid as draft model, or prompt lookup) under any state strategy. transformers refuses
assisted generation for these models ("not supported with stateful models"); here the output
is identical to greedy decoding whatever the draft and the strategy."""

from __future__ import annotations

from pathlib import Path

import torch

from replaylab.cache import as_config
from replaylab.decoding import ModelDrafter, PromptLookupDrafter, greedy, speculative
from replaylab.model import load_transformers_hybrid

__all__ = ["generate"]


def generate(
    checkpoint,
    prompt_ids,
    max_new_tokens=32,
    cache="replay",
    draft=None,
    k=4,
    device=None,
    progress=False,
):
    """Tokens after ``prompt_ids`` from a NemotronH or Bamba checkpoint folder.

    cache: a strategy name or a ``CacheConfig`` (used for the target and the draft model).
    draft: None (greedy), "prompt-lookup", or a checkpoint folder of a smaller hybrid with the
    same vocabulary. Returns a ``DecodeResult`` (tokens (1, max_new_tokens), acceptance,
    restores, peak bytes, rollback seconds).
    """
    cache = as_config(cache)
    model = load_transformers_hybrid(checkpoint).eval()
    if device is not None:
        model = model.to(device)
    device = next(model.parameters()).device
    prompt = torch.as_tensor(list(prompt_ids), dtype=torch.long, device=device)[None]
    if prompt.numel() == 0 or int(prompt.min()) < 0 or int(prompt.max()) >= model.cfg.vocab_size:
        raise ValueError(
            f"prompt_ids: expected a non-empty list of ids in [0, "
            f"{model.cfg.vocab_size}), got {list(prompt_ids)}"
        )
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens: expected >= 1, got {max_new_tokens}")
    if draft is None or draft == "none":
        return greedy(model, prompt, max_new_tokens, cache, progress=progress)
    if draft == "prompt-lookup":
        drafter = PromptLookupDrafter()
    else:
        if not Path(draft).is_dir():
            raise ValueError(
                f"draft: expected 'none', 'prompt-lookup' or a checkpoint folder, got {draft!r}"
            )
        draft_model = load_transformers_hybrid(draft).eval().to(device)
        if draft_model.cfg.vocab_size != model.cfg.vocab_size:
            raise ValueError(
                f"draft model: vocabulary of {draft_model.cfg.vocab_size} tokens, "
                f"expected the target's {model.cfg.vocab_size}"
            )
        drafter = ModelDrafter(draft_model, cache)
    return speculative(model, prompt, max_new_tokens, drafter, k=k, cache=cache, progress=progress)
