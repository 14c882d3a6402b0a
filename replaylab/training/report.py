"""Measure the shipped pair on this machine (acceptance, identical-to-greedy checks, samples),
write ``metrics.json``, then the model cards."""

from __future__ import annotations

import json
import time
from pathlib import Path

from replaylab.training.acceptance import heldout_prompts, measure_acceptance
from replaylab.training.cards import PAIR, write_cards
from replaylab.training.corpus import read_heldout_text
from replaylab.training.provenance import device_name, versions
from replaylab.training.tokenizer import encode

SAMPLE_PROMPTS = (
    "def fibonacci(n):",
    "class Stack:\n    def __init__(self):",
    "import os\n\n\ndef list_python_files(path):",
    "def read_config(filename):",
)


def report(models_dir, n_prompts=16, n_new=64, k=4, progress=True, command=None) -> dict:
    """Measure the shipped pair in ``models_dir`` on this machine and write ``metrics.json``
    and both model cards: acceptance of the draft model and of prompt lookup at ``k`` on
    prompts cut from the held-out text, identical-to-greedy checks under every strategy,
    greedy samples. Held-out loss, bigram baseline and training figures come from each
    folder's ``train_log.json`` (measured where the model was trained)."""
    from replaylab.generate import generate, load_checkpoint, load_tokenizer

    models_dir = Path(models_dir)
    target_dir, draft_dir = (models_dir / n for n in PAIR)
    log = json.loads((target_dir / "train_log.json").read_text())
    tok = load_tokenizer(target_dir)
    texts = read_heldout_text(models_dir / "heldout.txt.gz")
    heldout_tokens = len(encode(tok, [texts[n] for n in sorted(texts)]))
    target, draft = load_checkpoint(target_dir), load_checkpoint(draft_dir)
    prompts = heldout_prompts(texts, tok, n_prompts)
    acceptance = measure_acceptance(target, draft, prompts, n_new, k, progress=progress)
    samples = []
    for prompt in SAMPLE_PROMPTS:
        run = generate(target_dir, prompt=prompt, max_new_tokens=48, cache="replay")
        samples.append(dict(prompt=prompt, text=run.extra["text"], eos=run.extra["stopped_at_eos"]))
    metrics = dict(
        models={},  # filled by write_cards from the train logs
        heldout_text=dict(
            file="heldout.txt.gz",
            files=len(texts),
            tokens=heldout_tokens,
            same_as_training_evaluation=heldout_tokens == log["heldout_split_tokens"],
        ),
        acceptance=acceptance,
        samples=samples,
        evaluation_provenance=dict(
            device=device_name("cpu"),
            versions=versions(),
            date=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            command=command or f"python -m replaylab.train report {models_dir}",
        ),
    )
    (models_dir / "metrics.json").write_text(json.dumps(metrics, indent=1))
    return write_cards(models_dir)
