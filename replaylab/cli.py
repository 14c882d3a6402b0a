"""The ``replaylab`` command (also ``python -m replaylab``).

replaylab generate CHECKPOINT_DIR --prompt-ids 1,2,3 [--max-new-tokens 32]
          [--strategy NAME] [--checkpoint-interval 16] [--log-length 16]
          [--draft none|prompt-lookup|DRAFT_DIR] [--k 4]
    prints one JSON object: the generated ids and what the run cost
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
        "checkpoint folder; prints the tokens and the run's costs as JSON.",
    )
    gen.add_argument("checkpoint")
    gen.add_argument("--prompt-ids", type=_ids, required=True)
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
        )
    except (ValueError, OSError) as err:
        print(f"replaylab generate: {err}", file=sys.stderr)
        return 2
    print(
        json.dumps(
            dict(
                tokens=run.tokens[0].tolist(),
                strategy=run.strategy,
                draft=args.draft,
                proposed=run.proposed,
                accepted=run.accepted,
                restores=run.restores,
                rollback_seconds=run.restore_seconds,
                peak_bytes=run.peak_bytes,
                seconds=run.seconds,
            )
        )
    )
    return 0


def build_parser() -> argparse.ArgumentParser:
    from replaylab import __version__
    from replaylab.bench.cli import add_bench_parser

    parser = argparse.ArgumentParser(prog="replaylab", description=__doc__.split("\n\n")[0])
    parser.add_argument("--version", action="version", version=f"replaylab {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="{generate,bench}")
    _add_generate(sub)
    add_bench_parser(sub)
    return parser


def main(argv=None):
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(argv)
    args.argv = argv[1:]  # after the subcommand: what a result's provenance records
    return args.run(args)


if __name__ == "__main__":
    sys.exit(main())
