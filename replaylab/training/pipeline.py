"""``train``: the whole pipeline from corpus to an exported model folder with its training log,
and the model sizes it trains."""

from __future__ import annotations

import json
import time
from dataclasses import asdict

import torch

from replaylab.model import HybridConfig, HybridLM
from replaylab.training.corpus import stdlib_corpus
from replaylab.training.evaluate import bigram_loss, evaluate
from replaylab.training.export import export
from replaylab.training.loop import TrainConfig, fit, init_for_training
from replaylab.training.provenance import device_name, versions
from replaylab.training.tokenizer import encode, load_prepared, train_tokenizer

# HybridConfig fields of the trained models (vocab_size comes from the tokenizer)
MODEL_SIZES = {
    # about 10M parameters: 5 Mamba-2, 1 attention, 5 MLP blocks
    "target": dict(
        hidden_size=384,
        pattern="M-M-M*-M-M-",
        ssm_heads=12,
        ssm_head_dim=64,
        d_state=64,
        n_groups=1,
        attn_heads=6,
        kv_heads=2,
        head_dim=64,
        intermediate_size=1088,
        tie_word_embeddings=True,
    ),
    # about 1.4M parameters: the draft model
    "draft": dict(
        hidden_size=192,
        pattern="M-M*-",
        ssm_heads=6,
        ssm_head_dim=64,
        d_state=32,
        n_groups=1,
        attn_heads=4,
        kv_heads=2,
        head_dim=48,
        intermediate_size=512,
        tie_word_embeddings=True,
    ),
    # CI's smoke test: trains in seconds on a CPU
    "smoke": dict(
        hidden_size=32,
        pattern="M*-",
        ssm_heads=2,
        ssm_head_dim=16,
        d_state=8,
        n_groups=1,
        attn_heads=2,
        kv_heads=1,
        head_dim=16,
        intermediate_size=64,
        tie_word_embeddings=True,
    ),
}


def train(
    out,
    size="target",
    data=None,
    corpus=None,
    vocab_size=2048,
    config: TrainConfig | None = None,
    device="cpu",
    progress=True,
    save_dtype=torch.bfloat16,
    command=None,
) -> dict:
    """The whole pipeline: corpus -> tokenizer -> ids (or a ``prepare`` folder ``data``), a
    model of ``size`` (a ``MODEL_SIZES`` name or a dict of ``HybridConfig`` fields) trained
    with ``config`` on ``device``, held-out loss beside the bigram baseline, and ``out`` written
    by ``export`` with ``train_log.json`` (loss curve, metrics, provenance). ``corpus``: a
    ``Corpus`` (default: ``stdlib_corpus()``). Returns the log."""
    config = config or TrainConfig()
    started = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    if data is not None:
        tok, train_ids, heldout_ids, manifest = load_prepared(data)
    else:
        corpus = corpus if corpus is not None else stdlib_corpus()
        tok = train_tokenizer(corpus.train_texts, vocab_size)
        train_ids, heldout_ids = encode(tok, corpus.train_texts), encode(tok, corpus.heldout_texts)
        manifest = corpus.manifest()
    fields = dict(MODEL_SIZES[size]) if isinstance(size, str) else dict(size)
    fields["vocab_size"] = tok.get_vocab_size()
    model = init_for_training(HybridLM(HybridConfig(**fields), seed=config.seed), config.seed)
    n_params = sum(p.numel() for p in model.parameters())  # tied weights count once
    t0 = time.perf_counter()
    curve = fit(model, train_ids, config, device, progress, heldout_ids)
    if str(device).startswith("cuda"):
        torch.cuda.synchronize()
    seconds = time.perf_counter() - t0
    # evaluate the weights as they are shipped (rounded to save_dtype)
    model = model.to(save_dtype).float()
    heldout = evaluate(model, heldout_ids, config.seq_len) if len(heldout_ids) > 1 else None
    log = dict(
        model=fields,
        parameters=n_params,
        train=asdict(config),
        training_tokens=config.steps * config.batch_size * config.seq_len,
        train_split_tokens=int(len(train_ids)),
        heldout_split_tokens=int(len(heldout_ids)),
        heldout=heldout,
        bigram=bigram_loss(train_ids, heldout_ids, fields["vocab_size"])
        if len(heldout_ids) > 1
        else None,
        loss_curve=curve,
        seconds=seconds,
        corpus=dict(
            source=manifest["source"],
            rule=manifest["rule"],
            train_files=len(manifest["train"]),
            heldout_files=len(manifest["heldout"]),
        ),
        provenance=dict(
            device=device_name(device),
            versions=versions(),
            date=started,
            command=command or "replaylab.train.train(...)",
            weights_dtype=str(save_dtype).replace("torch.", ""),
        ),
    )
    export(model, tok, out, save_dtype, {"train_log.json": json.dumps(log, indent=1)})
    return log
