"""The test suite must not write into the checkout: a fingerprint of every file git tracks,
plus the list of untracked files it does not ignore, taken before the session and after.

``conftest.py`` takes the fingerprint at session start and compares it at session end; a
difference fails the run and names the files (see ``changed_files``).
"""

import hashlib
import subprocess
from pathlib import Path


def fingerprint(root):
    """{path: sha256} of the tracked files and the untracked, not-ignored ones under ``root``
    (a deleted tracked file maps to None); None when ``root`` is not a git work tree."""
    try:
        listed = subprocess.run(
            ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
            cwd=root,
            capture_output=True,
            check=True,
        ).stdout
    except (OSError, subprocess.CalledProcessError):
        return None
    prints = {}
    for name in filter(None, listed.decode().split("\0")):
        path = Path(root) / name
        prints[name] = hashlib.sha256(path.read_bytes()).hexdigest() if path.is_file() else None
    return prints


def changed_files(before, after):
    """Paths added, removed or modified between two fingerprints, sorted."""
    return sorted(p for p in before.keys() | after.keys() if before.get(p) != after.get(p))
