"""The ``replaylab`` command (also ``python -m replaylab``).

replaylab generate CHECKPOINT_DIR (--prompt TEXT | --prompt-ids 1,2,3) [--max-new-tokens 32]
          [--strategy NAME] [--checkpoint-interval 16] [--log-length 16]
          [--draft none|prompt-lookup|DRAFT_DIR] [--k 4] [--ignore-eos] [--json]
    --prompt: prints the prompt and the generated text, then what the run cost;
    --prompt-ids (or --json): one JSON object with the generated ids and what the run cost
replaylab train OUT_DIR [--size target|draft|smoke] [--steps N] [--device cuda] ...
    trains a tokenizer and a hybrid on the Python standard library; writes a folder that
    transformers loads
replaylab bench {kernels,sweep,decode} ...
    the benchmarks (``replaylab bench --help``); results go to data/ with provenance
"""

from __future__ import annotations

import argparse
import json
import sys

__all__ = ["main", "build_parser"]


def _ids(text):
    try:
        return [int(t) for t in text.replace(" ", "").split(",") if t]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected comma-separated integers, got {text!r}"
        ) from None


def _add_generate(sub):
    from replaylab.strategies import STRATEGY_NAMES

    gen = sub.add_parser(
        "generate",
        help="decode a NemotronH or Bamba checkpoint folder",
        description="Greedy or speculative decoding of a transformers "
        "checkpoint folder; prints the text (or the tokens, as JSON) and the run's costs.",
    )
    gen.add_argument("checkpoint")
    prompt = gen.add_mutually_exclusive_group(required=True)
    prompt.add_argument("--prompt", help="text, encoded with the folder's tokenizer.json")
    prompt.add_argument("--prompt-ids", type=_ids, help="comma-separated token ids")
    gen.add_argument("--max-new-tokens", type=int, default=32)
    gen.add_argument("--strategy", choices=STRATEGY_NAMES, default="replay")
    gen.add_argument(
        "--checkpoint-interval",
        type=int,
        default=16,
        help="recompute: a checkpoint every this many tokens",
    )
    gen.add_argument(
        "--log-length",
        type=int,
        default=16,
        help="replay: fold the log into the checkpoint at this length",
    )
    gen.add_argument(
        "--draft", default="none", help="none (greedy), prompt-lookup, or a draft checkpoint folder"
    )
    gen.add_argument("--k", type=int, default=4, help="draft length")
    gen.add_argument("--device", default=None)
    gen.add_argument(
        "--engine",
        choices=("auto", "on", "off"),
        default="auto",
        help="decode with the serving engine (auto: on a GPU for the layouts it serves)",
    )
    gen.add_argument(
        "--ignore-eos",
        action="store_true",
        help="decode max-new-tokens tokens even past the checkpoint's end-of-sequence token",
    )
    gen.add_argument("--json", action="store_true", help="print one JSON object (ids, text, costs)")
    gen.set_defaults(run=_generate)


def _generate(args):
    from replaylab.cache import CacheConfig
    from replaylab.generate import generate

    try:
        config = CacheConfig(
            args.strategy, checkpoint_interval=args.checkpoint_interval, log_length=args.log_length
        )
        run = generate(
            args.checkpoint,
            args.prompt_ids,
            args.max_new_tokens,
            config,
            args.draft,
            args.k,
            args.device,
            progress=sys.stderr.isatty(),
            prompt=args.prompt,
            stop_at_eos=not args.ignore_eos,
            engine={"auto": "auto", "on": True, "off": False}[args.engine],
        )
    except (ValueError, OSError) as err:
        print(f"replaylab generate: {err}", file=sys.stderr)
        return 2
    stats = dict(
        tokens=run.tokens[0].tolist(),
        strategy=run.strategy,
        draft=args.draft,
        proposed=run.proposed,
        accepted=run.accepted,
        restores=run.restores,
        rollback_seconds=run.restore_seconds,
        peak_bytes=run.peak_bytes,
        seconds=run.seconds,
        stopped_at_eos=run.extra["stopped_at_eos"],
        decoded_tokens=run.extra["decoded_tokens"],
    )
    if "text" in run.extra:
        stats["text"] = run.extra["text"]
    if args.prompt is None or args.json:
        print(json.dumps(stats))
        return 0
    print(run.extra["prompt_text"] + run.extra["text"])
    n = run.tokens.shape[1]
    line = (
        f"--- {n} new tokens ({run.strategy}, draft {args.draft}) in {run.seconds:.2f} s, "
        f"{run.extra['decoded_tokens'] / max(run.seconds, 1e-9):.1f} tokens/s decoded; "
        f"stopped at EOS: {'yes' if run.extra['stopped_at_eos'] else 'no'}"
    )
    if run.proposed:
        line += (
            f"; drafts accepted {run.accepted}/{run.proposed} ({run.acceptance_rate:.2f}), "
            f"restores {run.restores}"
        )
    print(line + f"; peak cache {run.peak_bytes / 2**20:.2f} MiB")
    return 0


def _add_train(sub):
    from replaylab.train import MODEL_SIZES, TrainConfig

    d = TrainConfig()
    tr = sub.add_parser(
        "train",
        help="train a hybrid (NemotronH layout) on the Python standard library's source",
        description="Train a byte-level BPE tokenizer and a hybrid model on a corpus (default: "
        "this Python's standard library, about 2%% of files held out), evaluate it on the "
        "held-out files beside a bigram baseline, and write a folder that transformers loads.",
    )
    tr.add_argument("out", help="folder to write (config.json, model.safetensors, tokenizer...)")
    tr.add_argument("--size", choices=sorted(MODEL_SIZES), default="target")
    tr.add_argument(
        "--data", default=None, help="a folder written by replaylab.train.prepare (ids, tokenizer)"
    )
    tr.add_argument(
        "--corpus",
        nargs="*",
        default=None,
        help="text files or folders of *.py files to train on instead of the standard library",
    )
    tr.add_argument(
        "--heldout-every",
        type=int,
        default=50,
        help="--corpus: hold out files whose sha256(name) is 0 mod this (default 50: ~2%%)",
    )
    tr.add_argument("--vocab-size", type=int, default=2048)
    tr.add_argument("--steps", type=int, default=d.steps)
    tr.add_argument("--batch-size", type=int, default=d.batch_size)
    tr.add_argument("--seq-len", type=int, default=d.seq_len)
    tr.add_argument("--lr", type=float, default=d.lr)
    tr.add_argument("--warmup", type=int, default=d.warmup)
    tr.add_argument("--seed", type=int, default=d.seed)
    tr.add_argument(
        "--eval-every", type=int, default=0, help="held-out loss every this many steps (0: never)"
    )
    tr.add_argument("--device", default="cpu")
    tr.add_argument("--save-dtype", choices=["bfloat16", "float32"], default="bfloat16")
    tr.add_argument(
        "--prepare-only",
        action="store_true",
        help="only train the tokenizer and write the token ids and the split to OUT "
        "(a folder for --data: the same data on every machine)",
    )
    tr.set_defaults(run=_train)


def _read_corpus(paths, heldout_every):
    from pathlib import Path

    from replaylab.train import text_corpus

    texts = {}
    for p in map(Path, paths):
        files = sorted(p.rglob("*.py")) if p.is_dir() else [p]
        for f in files:
            texts[f.as_posix()] = f.read_text(encoding="utf-8")
    return text_corpus(texts, heldout_every, source=f"files: {' '.join(paths)}")


def _train(args):
    import torch

    from replaylab.train import TrainConfig, train

    try:
        config = TrainConfig(
            steps=args.steps,
            batch_size=args.batch_size,
            seq_len=args.seq_len,
            lr=args.lr,
            warmup=args.warmup,
            seed=args.seed,
            eval_every=args.eval_every,
        )
        corpus = _read_corpus(args.corpus, args.heldout_every) if args.corpus is not None else None
        if args.prepare_only:
            from replaylab.train import prepare, stdlib_corpus

            prepare(corpus if corpus is not None else stdlib_corpus(), args.out, args.vocab_size)
            print(json.dumps(dict(out=str(args.out), prepared=True)))
            return 0
        log = train(
            args.out,
            args.size,
            data=args.data,
            corpus=corpus,
            vocab_size=args.vocab_size,
            config=config,
            device=args.device,
            progress=sys.stderr.isatty(),
            save_dtype=getattr(torch, args.save_dtype),
            command="replaylab train " + " ".join(args.argv),
        )
    except (ValueError, OSError) as err:
        print(f"replaylab train: {err}", file=sys.stderr)
        return 2
    held, bigram = log["heldout"] or {}, log["bigram"] or {}
    print(
        json.dumps(
            dict(
                out=str(args.out),
                parameters=log["parameters"],
                training_tokens=log["training_tokens"],
                final_train_loss=log["loss_curve"][-1]["loss"],
                heldout_loss=held.get("loss"),
                bigram_loss=bigram.get("loss"),
                seconds=log["seconds"],
            )
        )
    )
    return 0


def build_parser() -> argparse.ArgumentParser:
    from replaylab import __version__
    from replaylab.bench.cli import add_bench_parser

    parser = argparse.ArgumentParser(prog="replaylab", description=__doc__.split("\n\n")[0])
    parser.add_argument("--version", action="version", version=f"replaylab {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="{generate,train,bench}")
    _add_generate(sub)
    _add_train(sub)
    add_bench_parser(sub)
    return parser


def main(argv=None):
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(argv)
    args.argv = argv[1:]  # after the subcommand: what a result's provenance records
    if args.command == "bench":
        from replaylab.bench.cli import run_parsed

        return run_parsed(args)
    return args.run(args)


if __name__ == "__main__":
    sys.exit(main())
