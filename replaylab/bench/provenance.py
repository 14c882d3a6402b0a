"""Where a measurement came from: device, library versions, date and the command."""

from __future__ import annotations

import contextlib
import datetime
import platform
import sys

import torch

__all__ = ["provenance", "versions", "source_commit", "pin_commit", "write_tool_result"]


# module -> the distributions that install it (mamba-ssm's import needs its CUDA extension or
# the stand-in ``bench.peers`` arranges, so installed versions are read from the metadata)
_DISTRIBUTIONS = {
    "triton": ("triton",),
    "mamba_ssm": ("mamba-ssm", "mamba_ssm"),
    "fla": ("fla-core", "flash-linear-attention"),
    "transformers": ("transformers",),
}


def versions() -> dict:
    """Python, torch and the peers' installed versions (or why a peer is missing)."""
    from importlib import metadata

    out = {"python": platform.python_version(), "torch": torch.__version__}
    for name, dists in _DISTRIBUTIONS.items():
        for dist in dists:
            try:
                out[name] = metadata.version(dist)
                break
            except metadata.PackageNotFoundError:
                continue
        else:
            try:
                out[name] = getattr(__import__(name), "__version__", "?")
            except Exception as err:  # noqa: BLE001 - record why a peer is missing
                out[name] = f"unavailable: {type(err).__name__}: {err}"[:200]
    return out


def source_commit() -> str | None:
    """The commit of the code that ran: ``REPLAYLAB_COMMIT`` where the run sets it (a copy of
    the checkout without its git history, as on the GPU machine), else the checkout's HEAD
    (with "+changes" when its tracked files differ from it), else None."""
    import os
    import subprocess
    from pathlib import Path

    if os.environ.get("REPLAYLAB_COMMIT"):
        return os.environ["REPLAYLAB_COMMIT"]
    root = Path(__file__).resolve().parents[2]
    if not (root / ".git").exists():  # an installed copy: no checkout of its own
        return None
    try:
        git = lambda *a: subprocess.run(  # noqa: E731
            ["git", "-C", str(root), *a], capture_output=True, text=True, timeout=10
        )
        head = git("rev-parse", "--short", "HEAD")
        if head.returncode:
            return None
        dirty = git("status", "--porcelain", "--untracked-files=no").stdout.strip()
        return head.stdout.strip() + ("+changes" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        return None


@contextlib.contextmanager
def pin_commit():
    """Inside ``with pin_commit():`` the commit a run records is the checkout's state when the
    block starts (``REPLAYLAB_COMMIT`` set to ``source_commit``'s answer then, unless already
    set; put back as it was after), so a checkout that moves on while a long benchmark runs
    does not relabel its result. The CLIs run each benchmark inside it."""
    import os

    before = os.environ.get("REPLAYLAB_COMMIT")
    commit = before or source_commit()
    if commit:
        os.environ["REPLAYLAB_COMMIT"] = commit
    try:
        yield commit
    finally:
        if before is None:
            os.environ.pop("REPLAYLAB_COMMIT", None)
        else:
            os.environ["REPLAYLAB_COMMIT"] = before


def provenance(argv=None) -> dict:
    """device, versions, date (UTC, ISO), command and source commit of the current run."""
    device = (
        torch.cuda.get_device_name() if torch.cuda.is_available() else platform.processor() or "cpu"
    )
    args = sys.argv[1:] if argv is None else argv
    return dict(
        device=device,
        versions=versions(),
        date=datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        command="replaylab bench " + " ".join(map(str, args)),
        commit=source_commit(),
    )


def write_tool_result(path, script, rows) -> dict:
    """Write ``rows`` with the run's provenance to ``path`` (JSON) for a measurement script of
    ``tools/`` (``script``: its file name; the command is that script with this run's
    arguments); returns what it wrote."""
    import json

    result = dict(rows=rows, **provenance())
    result["command"] = f"python tools/{script} " + " ".join(sys.argv[1:])
    with open(path, "w") as f:
        json.dump(result, f, indent=1)
    return result
