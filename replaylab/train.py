"""Train the library's hybrid model (NemotronH layout) on code: corpus, tokenizer, training loop,
evaluation, and export to a folder that transformers loads. This module gathers the public names
of ``replaylab.training`` (one module per concept) in one place.

The corpus is one every machine has offline: the Python standard library's own source files.
Its file list and train / held-out split are written down (``Corpus.manifest``); the held-out
text ships in ``data/`` so evaluation does not depend on the local Python version.

Glossary (code name -> meaning, shape):
    ids          a token stream: every file's tokens followed by ``<|endoftext|>`` (EOS)
    seq_len      training window; a batch is (batch_size, seq_len + 1) ids cut from the stream
    step         one optimizer update; its order of windows is fixed by ``seed``
    bigram       the baseline: p(b | a) from train-split counts, smoothed towards unigrams
    acceptance   accepted / proposed drafts in greedy speculative decoding (k drafts per round)

``train(out, ...)`` is the whole pipeline; ``replaylab train`` is its command. The pieces
(``stdlib_corpus``, ``train_tokenizer``, ``encode``, ``fit``, ``evaluate``, ``bigram_loss``,
``export``) are public so a notebook can run them small.

    python -m replaylab.train {report,cards} MODELS_DIR   # measure and write, or write only
"""

from __future__ import annotations

import sys

from replaylab.training.acceptance import heldout_prompts, measure_acceptance
from replaylab.training.cards import PAIR, model_card, write_cards
from replaylab.training.corpus import (
    FILE_MARK,
    Corpus,
    read_heldout_text,
    stdlib_corpus,
    text_corpus,
    write_heldout_text,
)
from replaylab.training.evaluate import bigram_loss, evaluate, token_windows
from replaylab.training.export import export
from replaylab.training.loop import TrainConfig, batches, fit, init_for_training
from replaylab.training.pipeline import MODEL_SIZES, train
from replaylab.training.provenance import STAMPED_FILES, folder_provenance, stamp_provenance
from replaylab.training.report import SAMPLE_PROMPTS, report
from replaylab.training.tokenizer import (
    EOS,
    PAD,
    SPECIAL_TOKENS,
    encode,
    load_prepared,
    prepare,
    train_tokenizer,
)

__all__ = [
    "EOS",
    "PAD",
    "SPECIAL_TOKENS",
    "MODEL_SIZES",
    "Corpus",
    "TrainConfig",
    "stdlib_corpus",
    "text_corpus",
    "train_tokenizer",
    "encode",
    "prepare",
    "load_prepared",
    "fit",
    "evaluate",
    "bigram_loss",
    "export",
    "train",
    "batches",
    "init_for_training",
    "write_heldout_text",
    "read_heldout_text",
    "heldout_prompts",
    "measure_acceptance",
    "report",
    "write_cards",
    "model_card",
    "FILE_MARK",
    "PAIR",
    "SAMPLE_PROMPTS",
    "STAMPED_FILES",
    "folder_provenance",
    "stamp_provenance",
    "token_windows",
]


if __name__ == "__main__":  # python -m replaylab.train {report,cards} data/models
    if sys.argv[1:2] not in (["report"], ["cards"]) or len(sys.argv) != 3:
        sys.exit("usage: python -m replaylab.train {report,cards} MODELS_DIR")
    if sys.argv[1] == "cards":
        write_cards(sys.argv[2])
    else:
        report(sys.argv[2], command="python -m replaylab.train report " + sys.argv[2])
