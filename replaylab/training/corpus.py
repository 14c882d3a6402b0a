"""The training corpus: texts with names, split into train and held-out by a hash of each name,
and the held-out text in one file (what ``data/models/heldout.txt.gz`` holds)."""

from __future__ import annotations

import hashlib
import platform
import sysconfig
from dataclasses import dataclass, field
from pathlib import Path


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
