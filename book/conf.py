"""Sphinx configuration of the book: the executed notebooks as a static site.

Built by ``./run.sh book`` through ``tools/build_book.py``, which stages the pages (the numbered
notebooks, the instructor guide and an index written from them) and runs Sphinx with this
folder as its configuration directory. Nothing is executed: myst-nb renders the outputs saved
in each notebook. Everything a page needs is a file of the site, so it reads offline: a plotly
figure shows as the static SVG saved beside its plotly JSON, search is Sphinx's own index, and
the math is typeset by a copy of MathJax from the ``jupyter-server-mathjax`` package.
"""

import shutil
from pathlib import Path

import jupyter_server_mathjax

project = "replaylab"
author = "the replaylab authors"
html_title = "replaylab: the notebooks"

extensions = ["myst_nb"]
root_doc = "index"

# render what the notebooks hold; never start a kernel
nb_execution_mode = "off"
# an output shows as the first of myst-nb's HTML mime types it holds; plotly's JSON is none of
# them, so a figure shows as the static SVG saved beside it (tests/test_static_figures.py checks
# that every figure has one) and myst-nb's note that it skipped the JSON is not shown
nb_merge_streams = True
myst_enable_extensions = ["dollarmath", "amsmath"]
# the notebooks' own headings are the pages' sections; a heading that skips a level in a
# notebook is a style matter, not a broken book
suppress_warnings = ["myst.header", "mystnb.unknown_mime_type"]

# MathJax 2 as shipped by jupyter-server-mathjax, copied into _static/mathjax/ once the pages are
# written (a path without a scheme is relative to _static/)
MATHJAX = Path(jupyter_server_mathjax.__file__).parent / "static"
mathjax_path = "mathjax/MathJax.js?config=TeX-AMS-MML_HTMLorMML-full"
# the package ships the STIX-Web fonts only (MathJax would look for its TeX fonts first)
mathjax2_config = {
    "HTML-CSS": {
        "availableFonts": [],
        "preferredFont": None,
        "webFont": "STIX-Web",
        "imageFont": None,
    }
}
# myst's MathJax settings are MathJax 3's, which MathJax 2 takes for a broken configuration; left
# out, MathJax 2 typesets the \( \) and \[ \] that Sphinx writes and skips code blocks
myst_update_mathjax = False

html_theme = "sphinx_book_theme"
# no download button: the site holds no copy of the notebooks (html_copy_source)
html_theme_options = {"show_toc_level": 2, "home_page_in_toc": True, "use_download_button": False}
html_copy_source = False  # the .ipynb files stay in the repository, not in the site
html_show_sourcelink = False


def _copy_mathjax(app, error):
    if error is None and app.builder.format == "html":
        shutil.copytree(MATHJAX, Path(app.outdir) / "_static" / "mathjax", dirs_exist_ok=True)


def setup(app):
    app.connect("build-finished", _copy_mathjax)
