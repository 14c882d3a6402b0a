"""Held-out loss of a model over a token stream, and the bigram baseline it is compared with."""

from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn.functional as F

from replaylab.model import HybridLM


def token_windows(ids, seq_len):
    """The stream cut into non-overlapping windows of seq_len + 1 ids: (n, seq_len + 1)."""
    n = (len(ids) - 1) // seq_len
    if n < 1:
        raise ValueError(
            f"corpus: {len(ids)} ids, fewer than one training window of {seq_len + 1}; "
            f"use a shorter seq_len or more text"
        )
    idx = np.arange(n)[:, None] * seq_len + np.arange(seq_len + 1)[None]
    return torch.from_numpy(ids[idx].astype(np.int64))


@torch.no_grad()
def evaluate(model: HybridLM, ids, seq_len=512, batch_size=16, device=None) -> dict:
    """Mean next-token cross-entropy (nats) of ``model`` over the stream ``ids`` cut into
    non-overlapping windows (each predicted from its own start): ``{"loss", "perplexity",
    "tokens"}``."""
    device = device or next(model.parameters()).device
    model.eval()
    windows = token_windows(ids, min(seq_len, len(ids) - 1))
    total, count = 0.0, 0
    for i in range(0, len(windows), batch_size):
        batch = windows[i : i + batch_size].to(device)
        logits = model(batch[:, :-1], None).float()
        total += float(
            F.cross_entropy(logits.flatten(0, 1), batch[:, 1:].flatten(), reduction="sum")
        )
        count += batch[:, 1:].numel()
    return dict(loss=total / count, perplexity=math.exp(total / count), tokens=count)


def bigram_loss(train_ids, heldout_ids, vocab_size, alphas=(0.1, 1.0, 10.0, 100.0, 1000.0)) -> dict:
    """The bigram baseline's held-out cross-entropy: p(b | a) = (c(a, b) + alpha p(b)) /
    (c(a) + alpha) from train counts, p(b) add-one unigrams. Reports the best alpha of
    ``alphas`` on the held-out text itself (which flatters the baseline)."""
    a, b = train_ids[:-1].astype(np.int64), train_ids[1:].astype(np.int64)
    counts = np.bincount(a * vocab_size + b, minlength=vocab_size**2).reshape(vocab_size, -1)
    uni = np.bincount(train_ids.astype(np.int64), minlength=vocab_size) + 1.0
    uni = uni / uni.sum()
    x, y = heldout_ids[:-1].astype(np.int64), heldout_ids[1:].astype(np.int64)
    best = None
    for alpha in alphas:
        p = (counts[x, y] + alpha * uni[y]) / (counts[x].sum(1) + alpha)
        loss = float(-np.log(p).mean())
        if best is None or loss < best["loss"]:
            best = dict(loss=loss, perplexity=math.exp(loss), alpha=alpha, tokens=len(y))
    return best
