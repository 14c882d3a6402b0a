"""The ``replaylab`` command.

    replaylab generate CHECKPOINT_DIR --prompt-ids 1,2,3 [--max-new-tokens 32]
              [--strategy snapshot|recompute|replay] [--draft none|prompt-lookup|DRAFT_DIR] [--k 4]

prints one JSON object: the generated ids and what the run cost.
"""

from __future__ import annotations

import argparse
import json
import sys

__all__ = ["main"]


def _ids(text):
    try:
        return [int(t) for t in text.replace(" ", "").split(",") if t]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}")


def main(argv=None):
    parser = argparse.ArgumentParser(prog="replaylab", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    gen = sub.add_parser("generate", help="decode a NemotronH or Bamba checkpoint folder")
    gen.add_argument("checkpoint")
    gen.add_argument("--prompt-ids", type=_ids, required=True)
    gen.add_argument("--max-new-tokens", type=int, default=32)
    gen.add_argument("--strategy", choices=["snapshot", "recompute", "replay"], default="replay")
    gen.add_argument("--draft", default="none",
                     help="none (greedy), prompt-lookup, or a draft checkpoint folder")
    gen.add_argument("--k", type=int, default=4, help="draft length")
    gen.add_argument("--interval", type=int, default=16)
    gen.add_argument("--device", default=None)
    args = parser.parse_args(argv)
    from replaylab.generate import generate
    try:
        run = generate(args.checkpoint, args.prompt_ids, args.max_new_tokens, args.strategy,
                       args.draft, args.k, args.interval, args.device, progress=sys.stderr.isatty())
    except (ValueError, OSError) as err:
        print(f"replaylab generate: {err}", file=sys.stderr)
        return 2
    print(json.dumps(dict(tokens=run.tokens[0].tolist(), strategy=run.strategy, draft=args.draft,
                          proposed=run.proposed, accepted=run.accepted, restores=run.restores,
                          rollback_seconds=run.restore_seconds, peak_bytes=run.peak_bytes,
                          seconds=run.seconds)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
