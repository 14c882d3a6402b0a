"""The training loop: the configuration, the fixed data order, Mamba's initialisation of the SSM
scalars, and ``fit`` (AdamW, warm-up then cosine decay, gradient clipping)."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from tqdm.auto import tqdm

from replaylab.model import HybridLM
from replaylab.training.evaluate import evaluate, token_windows
from replaylab.validation import as_int, as_real


@dataclass
class TrainConfig:
    steps: int = 1000
    batch_size: int = 64
    seq_len: int = 512
    lr: float = 2e-3
    min_lr_ratio: float = 0.1  # cosine decay to lr * min_lr_ratio
    warmup: int = 100
    weight_decay: float = 0.1
    grad_clip: float = 1.0
    seed: int = 0
    log_every: int = 10
    eval_every: int = 0  # held-out loss on eval_tokens every this many steps (0: never)
    eval_tokens: int = 32768

    def __post_init__(self):
        for name, low in (("steps", 1), ("batch_size", 1), ("seq_len", 1), ("warmup", 0),
                          ("seed", 0), ("log_every", 1), ("eval_every", 0), ("eval_tokens", 1)):  # fmt: skip
            as_int(name, getattr(self, name), low=low)
        as_real("lr", self.lr, above=0)
        as_real("min_lr_ratio", self.min_lr_ratio, 0, 1)
        as_real("weight_decay", self.weight_decay, low=0)
        as_real("grad_clip", self.grad_clip, above=0)


def batches(ids, cfg: TrainConfig):
    """Yields (step, batch (batch_size, seq_len + 1)): the windows in an order fixed by
    ``cfg.seed``, a fresh permutation each pass over the data."""
    windows = token_windows(ids, cfg.seq_len)
    g = torch.Generator().manual_seed(cfg.seed)
    order, pos = torch.randperm(len(windows), generator=g), 0
    for step in range(cfg.steps):
        rows = []
        while len(rows) < cfg.batch_size:
            if pos == len(order):
                order, pos = torch.randperm(len(windows), generator=g), 0
            take = min(cfg.batch_size - len(rows), len(order) - pos)
            rows.extend(order[pos : pos + take].tolist())
            pos += take
        yield step, windows[rows]


def init_for_training(model: HybridLM, seed=0):
    """Mamba's initialisation of the SSM scalars on top of ``init_weights``: Δ log-uniform in
    [1e-3, 1e-1] through dt_bias (inverse softplus), A = -(1..16), D = 1."""
    g = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for block in model.model.layers:
            mixer = block.mixer
            if not hasattr(mixer, "dt_bias"):
                continue
            H = mixer.dt_bias.numel()
            u = torch.rand(H, generator=g)
            dt = torch.exp(math.log(1e-3) + u * (math.log(0.1) - math.log(1e-3)))
            mixer.dt_bias.copy_(dt + torch.log(-torch.expm1(-dt)))
            mixer.A_log.copy_(torch.log(torch.empty(H).uniform_(1, 16, generator=g)))
            mixer.D.fill_(1.0)
    return model


def _lr_at(step, cfg: TrainConfig):
    if step < cfg.warmup:
        return cfg.lr * (step + 1) / cfg.warmup
    t = (step - cfg.warmup) / max(1, cfg.steps - cfg.warmup)
    return cfg.lr * (cfg.min_lr_ratio + (1 - cfg.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * t)))


def fit(
    model: HybridLM, ids, cfg: TrainConfig, device="cpu", progress=True, eval_ids=None
) -> list[dict]:
    """Train ``model`` on the stream ``ids`` with AdamW (weight decay on matrices only), linear
    warm-up then cosine decay, gradient clipping, bf16 autocast on CUDA. Returns the loss
    curve: ``[{"step", "loss", "lr", "tokens", "seconds"}]`` every ``log_every`` steps, with
    ``heldout_loss`` on the first ``eval_tokens`` of ``eval_ids`` every ``eval_every`` steps."""
    torch.manual_seed(cfg.seed)
    model.to(device).train()
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    other = [p for n, p in model.named_parameters() if p.dim() < 2]
    opt = torch.optim.AdamW(
        [dict(params=decay, weight_decay=cfg.weight_decay), dict(params=other, weight_decay=0.0)],
        lr=cfg.lr,
        betas=(0.9, 0.95),
        eps=1e-8,
    )
    amp = torch.autocast("cuda", dtype=torch.bfloat16) if str(device).startswith("cuda") else None
    curve, running, t0 = [], [], time.perf_counter()
    bar = tqdm(total=cfg.steps, disable=not progress, desc="train", mininterval=2.0)
    for step, batch in batches(ids, cfg):
        batch = batch.to(device, non_blocking=True)
        for group in opt.param_groups:
            group["lr"] = _lr_at(step, cfg)
        if amp is not None:
            with amp:
                logits = model(batch[:, :-1], None)
        else:
            logits = model(batch[:, :-1], None)
        loss = F.cross_entropy(logits.float().flatten(0, 1), batch[:, 1:].flatten())
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
        opt.step()
        running.append(loss.detach())
        if (step + 1) % cfg.log_every == 0 or step + 1 == cfg.steps:
            mean = float(torch.stack(running).mean())  # waits for the device
            running = []
            curve.append(
                dict(
                    step=step + 1,
                    loss=mean,
                    lr=_lr_at(step, cfg),
                    tokens=(step + 1) * cfg.batch_size * cfg.seq_len,
                    seconds=time.perf_counter() - t0,
                )
            )
            if cfg.eval_every and eval_ids is not None and (step + 1) % cfg.eval_every == 0:
                head = eval_ids[: cfg.eval_tokens + 1]
                curve[-1]["heldout_loss"] = evaluate(model, head, cfg.seq_len)["loss"]
                model.train()
            bar.set_postfix(loss=f"{mean:.3f}")
        bar.update(1)
    bar.close()
    return curve
