"""The byte-level BPE tokenizer, the token stream (``ids``: each text's tokens, then EOS), and
the prepared data folder (tokenizer and ids written once, read by every training run)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from replaylab.training.corpus import Corpus, write_heldout_text
from replaylab.training.provenance import device_name, utc_now, versions

SPECIAL_TOKENS = ("<|endoftext|>", "<|pad|>")
EOS, PAD = 0, 1  # their ids: the tokenizer's first entries


def train_tokenizer(texts, vocab_size=2048):
    """A byte-level BPE tokenizer (``tokenizers``) trained on ``texts``; ids 0 and 1 are
    ``<|endoftext|>`` and ``<|pad|>``. Any text encodes (256 byte symbols are in the base)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    texts = list(texts)
    if not any(texts):
        raise ValueError("corpus: no text to train a tokenizer on")
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    return tok


def encode(tokenizer, texts) -> np.ndarray:
    """One stream of ids: each text's tokens followed by EOS (uint16 when the vocabulary fits)."""
    encodings = tokenizer.encode_batch(list(texts))
    dtype = np.uint16 if tokenizer.get_vocab_size() <= 65536 else np.int32
    parts = [np.asarray(e.ids + [EOS], dtype=dtype) for e in encodings]
    return np.concatenate(parts) if parts else np.zeros(0, dtype=dtype)


def prepare(corpus: Corpus, folder, vocab_size=2048):
    """Train the tokenizer on the train split and write ``tokenizer.json``, ``train_ids.npy``,
    ``heldout_ids.npy``, ``heldout.txt`` and ``corpus.json`` (the split) to ``folder``: what
    ``train(data=folder)`` reads, identical on every machine."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    tok = train_tokenizer(corpus.train_texts, vocab_size)
    tok.save(str(folder / "tokenizer.json"))
    np.save(folder / "train_ids.npy", encode(tok, corpus.train_texts))
    np.save(folder / "heldout_ids.npy", encode(tok, corpus.heldout_texts))
    write_heldout_text(corpus, folder / "heldout.txt")
    manifest = dict(
        corpus.manifest(),
        device=device_name("cpu"),
        versions=versions(),
        date=utc_now(),
        command=f"replaylab.train.prepare(corpus, {str(folder)!r})",
    )
    (folder / "corpus.json").write_text(json.dumps(manifest, indent=1))
    return folder


def load_prepared(folder):
    """(tokenizer, train_ids, heldout_ids, manifest) from a ``prepare`` folder."""
    from tokenizers import Tokenizer

    folder = Path(folder)
    for name in ("tokenizer.json", "train_ids.npy", "heldout_ids.npy", "corpus.json"):
        if not (folder / name).exists():
            raise ValueError(f"{folder}: no {name}; expected a folder written by prepare()")
    tok = Tokenizer.from_file(str(folder / "tokenizer.json"))
    train_ids = np.load(folder / "train_ids.npy")
    if train_ids.size < 2:
        raise ValueError(f"{folder}: train_ids.npy holds {train_ids.size} ids: an empty corpus")
    return (
        tok,
        train_ids,
        np.load(folder / "heldout_ids.npy"),
        json.loads((folder / "corpus.json").read_text()),
    )
