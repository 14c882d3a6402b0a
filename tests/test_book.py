"""The book (``./run.sh book``): the real build, from the committed notebooks into a temporary
folder, then what a reader gets from it: a page per notebook in order with previous/next
links, the instructor guide, a search index that finds the notebooks' words, and figures and
scripts that are files of the site (nothing a page shows is fetched from the network)."""

import functools
import json
import re
import subprocess
import sys
from html.parser import HTMLParser
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))
import build_book  # noqa: E402

STATIC = ("image/png", "image/svg+xml")

pytestmark = pytest.mark.skipif(
    sys.version_info < (3, 11), reason="the book's Sphinx 9 needs Python 3.11 (pyproject: book)"
)


class _Tags(HTMLParser):
    """Every start tag of a page, as (tag, attributes)."""

    def __init__(self):
        super().__init__()
        self.tags = []

    def handle_starttag(self, tag, attrs):
        self.tags.append((tag, dict(attrs)))


@functools.cache
def tags(page: Path) -> list[tuple[str, dict]]:
    parser = _Tags()
    parser.feed(page.read_text(encoding="utf-8"))
    return parser.tags


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    """The site, built by the command ./run.sh book runs (about 15 s on one core), with Sphinx's
    warnings (a page or an image it could not use) failing the build."""
    out = tmp_path_factory.mktemp("book") / "site"
    done = subprocess.run(
        [sys.executable, str(ROOT / "tools" / "build_book.py"), "--out", str(out), "--strict"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, f"the book did not build:\n{done.stdout}\n{done.stderr}"
    return out


def test_pages_are_the_numbered_notebooks_the_guide_and_an_index(site):
    chapters = build_book.chapters()
    assert [p.name for p in chapters[:2]] == ["00_tour.ipynb", "01_two_memories.ipynb"]
    pages = {p.stem for p in site.glob("*.html")}
    # no page for notebooks/solutions/ or a script: Sphinx's own pages besides these
    assert pages == {p.stem for p in chapters} | {"INSTRUCTORS", "index", "search", "genindex"}
    guide = (site / "INSTRUCTORS.html").read_text(encoding="utf-8")
    assert "Instructor guide" in guide


def test_the_index_links_every_notebook_in_order_with_its_minutes(site):
    chapters = build_book.chapters()
    index = (site / "index.html").read_text(encoding="utf-8")
    table = index.split("<table", 1)[1].split("</table>", 1)[0]
    rows = re.findall(r"<tr.*?</tr>", table, re.S)[1:]  # below the heading row
    assert len(rows) == len(chapters)
    for row, path in zip(rows, chapters):
        title, minutes = build_book.describe(path)
        # the title as text: up to its first `code` span, which the page marks up
        assert f'href="{path.stem}.html"' in row and title.split("`")[0] in row, (path.name, row)
        assert re.search(rf"<td[^>]*>(<p>)?{minutes}(</p>)?</td>", row), (path.name, row)
    assert build_book.describe(ROOT / "notebooks" / "06_replay_kernel.ipynb") == (
        "06 · The replay kernel",
        "125",
    )
    sidebar = [a.get("href") for t, a in tags(site / "index.html") if t == "a"]
    sidebar = [h for h in sidebar if h in {f"{p.stem}.html" for p in chapters}]
    assert sidebar[: len(chapters)] == [f"{p.stem}.html" for p in chapters]
    assert 'href="INSTRUCTORS.html"' in index


def test_each_notebook_page_links_the_previous_and_the_next(site):
    stems = [p.stem for p in build_book.chapters()]
    for before, page, after in zip(stems, stems[1:], stems[2:]):
        anchors = {
            a.get("class"): a.get("href") for t, a in tags(site / f"{page}.html") if t == "a"
        }
        assert anchors.get("left-prev") == f"{before}.html", page
        assert anchors.get("right-next") == f"{after}.html", page


def test_search_finds_words_of_the_notebooks(site):
    assert (site / "search.html").exists()
    text = (site / "searchindex.js").read_text(encoding="utf-8")
    index = json.loads(text[text.index("(") + 1 : text.rindex(")")])
    stems = [p.stem for p in build_book.chapters()]
    assert set(stems) <= set(index["docnames"])
    # notebook 08 sets its checkpoint interval against Griewank's optimum
    found = {index["docnames"][i] for i in index["terms"]["griewank"]}
    assert "08_intervals_budgets" in found


def test_figures_are_image_files_of_the_site(site):
    for path in build_book.chapters():
        cells = json.loads(path.read_text(encoding="utf-8"))["cells"]
        saved = sum(
            any(m in out.get("data", {}) for m in STATIC)
            for cell in cells
            for out in cell.get("outputs", [])
        )
        images = [a["src"] for t, a in tags(site / f"{path.stem}.html") if t == "img"]
        shown = [src for src in images if src.startswith("_images/")]
        assert len(shown) >= saved, f"{path.name}: {saved} figures saved, {len(shown)} shown"
        for src in shown:
            image = site / src
            assert image.is_file() and image.stat().st_size > 1000, f"{path.name}: {src}"
    figures = [a["src"] for t, a in tags(site / "03_branching_strategies.html") if t == "img"]
    assert figures and (site / figures[0]).read_text(encoding="utf-8").lstrip().startswith("<svg")


def test_no_page_loads_anything_from_the_network(site):
    """Scripts, styles and images are all files of the site (MathJax included), so the book
    reads offline."""
    remote = []
    for page in sorted(site.glob("*.html")):
        for tag, attrs in tags(page):
            url = attrs.get("src") if tag in ("script", "img") else None
            if tag == "link" and attrs.get("rel") in ("stylesheet", "preload"):
                url = attrs.get("href")
            if url and "://" in url:
                remote.append(f"{page.name}: <{tag}> {url}")
            elif url and tag == "script" and not (site / url.split("?")[0]).is_file():
                remote.append(f"{page.name}: <script> {url} is not in the site")
    assert not remote, "\n".join(remote)
    assert (site / "_static" / "mathjax" / "MathJax.js").is_file()


def test_an_index_without_its_marker_line_stops_the_build(tmp_path, monkeypatch):
    """book/index.md says where the notebook table goes; without that line the build stops
    with a message rather than writing an index with no notebooks."""
    page = build_book.index_page(build_book.chapters()[:1])
    assert "[00 · Tour](00_tour.ipynb)" in page and "{toctree}" in page
    assert build_book.MARKER not in page
    (tmp_path / "index.md").write_text("# a book\n", encoding="utf-8")
    monkeypatch.setattr(build_book, "CONF", tmp_path)
    with pytest.raises(SystemExit, match="no <!-- notebooks --> line"):
        build_book.index_page(build_book.chapters()[:1])
