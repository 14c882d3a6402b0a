"""``python -m replaylab``: the ``replaylab`` command."""

import sys

from replaylab.cli import main

sys.exit(main())
