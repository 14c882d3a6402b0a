"""The notebooks in a real browser, as a workshop participant meets them: JupyterLab opens a
notebook with explorers, its saved outputs show no raw widget text, Run All brings up the
sliders and plotly figures, moving a slider changes the figure, and an explorer's "run live"
button runs and puts its measurements on the figure.

How it stays robust on a cold machine (a new venv, a first JupyterLab start):
- JupyterLab serves a copy of ``notebooks/`` in a temporary folder (``data/`` linked beside
  it), with autosave off: a test never writes into the checkout.
- Its settings and workspaces live in that folder too, with the news toast and the update
  check off, so nothing a first start shows sits over the notebook.
- The test drives JupyterLab through its command registry (``window.jupyterapp``, exposed by
  ``--LabApp.expose_app_in_browser``), never by visible text: it waits for the notebook's
  kernel to be idle, then runs ``notebook:run-all-cells`` and waits for that command's promise.
- Every failure carries what explains it: the kernel's status, cells run and pending, any
  dialog or toast, error outputs, the lab server's log and the path of a screenshot.

Needs Debian's ``chromium`` and the ``playwright`` package (CI's ``.ci/run`` installs
chromium); skipped with the reason otherwise.
"""

import json
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
# JupyterLab user settings for the test's lab: no news toast, no update check, no autosave
LAB_SETTINGS = {
    "@jupyterlab/apputils-extension/notification.jupyterlab-settings": {
        "fetchNews": "false",
        "checkForUpdates": False,
    },
    "@jupyterlab/docmanager-extension/plugin.jupyterlab-settings": {"autosave": False},
}
KERNEL_IDLE_S = 120  # a first kernel start in a new venv imports torch cold
RUN_ALL_S = 180  # Run All of the slowest explorer notebook, on two busy cores
REDRAW_S = 60  # the kernel answers a slider and plotly redraws
LIVE_RUN_S = 120  # an explorer's "run live": the tiny model decodes on the CPU


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def serve_copy(tmp_path):
    """A copy of the notebooks to serve, with ``data/`` linked beside it (the notebooks read
    ``../data``), and the lab's own settings; returns (root to serve, environment)."""
    root = tmp_path / "served"
    shutil.copytree(
        ROOT / "notebooks", root / "notebooks", ignore=shutil.ignore_patterns(".ipynb_checkpoints")
    )
    (root / "data").symlink_to(ROOT / "data", target_is_directory=True)
    settings = tmp_path / "lab-settings"
    for name, values in LAB_SETTINGS.items():
        path = settings / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(values))
    env = dict(
        os.environ,
        JUPYTERLAB_SETTINGS_DIR=str(settings),
        JUPYTERLAB_WORKSPACES_DIR=str(tmp_path / "lab-workspaces"),
        JUPYTER_RUNTIME_DIR=str(tmp_path / "jupyter-runtime"),
    )
    return root, env


class Lab:
    """A JupyterLab server on a free local port, no token, serving a copy of the notebooks."""

    def __init__(self, tmp_path):
        self.root, env = serve_copy(tmp_path)
        self.log_path = tmp_path / "lab.log"
        port = _free_port()
        self.url = f"http://127.0.0.1:{port}"
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
            f"--ServerApp.root_dir={self.root}",
            "--LabApp.news_url=",
            "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate",
            "--LabApp.expose_app_in_browser=True",
        ]
        if os.geteuid() == 0:
            cmd.append("--allow-root")
        self._log = open(self.log_path, "w")
        self.server = subprocess.Popen(
            cmd, stdout=self._log, stderr=subprocess.STDOUT, cwd=self.root, env=env
        )

    def wait_ready(self, timeout=120):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.server.poll() is not None:
                break
            try:
                urllib.request.urlopen(f"{self.url}/api/status", timeout=2)
                return
            except OSError:
                time.sleep(0.5)
        pytest.fail(f"JupyterLab did not start within {timeout} s:\n{self.log_tail()}")

    def log_tail(self, chars=3000):
        self._log.flush()
        return self.log_path.read_text(errors="replace")[-chars:]

    def stop(self):
        self.server.terminate()
        try:
            self.server.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.server.kill()
        self._log.close()


@pytest.fixture
def lab(tmp_path):
    server = Lab(tmp_path)
    try:
        server.wait_ready()
        yield server
    finally:
        server.stop()


EXPLORER_NOTEBOOKS = {
    "notebooks/06_replay_kernel.ipynb": 1,
    "notebooks/07_speculative_rollback.ipynb": 1,
    "notebooks/08_intervals_budgets.ipynb": 2,
    "notebooks/14_prefix_caching.ipynb": 1,  # serves its workloads live: a slower redraw
}  # notebook -> explorers in it
RUN_LIVE_BUTTONS = {"notebooks/07_speculative_rollback.ipynb": 1}  # explorers with "run live"

FIGURE_DATA = "el => JSON.stringify(el.data.map(t => [t.x, t.y]))"
# the live run's markers: traces named "measured..." holding points
OVERLAY = "el => el.data.some(t => (t.name || '').startsWith('measured') && t.y && t.y.length > 0)"

# The open notebook, read through JupyterLab's application object.
NOTEBOOK = "(() => { const w = window.jupyterapp && window.jupyterapp.shell.currentWidget;"
NOTEBOOK += " return w && w.content && w.content.model ? w : null; })()"
KERNEL_STATUS = f"(() => {{ const w = {NOTEBOOK}; const k = w && w.sessionContext.session"
KERNEL_STATUS += " && w.sessionContext.session.kernel; return k ? k.status : 'no kernel'; })()"
# What the page shows about its own state; the failure messages carry it.
PAGE_STATE = f"""() => {{
  const w = {NOTEBOOK};
  const state = {{kernel: {KERNEL_STATUS}, notebook: w ? w.context.path : null}};
  if (w) {{
    const cells = [...w.content.widgets].filter(c => c.model.type === 'code');
    state.code_cells = cells.length;
    state.executed = cells.filter(c => c.model.executionCount !== null).length;
    state.pending = [...document.querySelectorAll('.jp-InputArea-prompt')]
      .filter(e => e.textContent.includes('*')).length;
  }}
  state.dialogs = [...document.querySelectorAll('.jp-Dialog')].map(e => e.innerText.slice(0, 300));
  state.toasts = [...document.querySelectorAll('.Toastify__toast')]
    .map(e => e.innerText.slice(0, 300));
  state.errors = [...document.querySelectorAll('.jp-OutputArea-output[data-mime-type*="stderr"],'
    + ' .jp-RenderedText[data-mime-type="application/vnd.jupyter.error"]')]
    .map(e => e.innerText.slice(0, 500)).slice(0, 5);
  return state;
}}"""
RUN_ALL = """async (limit_ms) => {
  const run = window.jupyterapp.commands.execute('notebook:run-all-cells');
  const late = new Promise(done => setTimeout(() => done('timeout'), limit_ms));
  return String(await Promise.race([run, late]));
}"""


class Explain:
    """Failure messages that say what the page, the kernel and the server were doing."""

    def __init__(self, page, lab, tmp_path):
        self.page, self.lab, self.tmp_path, self.shots = page, lab, tmp_path, 0

    def __call__(self, what):
        self.shots += 1
        shot = self.tmp_path / f"failure{self.shots}.png"
        try:
            self.page.screenshot(path=str(shot))
            state = json.dumps(self.page.evaluate(PAGE_STATE), indent=1)
        except Exception as err:  # the page itself is gone: say so
            state = f"(page state unavailable: {type(err).__name__}: {err})"
        return (
            f"{what}\npage state: {state}\nscreenshot: {shot}\n"
            f"lab server log (tail):\n{self.lab.log_tail()}"
        )

    def wait(self, what, expression, timeout_s, arg=None):
        try:
            self.page.wait_for_function(expression, arg=arg, timeout=timeout_s * 1000)
        except Exception as err:
            pytest.fail(self(f"{what}: not within {timeout_s} s ({type(err).__name__})"))


@pytest.mark.browser
@pytest.mark.parametrize("notebook", EXPLORER_NOTEBOOKS)
def test_explorers_work_in_jupyterlab_in_a_real_browser(lab, tmp_path, notebook):
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        pytest.skip("Debian's chromium is not installed (apt-get install chromium; .ci/run does)")
    playwright = pytest.importorskip("playwright.sync_api")
    checkout_copy = (ROOT / notebook).read_bytes()
    with playwright.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium, args=CHROMIUM_FLAGS)
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        explain = Explain(page, lab, tmp_path)
        try:
            page.goto(f"{lab.url}/lab/tree/{notebook}", timeout=120_000)
            explain.wait(
                "the notebook did not open",
                f"{NOTEBOOK} !== null && document.querySelector('.jp-Notebook .jp-Cell')",
                120,
            )
            saved = page.inner_text(".jp-Notebook")
            assert "VBox(children" not in saved and "HBox(children" not in saved
            explain.wait("the kernel did not become idle", f"{KERNEL_STATUS} === 'idle'", 120)
            result = page.evaluate(RUN_ALL, RUN_ALL_S * 1000)
            if result != "true":
                pytest.fail(explain(f"Run All did not finish cleanly: the command gave {result}"))
            want = EXPLORER_NOTEBOOKS[notebook]
            explain.wait(
                f"{want} explorer(s) with a slider and a plotly figure did not appear",
                f"document.querySelectorAll('.jp-OutputArea-output .widget-slider').length >= {want}"
                " && document.querySelectorAll('.jp-OutputArea-output .js-plotly-plot').length"
                f" >= {want}",
                30,
            )
            explain.wait(
                "the kernel did not settle after Run All", f"{KERNEL_STATUS} === 'idle'", 30
            )
            explorers = [
                out
                for out in page.query_selector_all(".jp-OutputArea-output")
                if out.query_selector(".widget-slider") and out.query_selector(".js-plotly-plot")
            ]
            assert len(explorers) >= want, explain(f"{len(explorers)} explorers, expected {want}")
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
                explain.wait(
                    f"explorer {n}: the figure did not change after its slider moved",
                    "([el, before]) => JSON.stringify(el.data.map(t => [t.x, t.y])) !== before",
                    REDRAW_S,
                    arg=[figure, before],
                )
                button = out.query_selector("button:has-text('run live')")
                if button is None:
                    continue
                # the slider made the last live run stale: its markers are gone until a new run
                assert not figure.evaluate(OVERLAY), explain(f"explorer {n}: stale live markers")
                button.scroll_into_view_if_needed()
                button.click()
                explain.wait(
                    f"explorer {n}: the live run put no measured markers on the figure",
                    f"el => ({OVERLAY})(el)",
                    LIVE_RUN_S,
                    arg=figure,
                )
                assert "measured in" in out.inner_text(), explain(f"explorer {n}: no status")
                clicked += 1
            assert clicked == RUN_LIVE_BUTTONS.get(notebook, 0)
            text = page.inner_text(".jp-Notebook")
            assert "Traceback" not in text, explain("a traceback in the notebook")
            assert "VBox(children" not in text, explain("raw widget text in the notebook")
            page.screenshot(path=str(tmp_path / "explorers.png"))
        finally:
            browser.close()
    assert (ROOT / notebook).read_bytes() == checkout_copy, "the checkout's notebook was written"


def test_the_lab_serves_a_copy_with_its_own_settings(tmp_path):
    """The browser test's lab never points at the checkout: its notebooks are copies, its
    settings turn autosave and the news toast off, and ``data/`` is reachable as ``../data``."""
    root, env = serve_copy(tmp_path)
    nb = root / "notebooks" / "07_speculative_rollback.ipynb"
    assert nb.read_bytes() == (ROOT / "notebooks" / nb.name).read_bytes()
    assert not nb.is_symlink() and ROOT not in nb.resolve().parents
    assert (root / "notebooks" / ".." / "data" / "models").is_dir()
    settings = Path(env["JUPYTERLAB_SETTINGS_DIR"])
    docmanager = settings / "@jupyterlab/docmanager-extension/plugin.jupyterlab-settings"
    assert json.loads(docmanager.read_text()) == {"autosave": False}
    note = settings / "@jupyterlab/apputils-extension/notification.jupyterlab-settings"
    assert json.loads(note.read_text())["fetchNews"] == "false"
