"""``python -m replaylab.bench``: the benchmark subcommands."""

import sys

from replaylab.bench.cli import main

sys.exit(main())
