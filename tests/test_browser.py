"""A real browser, as a person would use fexplore: JupyterLab on loopback, tutorial 01 opened and
run in headless Chromium; the stepper widget and a graph SVG must appear and the stepper must step.
The HTML report ``fexplore compile`` writes must open from disk too. Screenshots are saved under
test-artifacts/ for a person to look at.

Chromium is Debian's (``make test`` installs it), driven by Playwright through its executable
path: Playwright's own browser download needs a network this machine does not have.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
ARTIFACTS = ROOT / "test-artifacts"
TUTORIAL = ROOT / "notebooks" / "01_quickstart.ipynb"
CHROMIUM_FLAGS = ["--no-sandbox", "--disable-gpu", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update",
                  "--disable-sync", "--disable-quic", "--disable-dev-shm-usage"]


def _chromium() -> str | None:
    for name in ("chromium", "chromium-browser"):
        path = shutil.which(name)
        if path:
            return path
    return None


def _missing(what: str):
    # On CI the Makefile installs everything: a missing piece there is a failure, not a skip.
    if os.environ.get("CI"):
        pytest.fail(f"{what} is missing; `make test` installs it")
    pytest.skip(f"{what} is missing (run `make test` as root to install it)")


@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    """A headless Chromium context with a fresh profile."""
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        _missing("the playwright package")
    exe = _chromium()
    if exe is None:
        _missing("Debian's chromium")
    profile = tmp_path_factory.mktemp("chromium-profile")
    with sync_playwright() as p:
        ctx = p.chromium.launch_persistent_context(
            str(profile), executable_path=exe, headless=True, args=CHROMIUM_FLAGS,
            viewport={"width": 1400, "height": 1000})
        ctx.set_default_timeout(30_000)
        try:
            yield ctx
        finally:
            ctx.close()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _api(base: str, token: str, path: str, method: str = "GET"):
    req = urllib.request.Request(f"{base}{path}", method=method,
                                 headers={"Authorization": f"token {token}"})
    with urllib.request.urlopen(req, timeout=5) as r:
        body = r.read()
    return json.loads(body) if body else None


@pytest.fixture(scope="module")
def jupyterlab(tmp_path_factory):
    """JupyterLab on 127.0.0.1 (a free port, a token), serving a copy of tutorial 01 with its
    stored outputs cleared, so what the browser shows is what it ran. Stopped at teardown."""
    import nbformat

    root = tmp_path_factory.mktemp("lab")
    nb = nbformat.read(TUTORIAL, as_version=4)
    for cell in nb.cells:
        if cell.cell_type == "code":
            cell.outputs, cell.execution_count = [], None
    nbformat.write(nb, root / TUTORIAL.name)
    # no "get Jupyter news?" prompt over the page (and no fetching it)
    news = root / ".settings" / "@jupyterlab" / "apputils-extension"
    news.mkdir(parents=True)
    (news / "notification.jupyterlab-settings").write_text('{"fetchNews": "false"}')
    port, token = _free_port(), os.urandom(16).hex()
    env = {**os.environ, "JUPYTER_CONFIG_DIR": str(root / ".config"),
           "JUPYTER_RUNTIME_DIR": str(root / ".runtime"), "JUPYTER_DATA_DIR": str(root / ".data"),
           "PYTHONWARNINGS": "ignore::FutureWarning"}
    cmd = [sys.executable, "-m", "jupyterlab", "--no-browser", "--ip=127.0.0.1", f"--port={port}",
           "--ServerApp.port_retries=0", f"--IdentityProvider.token={token}",
           f"--ServerApp.root_dir={root}", "--LabApp.news_url=",
           "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate",
           "--LabApp.expose_app_in_browser=True", "--LabApp.extension_manager=readonly",
           "--ServerApp.terminals_enabled=False", "--allow-root",
           f"--LabApp.workspaces_dir={root / '.workspaces'}",
           f"--LabApp.user_settings_dir={root / '.settings'}"]
    log = open(root / "jupyterlab.log", "w")
    proc = subprocess.Popen(cmd, cwd=root, env=env, stdout=log, stderr=subprocess.STDOUT,
                            start_new_session=True)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                _api(base, token, "/api/status")
                break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError("JupyterLab did not start:\n"
                                       + (root / "jupyterlab.log").read_text()[-3000:])
                time.sleep(0.5)
        yield base, token, root
    finally:
        try:  # kernels live in sessions of their own: shut them down through the server
            for k in _api(base, token, "/api/kernels") or []:
                _api(base, token, f"/api/kernels/{k['id']}", method="DELETE")
        except OSError:
            pass
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=10)
        log.close()


def test_tutorial_runs_in_jupyterlab_with_stepper_and_graph(browser, jupyterlab):
    base, token, root = jupyterlab
    ARTIFACTS.mkdir(exist_ok=True)
    page = browser.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.goto(f"{base}/lab/tree/{TUTORIAL.name}?token={token}", wait_until="domcontentloaded")
    page.wait_for_function("() => window.jupyterapp && window.jupyterapp.shell.currentWidget"
                           " && window.jupyterapp.shell.currentWidget.sessionContext"
                           " && window.jupyterapp.shell.currentWidget.sessionContext.session"
                           " && window.jupyterapp.shell.currentWidget.sessionContext.session.kernel",
                           timeout=60_000)
    page.evaluate("() => window.jupyterapp.commands.execute('notebook:run-all-cells')")

    # The last cell lists the saved report folder: every cell before it has run by then.
    page.locator(".jp-OutputArea-output", has_text="verification.csv").wait_for(timeout=150_000)
    errs = page.locator('.jp-OutputArea-output[data-mime-type="application/vnd.jupyter.stderr"]')
    assert errs.count() == 0, errs.all_inner_texts()
    assert page.locator(".jp-OutputArea-output .fx-graph svg").count() >= 3  # stage views, g.view()
    assert page.locator(".jp-OutputArea-output .fx-graph svg .cluster").count() > 0  # fused regions

    stepper = page.locator(".fx-stepper")
    stepper.wait_for(timeout=30_000)
    assert stepper.locator(".fx-graph svg").count() == 1  # it opened on the graph view
    stepper.scroll_into_view_if_needed()
    stepper.locator("button", has_text="diff").click()
    stepper.locator("table.fx-diff").wait_for(timeout=20_000)
    stepper.locator("button", has_text="previous").click()
    stepper.locator(".fx-head .fx-name", has_text="layout").wait_for(timeout=20_000)
    stepper.locator("button", has_text="next").click()
    stepper.locator(".fx-head .fx-name", has_text="fusion").wait_for(timeout=20_000)
    stepper.locator("button", has_text="graph").click()
    stepper.locator(".fx-graph svg .cluster").first.wait_for(timeout=20_000)  # fused regions
    stepper.scroll_into_view_if_needed()
    page.screenshot(path=str(ARTIFACTS / "jupyterlab_stepper.png"))
    stepper.screenshot(path=str(ARTIFACTS / "stepper_widget.png"))
    assert not errors, errors
    page.close()


def test_html_report_opens_offline_in_the_browser(browser, tmp_path):
    from fexplore import cli

    assert cli.main(["compile", "cnn", "--out", str(tmp_path / "cnn")]) == 0
    page = browser.new_page()
    failed: list[str] = []
    # anything the page fetches beyond its own file would fail here (there is no network)
    page.on("requestfailed", lambda r: failed.append(r.url))
    page.goto((tmp_path / "cnn" / "report.html").as_uri(), wait_until="load")
    assert page.title() == "fexplore report: @forward"
    assert page.locator("h2").count() == len(page.locator(".fx-head").all()) - 1  # a head per stage
    assert page.locator(".fx-graph svg").count() >= 7
    assert page.locator("svg .cluster").count() > 0  # the fusion stage's regions
    assert page.locator("table.fx-diff").count() >= 1
    page.locator("#stage-fusion").scroll_into_view_if_needed()
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "report.png"))
    assert not failed, failed
    page.close()
