"""The notebooks in a real browser, as a workshop participant meets them: JupyterLab opens a
notebook with explorers, its saved outputs show no raw widget text, Run All brings up the
sliders and plotly figures, moving a slider changes the figure, and an explorer's "run live"
button runs and puts its measurements on the figure.

Needs Debian's ``chromium`` and the ``playwright`` package (CI's ``.ci/run`` installs
chromium); skipped with the reason otherwise.
"""

import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CHROMIUM_FLAGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def lab(tmp_path):
    """A JupyterLab server on a free local port, no token, serving the repository."""
    port = _free_port()
    cmd = [
        sys.executable,
        "-m",
        "jupyter",
        "lab",
        "--no-browser",
        f"--port={port}",
        "--ServerApp.ip=127.0.0.1",
        "--IdentityProvider.token=",
        "--ServerApp.password=",
        f"--ServerApp.root_dir={ROOT}",
        "--LabApp.news_url=",
        "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate",
        # a workspace of its own: the shared default one reopens whatever notebooks another
        # session (or a concurrent run of this test) left open
        f"--LabApp.workspaces_dir={tmp_path / 'workspaces'}",
    ]
    if os.geteuid() == 0:
        cmd.append("--allow-root")
    log = open(tmp_path / "lab.log", "w")
    server = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT)
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(120):
            try:
                urllib.request.urlopen(f"{url}/api/status", timeout=2)
                break
            except OSError:
                time.sleep(0.5)
        else:
            pytest.fail("JupyterLab did not start: " + (tmp_path / "lab.log").read_text()[-2000:])
        yield url
    finally:
        server.terminate()
        try:
            server.wait(timeout=20)
        except subprocess.TimeoutExpired:
            server.kill()
        log.close()


EXPLORER_NOTEBOOKS = {
    "notebooks/06_replay_kernel.ipynb": 1,
    "notebooks/07_speculative_rollback.ipynb": 1,
    "notebooks/08_intervals_budgets.ipynb": 2,
}  # notebook -> explorers in it
RUN_LIVE_BUTTONS = {"notebooks/07_speculative_rollback.ipynb": 1}  # explorers with "run live"

FIGURE_DATA = "el => JSON.stringify(el.data.map(t => [t.x, t.y]))"
# the live run's markers: traces named "measured..." holding points
OVERLAY = "el => el.data.some(t => (t.name || '').startsWith('measured') && t.y && t.y.length > 0)"


@pytest.mark.browser
@pytest.mark.parametrize("notebook", EXPLORER_NOTEBOOKS)
def test_explorers_work_in_jupyterlab_in_a_real_browser(lab, tmp_path, notebook):
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        pytest.skip("Debian's chromium is not installed (apt-get install chromium; .ci/run does)")
    playwright = pytest.importorskip("playwright.sync_api")
    with playwright.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium, args=CHROMIUM_FLAGS)
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        try:
            page.goto(f"{lab}/lab/tree/{notebook}", timeout=120_000)
            page.wait_for_selector(".jp-Notebook .jp-Cell", timeout=120_000)
            page.wait_for_timeout(2000)
            saved = page.inner_text(".jp-Notebook")
            assert "VBox(children" not in saved and "HBox(children" not in saved
            page.click("text=Run", timeout=30_000)  # the Run menu
            page.click("text=Run All Cells", timeout=30_000)
            want = EXPLORER_NOTEBOOKS[notebook]
            page.wait_for_function(
                f"document.querySelectorAll('.jp-OutputArea-output .widget-slider').length >= {want}"
                " && document.querySelectorAll('.jp-OutputArea-output .js-plotly-plot').length"
                f" >= {want}",
                timeout=240_000,
            )
            # every cell has run (no "[*]" prompt left), so the kernel answers the sliders
            page.wait_for_function(
                "![...document.querySelectorAll('.jp-InputArea-prompt')]"
                ".some(e => e.textContent.includes('*'))",
                timeout=240_000,
            )
            page.wait_for_timeout(1500)
            explorers = [
                out
                for out in page.query_selector_all(".jp-OutputArea-output")
                if out.query_selector(".widget-slider") and out.query_selector(".js-plotly-plot")
            ]
            assert len(explorers) >= want
            clicked = 0
            for n, out in enumerate(explorers):
                figure = out.query_selector(".js-plotly-plot")
                before = figure.evaluate(FIGURE_DATA)
                slider = out.query_selector(".widget-slider")
                handle = slider.query_selector(".noUi-handle, .ui-slider-handle, [role=slider]")
                (handle or slider).scroll_into_view_if_needed()
                (handle or slider).click()
                for _ in range(5):
                    page.keyboard.press("ArrowRight")
                try:  # the kernel answers the slider; plotly redraws
                    page.wait_for_function(
                        "([el, before]) => JSON.stringify(el.data.map(t => [t.x, t.y])) !== before",
                        arg=[figure, before],
                        timeout=60_000,
                    )
                finally:
                    page.screenshot(path=str(tmp_path / f"explorer{n}.png"))
                assert figure.evaluate(FIGURE_DATA) != before, f"explorer {n}: figure unchanged"
                button = out.query_selector("button:has-text('run live')")
                if button is None:
                    continue
                # the slider made the last live run stale: its markers are gone until a new run
                assert not figure.evaluate(OVERLAY), f"explorer {n}: stale live markers left"
                button.scroll_into_view_if_needed()
                button.click()
                try:  # the kernel decodes the tiny model on the CPU; plotly adds the markers
                    page.wait_for_function(f"el => ({OVERLAY})(el)", arg=figure, timeout=120_000)
                finally:
                    page.screenshot(path=str(tmp_path / f"explorer{n}_live.png"))
                assert "measured in" in out.inner_text(), f"explorer {n}: no status after the run"
                clicked += 1
            assert clicked == RUN_LIVE_BUTTONS.get(notebook, 0)
            text = page.inner_text(".jp-Notebook")
            assert "Traceback" not in text and "VBox(children" not in text
        finally:
            browser.close()
