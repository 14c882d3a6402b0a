"""The notebooks in a real browser, as a workshop participant meets them: JupyterLab opens a
notebook with explorers, its saved outputs show no raw widget text, Run All brings up the
sliders and plotly figures, and moving a slider changes the figure.

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
NOTEBOOK = "notebooks/08_intervals_budgets.ipynb"
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


@pytest.mark.browser
def test_explorers_work_in_jupyterlab_in_a_real_browser(lab, tmp_path):
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        pytest.skip("Debian's chromium is not installed (apt-get install chromium)")
    playwright = pytest.importorskip("playwright.sync_api")
    with playwright.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium, args=CHROMIUM_FLAGS)
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        try:
            page.goto(f"{lab}/lab/tree/{NOTEBOOK}", timeout=120_000)
            page.wait_for_selector(".jp-Notebook .jp-Cell", timeout=120_000)
            page.wait_for_timeout(2000)
            saved = page.inner_text(".jp-Notebook")
            assert "VBox(children" not in saved and "HBox(children" not in saved
            page.click("text=Run", timeout=30_000)  # the Run menu
            page.click("text=Run All Cells", timeout=30_000)
            slider = page.wait_for_selector(".jp-OutputArea .widget-slider", timeout=240_000)
            page.wait_for_selector(".jp-OutputArea .js-plotly-plot", timeout=120_000)
            figure = slider.evaluate_handle(
                "el => el.closest('.jp-OutputArea-output').querySelector('.js-plotly-plot')"
            )
            before = figure.evaluate("el => JSON.stringify(el.data.map(t => [t.x, t.y]))")
            handle = slider.query_selector(".ui-slider-handle, .noUi-handle, [role=slider]")
            (handle or slider).click()
            for _ in range(5):
                page.keyboard.press("ArrowRight")
            page.wait_for_timeout(1500)
            after = figure.evaluate("el => JSON.stringify(el.data.map(t => [t.x, t.y]))")
            page.screenshot(path=str(tmp_path / "explorer.png"), full_page=False)
            assert after != before, "moving the slider did not change the figure"
            text = page.inner_text(".jp-Notebook")
            assert "Traceback" not in text and "Error" not in text.split("Exercises")[0]
        finally:
            browser.close()
