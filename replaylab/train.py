"""Train the library's hybrid model (NemotronH layout) on code: corpus, tokenizer, training loop,
evaluation, and export to a folder that transformers loads.

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
"""

from __future__ import annotations

import hashlib
import json
import math
import platform
import sys
import sysconfig
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from tqdm.auto import tqdm

from replaylab.model import HybridConfig, HybridLM, to_transformers_nemotron_h

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
]

SPECIAL_TOKENS = ("<|endoftext|>", "<|pad|>")
EOS, PAD = 0, 1  # their ids: the tokenizer's first entries

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


# ------------------------------------------------------------------------------------ corpus


@dataclass
class Corpus:
    """Texts with names, split into train and held-out."""

    train_names: list[str]
    train_texts: list[str]
    heldout_names: list[str]
    heldout_texts: list[str]
    source: str = ""
    heldout_every: int = 50
    skipped: list[str] = field(default_factory=list)  # files that are not UTF-8 text

    def manifest(self) -> dict:
        """The file list, split and sizes (what a model card cites)."""
        return dict(
            source=self.source,
            rule=f"held out: files whose sha256(relative path) is 0 mod {self.heldout_every}",
            train=self.train_names,
            heldout=self.heldout_names,
            skipped_not_utf8=self.skipped,
            train_chars=sum(map(len, self.train_texts)),
            heldout_chars=sum(map(len, self.heldout_texts)),
        )


def _held_out(name: str, every: int) -> bool:
    return int(hashlib.sha256(name.encode()).hexdigest(), 16) % every == 0


def stdlib_corpus(root=None, heldout_every=50) -> Corpus:
    """The ``*.py`` files of the Python standard library at ``root`` (this interpreter's by
    default; site-packages excluded), sorted by relative path; a file is held out when
    sha256(its relative path) is 0 mod ``heldout_every`` (about 2%)."""
    root = Path(root or sysconfig.get_paths()["stdlib"])
    names, texts, skipped = [], [], []
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root).as_posix()
        if "site-packages" in rel or "dist-packages" in rel:
            continue
        try:
            texts.append(path.read_text(encoding="utf-8"))
            names.append(rel)
        except (UnicodeDecodeError, OSError):
            skipped.append(rel)
    source = f"Python {platform.python_version()} standard library at {root}"
    corpus = text_corpus(dict(zip(names, texts)), heldout_every, source)
    corpus.skipped = skipped
    return corpus


def text_corpus(texts: dict, heldout_every=50, source="texts") -> Corpus:
    """A corpus of ``{name: text}`` split by name as ``stdlib_corpus`` does. Raises ValueError
    when there is no text to train on."""
    items = sorted((n, t) for n, t in texts.items() if t)
    train = [(n, t) for n, t in items if not _held_out(n, heldout_every)]
    heldout = [(n, t) for n, t in items if _held_out(n, heldout_every)]
    if not train:
        raise ValueError(
            f"corpus: no text to train on ({len(texts)} texts given, "
            f"{len(items)} non-empty, {len(heldout)} of them held out)"
        )
    return Corpus(
        [n for n, _ in train],
        [t for _, t in train],
        [n for n, _ in heldout],
        [t for _, t in heldout],
        source,
        heldout_every,
    )


# --------------------------------------------------------------------------------- tokenizer


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
        device=_device_name("cpu"),
        versions=_versions(),
        date=_now(),
        command=f"replaylab.train.prepare(corpus, {str(folder)!r})",
    )
    (folder / "corpus.json").write_text(json.dumps(manifest, indent=1))
    return folder


def _now() -> str:
    import datetime

    return datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")


FILE_MARK = "# ===== replaylab held-out file: "


def write_heldout_text(corpus: Corpus, path):
    """The held-out files in one text file, each after a ``FILE_MARK`` line with its name
    (gzip-compressed when ``path`` ends in .gz)."""
    parts = [f"{FILE_MARK}{n}\n{t}" for n, t in zip(corpus.heldout_names, corpus.heldout_texts)]
    data = ("\n".join(parts) + "\n").encode("utf-8")
    if str(path).endswith(".gz"):
        import gzip

        data = gzip.compress(data, mtime=0)
    Path(path).write_bytes(data)


def read_heldout_text(path) -> dict:
    """``{name: text}`` from a file ``write_heldout_text`` wrote."""
    data = Path(path).read_bytes()
    if str(path).endswith(".gz"):
        import gzip

        data = gzip.decompress(data)
    text = data.decode("utf-8")
    out = {}
    for chunk in text.split(FILE_MARK)[1:]:
        name, _, body = chunk.partition("\n")
        out[name] = body[:-1] if body.endswith("\n") else body  # the joining newline
    return out


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


# ---------------------------------------------------------------------------------- training


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


def _windows(ids, seq_len):
    """The stream cut into non-overlapping windows of seq_len + 1 ids: (n, seq_len + 1)."""
    n = (len(ids) - 1) // seq_len
    if n < 1:
        raise ValueError(
            f"corpus: {len(ids)} ids, fewer than one training window of {seq_len + 1}; "
            f"use a shorter seq_len or more text"
        )
    idx = np.arange(n)[:, None] * seq_len + np.arange(seq_len + 1)[None]
    return torch.from_numpy(ids[idx].astype(np.int64))


def batches(ids, cfg: TrainConfig):
    """Yields (step, batch (batch_size, seq_len + 1)): the windows in an order fixed by
    ``cfg.seed``, a fresh permutation each pass over the data."""
    windows = _windows(ids, cfg.seq_len)
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


@torch.no_grad()
def evaluate(model: HybridLM, ids, seq_len=512, batch_size=16, device=None) -> dict:
    """Mean next-token cross-entropy (nats) of ``model`` over the stream ``ids`` cut into
    non-overlapping windows (each predicted from its own start): ``{"loss", "perplexity",
    "tokens"}``."""
    device = device or next(model.parameters()).device
    model.eval()
    windows = _windows(ids, min(seq_len, len(ids) - 1))
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


# ------------------------------------------------------------------------------------ export


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


def _versions() -> dict:
    import tokenizers
    import transformers

    out = dict(
        python=platform.python_version(),
        torch=torch.__version__,
        transformers=transformers.__version__,
        tokenizers=tokenizers.__version__,
    )
    if torch.cuda.is_available():
        out["cuda"] = torch.version.cuda
    return out


def _device_name(device) -> str:
    if str(device).startswith("cuda"):
        return torch.cuda.get_device_name(torch.device(device))
    return f"CPU ({platform.processor() or platform.machine()}, {torch.get_num_threads()} threads)"


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
            device=_device_name(device),
            versions=_versions(),
            date=started,
            command=command or "replaylab.train.train(...)",
            weights_dtype=str(save_dtype).replace("torch.", ""),
        ),
    )
    export(model, tok, out, save_dtype, {"train_log.json": json.dumps(log, indent=1)})
    return log


# ------------------------------------------------------------------------ draft acceptance


def heldout_prompts(texts: dict, tokenizer, n=16, context_chars=1500, max_tokens=256):
    """Prompts cut from held-out files, in name order: for each file, the text up to the end of
    the first ``def`` line (top level or in a class) at or after ``context_chars`` characters,
    without its newline (as the tokenizer saw such lines in training, the newline belongs to
    the next line's indentation), the last ``max_tokens`` tokens of it. The model then writes
    that function's body.
    Returns ``[(name, ids)]`` for the first ``n`` files that have such a line."""
    import re

    out = []
    for name in sorted(texts):
        text = texts[name]
        found = re.compile(r"^(    )?def .*:\n", re.M).search(text, context_chars)
        if found is None:
            continue
        ids = tokenizer.encode(text[: found.end() - 1]).ids[-max_tokens:]
        out.append((name, ids))
        if len(out) == n:
            break
    return out


@torch.no_grad()
def measure_acceptance(
    target,
    draft,
    prompts,
    n_new=64,
    k=4,
    strategy="replay",
    check_strategies=("snapshot", "recompute"),
    check_prompts=4,
    progress=False,
) -> dict:
    """Greedy speculative decoding of every prompt with the draft model and with prompt lookup
    (k drafts per round, verified greedily by ``target``) under ``strategy``, beside plain
    greedy decoding; the first ``check_prompts`` prompts again under each of
    ``check_strategies``. Returns accepted / proposed per drafter and strategy, whether every
    output equals greedy's tokens, and the greedy continuations (EOS not treated specially).
    ``prompts``: ``[(name, ids)]``."""
    from replaylab.decoding import ModelDrafter, PromptLookupDrafter, greedy, speculative

    device = next(target.parameters()).device
    rows, continuations = [], {}
    strategies = (strategy, *check_strategies)
    for i, (name, ids) in enumerate(tqdm(prompts, disable=not progress, desc="prompts")):
        prompt = torch.tensor([ids], device=device)
        ref = greedy(target, prompt, n_new, "snapshot").tokens
        continuations[name] = ref[0].tolist()
        for s in strategies if i < check_prompts else (strategy,):
            for drafter_name, drafter in (
                ("draft model", ModelDrafter(draft, s)),
                ("prompt lookup", PromptLookupDrafter()),
            ):
                run = speculative(target, prompt, n_new, drafter, k=k, cache=s)
                rows.append(
                    dict(
                        prompt=name,
                        strategy=s,
                        drafter=drafter_name,
                        proposed=run.proposed,
                        accepted=run.accepted,
                        identical=bool(torch.equal(run.tokens, ref)),
                    )
                )
    summary = {}
    for drafter_name in ("draft model", "prompt lookup"):
        for s in strategies:
            sel = [r for r in rows if r["drafter"] == drafter_name and r["strategy"] == s]
            proposed = sum(r["proposed"] for r in sel)
            accepted = sum(r["accepted"] for r in sel)
            summary[f"{drafter_name} / {s}"] = dict(
                prompts=len(sel),
                proposed=proposed,
                accepted=accepted,
                acceptance=accepted / proposed if proposed else float("nan"),
                identical_to_greedy=all(r["identical"] for r in sel),
            )
    return dict(
        k=k,
        n_new=n_new,
        prompts=len(prompts),
        summary=summary,
        rows=rows,
        greedy=continuations,
    )


# ------------------------------------------------------------------------- the shipped pair

PAIR = ("replaylab-code-10m", "replaylab-code-draft")  # folders under data/models
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
            device=_device_name("cpu"),
            versions=_versions(),
            date=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            command=command or f"python -m replaylab.train report {models_dir}",
        ),
    )
    (models_dir / "metrics.json").write_text(json.dumps(metrics, indent=1))
    return write_cards(models_dir)


def write_cards(models_dir) -> dict:
    """Refresh ``metrics.json``'s training figures from the folders' ``train_log.json`` (and
    ``runs/``), then write both model cards from it. Measures nothing."""
    models_dir = Path(models_dir)
    metrics = json.loads((models_dir / "metrics.json").read_text())
    logs = {n: json.loads((models_dir / n / "train_log.json").read_text()) for n in PAIR}
    metrics["models"] = {
        n: {k: v for k, v in log.items() if k != "loss_curve"} for n, log in logs.items()
    }
    metrics["bigram"] = logs[PAIR[0]]["bigram"]
    runs = sorted((models_dir / "runs").glob("*.json"))
    metrics["earlier_runs"] = [_run_summary(f) for f in runs]
    (models_dir / "metrics.json").write_text(json.dumps(metrics, indent=1))
    for n in PAIR:
        (models_dir / n / "README.md").write_text(model_card(metrics, n))
        provenance = folder_provenance(metrics, n)
        (models_dir / n / "provenance.json").write_text(json.dumps(provenance, indent=1))
        stamp_provenance(models_dir / n, provenance)
    return metrics


# files of a model folder that can carry extra top-level fields (tokenizers refuses unknown
# fields in tokenizer.json, so that one is covered by provenance.json alone)
STAMPED_FILES = ("config.json", "generation_config.json", "tokenizer_config.json")


def stamp_provenance(folder, provenance: dict):
    """Write the training run's device, date and command into each JSON file of ``folder``
    that tolerates extra fields (transformers keeps them as attributes it never reads)."""
    for name in STAMPED_FILES:
        path = Path(folder) / name
        data = json.loads(path.read_text())
        data.update(
            device=provenance["device"],
            date=provenance["date"],
            command=provenance["command"],
            provenance="provenance.json (versions, and the run that measured the card)",
        )
        path.write_text(json.dumps(data, indent=2) + "\n")


def folder_provenance(metrics: dict, name: str) -> dict:
    """Where every file of a shipped model folder comes from: the training run that wrote
    config.json, generation_config.json, model.safetensors and the tokenizer files (its device,
    versions, date and command), and the CPU run that measured the card's numbers."""
    m = metrics["models"][name]["provenance"]
    return dict(
        files="config.json, generation_config.json, model.safetensors, tokenizer.json and "
        "tokenizer_config.json were written by replaylab.train.export at the end of this run; "
        "the tokenizer was trained by replaylab.train.prepare on the train split (corpus.json)",
        device=m["device"],
        versions=m["versions"],
        date=m["date"],
        command=m["command"],
        weights_dtype=m.get("weights_dtype"),
        evaluation=metrics["evaluation_provenance"],
    )


def _run_summary(path) -> dict:
    """A training run that was not shipped (its ``train_log.json`` under ``runs/``)."""
    log = json.loads(Path(path).read_text())
    return dict(
        file=f"runs/{Path(path).name}",
        command=log["provenance"]["command"],
        date=log["provenance"]["date"],
        device=log["provenance"]["device"],
        training_tokens=log["training_tokens"],
        seconds=log["seconds"],
        final_train_loss=log["loss_curve"][-1]["loss"],
        heldout_loss=log["heldout"]["loss"],
    )


def _fmt_int(n):
    return f"{n / 1e6:.2f}M" if n >= 1e6 else f"{n:,}"


def model_card(metrics: dict, name: str) -> str:
    """The model card (README.md) of ``name`` from ``metrics`` (what ``report`` measured)."""
    m = metrics["models"][name]
    target, draft = (metrics["models"][n] for n in PAIR)
    bigram, acc = metrics["bigram"], metrics["acceptance"]
    s = acc["summary"]
    role = "target" if name == PAIR[0] else "draft"
    cfg = m["model"]
    lines = [
        "---",
        "library_name: transformers",
        "license: apache-2.0",
        "tags: [nemotron_h, hybrid, mamba2, replaylab, code]",
        "---",
        "",
        f"# {name}",
        "",
        f"The {role} model of replaylab's trained pair: a hybrid (Mamba-2 + attention + MLP "
        f"blocks, NemotronH layout, pattern `{cfg['pattern']}`) trained from scratch on the "
        f"Python standard library's source. It exists to make the project's notebooks and "
        f"`replaylab generate` write real text and to give speculative decoding a real draft "
        f"model; it is a teaching artefact, not a useful code model.",
        "",
        "Load it with transformers (`AutoModelForCausalLM.from_pretrained(folder)`, "
        "`AutoTokenizer.from_pretrained(folder)`) or with replaylab:",
        "",
        "```console",
        f"replaylab generate data/models/{name} --prompt 'def fibonacci(n):' --max-new-tokens 48",
        "```",
        "",
        "## Model",
        "",
        "| | target | draft |",
        "|---|---|---|",
        f"| folder | `{PAIR[0]}` | `{PAIR[1]}` |",
        f"| parameters | {target['parameters']:,} | {draft['parameters']:,} |",
        f"| blocks (M Mamba-2, * attention, - MLP) | `{target['model']['pattern']}` "
        f"| `{draft['model']['pattern']}` |",
        f"| hidden size | {target['model']['hidden_size']} | {draft['model']['hidden_size']} |",
        f"| Mamba-2 heads x head dim, state size | {target['model']['ssm_heads']} x "
        f"{target['model']['ssm_head_dim']}, {target['model']['d_state']} | "
        f"{draft['model']['ssm_heads']} x {draft['model']['ssm_head_dim']}, "
        f"{draft['model']['d_state']} |",
        f"| vocabulary | {target['model']['vocab_size']} | {draft['model']['vocab_size']} |",
        f"| weights | {target['provenance']['weights_dtype']} | "
        f"{draft['provenance']['weights_dtype']} |",
        "",
        "Both share one tokenizer: byte-level BPE (`tokenizers`), "
        f"{target['model']['vocab_size']} entries, trained on the train split; id 0 "
        "`<|endoftext|>` (end of a file: BOS and EOS), id 1 `<|pad|>`. The embedding and the "
        "output layer were tied in training; NemotronH stores both, so the file holds both. "
        "The weights are stored in bfloat16; every number below was measured with those "
        "rounded weights.",
        "",
        "## Corpus and split",
        "",
        f"{m['corpus']['source']}: every `*.py` file outside site-packages that reads as "
        f"UTF-8, sorted by relative path; {m['corpus']['rule']}. "
        f"Train: {m['corpus']['train_files']} files, {_fmt_int(m['train_split_tokens'])} tokens; "
        f"held out: {m['corpus']['heldout_files']} files, "
        f"{_fmt_int(m['heldout_split_tokens'])} tokens. The file lists are in "
        "`data/models/corpus.json`, the held-out text in `data/models/heldout.txt.gz` (so the "
        "evaluation does not depend on the local Python). Each file's tokens are followed by "
        "`<|endoftext|>`; training windows of "
        f"{m['train']['seq_len']} + 1 tokens are cut from that stream and visited in an order "
        f"fixed by the seed ({m['train']['seed']}).",
        "",
        "## Training",
        "",
        "| | target | draft |",
        "|---|---|---|",
        f"| steps x batch x window | {target['train']['steps']} x "
        f"{target['train']['batch_size']} x {target['train']['seq_len']} | "
        f"{draft['train']['steps']} x {draft['train']['batch_size']} x "
        f"{draft['train']['seq_len']} |",
        f"| training tokens | {_fmt_int(target['training_tokens'])} "
        f"({target['training_tokens'] / target['train_split_tokens']:.1f} passes) | "
        f"{_fmt_int(draft['training_tokens'])} "
        f"({draft['training_tokens'] / draft['train_split_tokens']:.1f} passes) |",
        f"| peak learning rate (AdamW, warm-up, cosine) | {target['train']['lr']} | "
        f"{draft['train']['lr']} |",
        f"| training time | {target['seconds']:.0f} s | {draft['seconds']:.0f} s |",
        f"| device | {target['provenance']['device']} | {draft['provenance']['device']} |",
        f"| date | {target['provenance']['date']} | {draft['provenance']['date']} |",
        "",
        "Versions: "
        + ", ".join(f"{k} {v}" for k, v in target["provenance"]["versions"].items())
        + ". bf16 autocast, fp32 master weights. Commands (`--data` is the folder that "
        "`replaylab.train.prepare(stdlib_corpus(), '.trainprep')` wrote on Python "
        f"{metrics['evaluation_provenance']['versions']['python']}; `replaylab train "
        ".trainprep --prepare-only` makes the same call):",
        "",
        "```console",
        target["provenance"]["command"],
        draft["provenance"]["command"],
        "```",
        "",
        "The loss curves (train loss every 10 steps; the target's held-out loss on the first "
        "32k held-out tokens every 100 steps) are in each folder's `train_log.json`.",
        "",
    ]
    for run in metrics.get("earlier_runs", []):
        lines += [
            f"An earlier target run, not shipped (`data/models/{run['file']}`): "
            f"`{run['command']}` ({run['device']}, {run['date']}, {run['seconds']:.0f} s, "
            f"{_fmt_int(run['training_tokens'])} tokens) ended at train loss "
            f"{run['final_train_loss']:.3f} but held-out loss {run['heldout_loss']:.3f}: "
            "it had memorised the training split over "
            f"{run['training_tokens'] / target['train_split_tokens']:.0f} passes. The "
            "shipped target is the shorter run above.",
            "",
        ]
    lines += [
        "## Held-out loss",
        "",
        "Next-token cross-entropy in nats per token over the whole held-out split "
        f"({_fmt_int(m['heldout_split_tokens'])} tokens, windows of {m['train']['seq_len']}):",
        "",
        "| model | loss | perplexity |",
        "|---|---|---|",
        f"| target `{PAIR[0]}` | {target['heldout']['loss']:.3f} | "
        f"{target['heldout']['perplexity']:.2f} |",
        f"| draft `{PAIR[1]}` | {draft['heldout']['loss']:.3f} | "
        f"{draft['heldout']['perplexity']:.2f} |",
        f"| bigram baseline (train counts, smoothing alpha={bigram['alpha']:g} picked on the "
        f"held-out text) | {bigram['loss']:.3f} | {bigram['perplexity']:.2f} |",
        "",
        "## Speculative decoding: acceptance at k = 4",
        "",
        f"{acc['prompts']} prompts cut from the held-out files (each ends with a `def` line; "
        f"`replaylab.train.heldout_prompts`), {acc['n_new']} new tokens each, greedy "
        f"verification by the target, k = {acc['k']} drafts per round, under replay; the "
        "first prompts again under snapshot and recompute (the tokens, hence the acceptance, "
        "do not depend on the strategy: the check is that they do not). Acceptance is "
        "accepted / proposed drafts; 'identical' says whether every output equals plain "
        "greedy decoding's tokens.",
        "",
        "| drafter | strategy | prompts | accepted / proposed | acceptance | identical to greedy |",
        "|---|---|---|---|---|---|",
    ]
    for key, row in s.items():
        drafter, strategy = key.split(" / ")
        lines.append(
            f"| {drafter} | {strategy} | {row['prompts']} | {row['accepted']} / {row['proposed']} | "
            f"{row['acceptance']:.2f} | {'yes' if row['identical_to_greedy'] else 'NO'} |"
        )
    ev = metrics["evaluation_provenance"]
    lines += [
        "",
        f"Measured on {ev['device']}, {ev['date']}, "
        + ", ".join(f"{k} {v}" for k, v in ev["versions"].items())
        + f", with `{ev['command']}`.",
        "",
        "## Greedy samples",
        "",
        "The target, greedy, at most 48 new tokens, stopping at `<|endoftext|>` "
        "(`replaylab generate --prompt ...`):",
        "",
    ]
    for sample in metrics["samples"]:
        lines += ["```text", sample["prompt"] + sample["text"], "```", ""]
    lines += [
        "## Limits",
        "",
        "Ten million parameters and a few passes over 10M tokens of one code base: the "
        "model writes code-shaped text with plausible names and indentation, and repeats "
        "itself. It knows nothing outside the standard library's style. Not for any use "
        "beyond teaching how hybrid models decode.",
        "",
        f"The {role} model's card is generated by `replaylab.train.report`; the numbers are "
        "in `data/models/metrics.json`.",
        "",
    ]
    return "\n".join(lines)


if __name__ == "__main__":  # python -m replaylab.train {report,cards} data/models
    if sys.argv[1:2] not in (["report"], ["cards"]) or len(sys.argv) != 3:
        sys.exit("usage: python -m replaylab.train {report,cards} MODELS_DIR")
    if sys.argv[1] == "cards":
        write_cards(sys.argv[2])
    else:
        report(sys.argv[2], command="python -m replaylab.train report " + sys.argv[2])
