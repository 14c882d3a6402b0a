"""Export a trained model to a folder that transformers loads (NemotronH config and weights,
tokenizer files)."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from replaylab.model import HybridLM, to_transformers_nemotron_h
from replaylab.training.tokenizer import EOS, PAD, SPECIAL_TOKENS


def export(model: HybridLM, tokenizer, folder, dtype=torch.bfloat16, extra_files=None):
    """Write ``folder`` as transformers loads it: NemotronH ``config.json`` and
    ``model.safetensors`` (weights in ``dtype``), ``generation_config.json``,
    ``tokenizer.json`` and ``tokenizer_config.json`` (EOS ``<|endoftext|>``, pad ``<|pad|>``).
    ``extra_files``: ``{name: text}`` written beside them."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    model = model.to("cpu").float().eval()
    hf = to_transformers_nemotron_h(model)
    for cfg in (hf.config, hf.generation_config):
        cfg.bos_token_id, cfg.eos_token_id, cfg.pad_token_id = EOS, EOS, PAD
    hf.to(dtype).save_pretrained(folder)
    tokenizer.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(
        json.dumps(
            dict(
                tokenizer_class="PreTrainedTokenizerFast",
                bos_token=SPECIAL_TOKENS[EOS],
                eos_token=SPECIAL_TOKENS[EOS],
                pad_token=SPECIAL_TOKENS[PAD],
                add_bos_token=False,
                model_max_length=4096,
                clean_up_tokenization_spaces=False,
            ),
            indent=1,
        )
    )
    for name, text in (extra_files or {}).items():
        (folder / name).write_text(text)
    return folder
