"""Build the book: the executed notebooks as a static site (``./run.sh book``).

The pages are every numbered notebook, ``notebooks/[0-9]*.ipynb`` in name order (so neither
``notebooks/solutions/`` nor paired ``.py`` scripts become pages; a new notebook such as
``09a_*.ipynb`` joins the book after 09 with no change here), the instructor guide
``notebooks/INSTRUCTORS.md``, and an index: ``book/index.md`` with a table of the notebooks,
each linked with its title (its first heading) and its minutes (its ``**Time:** about N
minutes`` line), in place of its ``<!-- notebooks -->`` line.

They are copied into a temporary folder and built there by Sphinx with ``book/conf.py``, so the
build writes nothing into the checkout but the output folder. Nothing is executed: the site
shows the outputs the notebooks were committed with.

    python tools/build_book.py                  write the site to build/book/
    python tools/build_book.py --out DIR        write it to DIR
    python tools/build_book.py --strict         fail on a Sphinx warning too (the tests do)
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = ROOT / "notebooks"
CONF = ROOT / "book"
GUIDE = NOTEBOOKS / "INSTRUCTORS.md"
MARKER = "<!-- notebooks -->"
REQUIRED = ("sphinx", "myst_nb", "sphinx_book_theme", "jupyter_server_mathjax")  # the book extra
MINUTES = re.compile(r"\*\*Time:\*\*\s*about\s+(\d+)\s+minutes")


def chapters() -> list[Path]:
    """The notebooks that are pages of the book, in reading order."""
    return sorted(NOTEBOOKS.glob("[0-9]*.ipynb"))


def describe(path: Path) -> tuple[str, str]:
    """A notebook's title (the text of its first heading) and its minutes ('' if it names
    none)."""
    cells = json.loads(path.read_text(encoding="utf-8"))["cells"]
    text = "\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "markdown")
    heading = re.search(r"^#\s+(.+)$", text, re.M)
    minutes = MINUTES.search(text)
    title = heading.group(1).strip() if heading else path.stem
    return title, minutes.group(1) if minutes else ""


def index_page(pages: list[Path]) -> str:
    """book/index.md with the notebook table and the site's navigation in place of MARKER."""
    intro = (CONF / "index.md").read_text(encoding="utf-8")
    if MARKER not in intro:
        raise SystemExit(f"{CONF / 'index.md'} has no {MARKER} line to put the notebooks at")
    rows = ["| notebook | minutes |", "|---|---:|"]
    for path in pages:
        title, minutes = describe(path)
        title = title.replace("|", r"\|")  # a bar would end the table cell
        rows.append(f"| [{title}]({path.name}) | {minutes} |")
    toc = [
        "```{toctree}",
        ":hidden:",
        ":caption: Notebooks",
        "",
        *(path.stem for path in pages),
        "```",
        "",
        "```{toctree}",
        ":hidden:",
        ":caption: Teaching",
        "",
        GUIDE.stem,
        "```",
    ]
    guide = f"Teaching with them: the [instructor guide]({GUIDE.name})."
    return intro.replace(MARKER, "\n".join([*rows, "", guide, "", *toc]))


def build(out: Path, quiet: bool = True, strict: bool = False) -> Path:
    """Stage the pages in a temporary folder, build the site there and move it to ``out`` (an
    earlier build there is replaced only once the new one has built); return
    ``out / 'index.html'``. Raises CalledProcessError when Sphinx fails (with ``strict``, also
    when it warns: a missing image, a page it could not read)."""
    missing = [m for m in REQUIRED if importlib.util.find_spec(m) is None]
    if missing:
        raise SystemExit(
            f"the book needs {', '.join(missing)}: pip install -e '.[book]' (Python 3.11 or "
            "later; ./run.sh book installs it)"
        )
    pages = chapters()
    if not pages:
        raise SystemExit(f"no notebooks matching [0-9]*.ipynb in {NOTEBOOKS}")
    out = out.resolve()
    if out.exists() and any(out.iterdir()) and not (out / ".buildinfo").exists():
        raise SystemExit(f"{out} holds files that are not a book build: not replacing it")
    # Sphinx and myst-nb write beside the site too (doctrees, myst-nb's jupyter_execute/): the
    # site is built inside the temporary folder, so all of that goes with it
    with tempfile.TemporaryDirectory(prefix="replaylab-book-") as tmp:
        src, site = Path(tmp) / "src", Path(tmp) / "site"
        src.mkdir()
        for path in [*pages, GUIDE]:
            shutil.copy2(path, src / path.name)
        (src / "index.md").write_text(index_page(pages), encoding="utf-8")
        command = [sys.executable, "-m", "sphinx", "-b", "html", "-c", str(CONF)]
        command += ["-d", str(Path(tmp) / "doctrees"), *(["-q"] if quiet else [])]
        command += ["-W", "--keep-going"] if strict else []
        subprocess.run([*command, str(src), str(site)], check=True)
        if out.exists():
            shutil.rmtree(out)
        out.parent.mkdir(parents=True, exist_ok=True)
        shutil.move(site, out)
    return out / "index.html"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=ROOT / "build" / "book")
    parser.add_argument("--verbose", action="store_true", help="Sphinx's progress lines too")
    parser.add_argument("--strict", action="store_true", help="fail on any Sphinx warning")
    args = parser.parse_args()
    try:
        index = build(args.out, quiet=not args.verbose, strict=args.strict)
    except subprocess.CalledProcessError as err:
        sys.exit(f"the book did not build (Sphinx exited with {err.returncode})")
    print(f"book written to {index.parent}/ (open {index})")


if __name__ == "__main__":
    main()
