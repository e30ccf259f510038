"""The dashboard in a real browser: `headroom dashboard` serving a smoke-filled store to headless Chromium.

Needs Chromium and its driver (Debian: ``apt-get install chromium chromium-driver``);
skips itself without them, except in CI (``CI`` set), where it must run.
Screenshots of every page, whole, go to test-artifacts/.

Charts render as SVG (headroom.dashboard.charts.SVG), so their axis labels and legend entries are <text> elements:
the test reads them, checks none is cut short ("…") or drawn outside its chart's box (a clipped legend), and
looks for the Plan page's full candidate labels, every memory component and the budget's label.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

ARTIFACTS = Path(__file__).resolve().parents[1] / "test-artifacts"
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")
DRIVER = shutil.which("chromedriver")
PAGES = {
    "plan": ("Plan a training run", "Recommendation:", "Chosen layout:", "Step time by term", "Memory per rank kind",
             "Peak memory by component", "Ranked candidates"),
    "hardware": ("Hardware", "Roofline", "Matmul TFLOP/s by size", "Bandwidth by op"),
    "history": ("History", "Compare runs", "Timeline"),
    "calibration": ("Calibration", "Memory (GB)", "saved-activation bytes", "Step time (s)", "What plans apply"),
}
CHARTS = {"plan": 4, "hardware": 3, "history": 1, "calibration": 2}
"""Charts each page draws on the smoke store."""
CHART_TEXTS = """
return Array.from(document.querySelectorAll("[data-testid='stVegaLiteChart']")).map(chart => {
  const box = chart.getBoundingClientRect();
  const svg = chart.querySelector("svg");
  const view = svg ? svg.getBoundingClientRect() : box;
  const inside = (r, b) => r.left >= b.left - 1 && r.right <= b.right + 1 && r.top >= b.top - 1 && r.bottom <= b.bottom + 1;
  return Array.from(chart.querySelectorAll("svg text")).filter(t => t.textContent.trim()).map(t => {
    const r = t.getBoundingClientRect();
    return [t.textContent, inside(r, box) && inside(r, view)];
  });
});
"""
"""Each chart's SVG texts, in page order, each with whether it lies inside the chart's box and its SVG's."""
CHROMIUM_FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync",
                  "--window-size=1400,1800")

pytestmark = pytest.mark.slow


def _require_browser() -> None:
    missing = [name for name, path in (("chromium", CHROMIUM), ("chromedriver", DRIVER)) if not path]
    try:
        import selenium  # noqa: F401
    except ModuleNotFoundError:
        missing.append("selenium (pip install -e '.[test]')")
    if missing:
        message = f"the browser test needs {', '.join(missing)} (apt-get install chromium chromium-driver)"
        if os.environ.get("CI"):
            pytest.fail(f"{message}; CI must run it")
        pytest.skip(message)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_healthy(port: int, server: subprocess.Popen, timeout_s: float = 90) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if server.poll() is not None:
            pytest.fail(f"headroom dashboard exited with {server.returncode}: {server.stdout.read()}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/_stcore/health", timeout=2) as response:
                if response.read().strip() == b"ok":
                    return
        except OSError:
            pass
        time.sleep(0.5)
    pytest.fail(f"the dashboard did not answer /_stcore/health within {timeout_s:.0f} s")


@contextlib.contextmanager
def _serving(url: str, tmp_path: Path):
    """`headroom dashboard` over the store at ``url``; yields its address."""
    _require_browser()
    port = _free_port()
    env = {k: v for k, v in os.environ.items() if k != "HEADROOM_DB"} | {"XDG_DATA_HOME": str(tmp_path)}
    server = subprocess.Popen(
        [sys.executable, "-m", "headroom.cli.main", "dashboard", "--db", url, "--port", str(port)],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, start_new_session=True,
    )
    try:
        _wait_healthy(port, server)
        yield f"http://127.0.0.1:{port}"
    finally:
        server.terminate()
        try:
            server.wait(timeout=15)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()


def _chromium(tmp_path: Path):
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in (*CHROMIUM_FLAGS, f"--user-data-dir={tmp_path / 'chromium'}"):
        options.add_argument(flag)
    return webdriver.Chrome(service=Service(DRIVER), options=options)


@pytest.fixture
def dashboard(smoke_store, tmp_path):
    with _serving(smoke_store.url, tmp_path) as address:
        yield address


def test_a_stored_name_with_markdown_renders_as_its_characters(markup_store, tmp_path):
    """A forged bundle's device name is shown as text on the Hardware page: no link, no remote image."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    from headroom.dashboard.text import WORD_JOINER
    from tests.conftest import MARKUP_NAME

    with _serving(markup_store, tmp_path) as address:
        browser = _chromium(tmp_path)
        try:
            browser.get(f"{address}/hardware")
            WebDriverWait(browser, 90, poll_frequency=0.5).until(
                lambda d: "matmul, " in d.find_element(By.TAG_NAME, "body").text)
            body = browser.find_element(By.TAG_NAME, "body").text.replace(WORD_JOINER, "")  # invisible
            assert MARKUP_NAME in body, body
            live = browser.find_elements(By.CSS_SELECTOR, "a[href*='evil.example'], img[src*='evil.example']")
            assert not live, [e.get_attribute("outerHTML")[:300] for e in live]
        finally:
            browser.quit()


def expected_plan() -> dict[str, set[str]]:
    """What the Plan page's charts must show in full for the default inputs (the smoke store's CPU is not the
    default hardware, so the page plans from the datasheet, as here)."""
    from headroom.dashboard import charts, plan_tables, planning

    inputs = planning.PlanInputs()
    plan = planning.make_plan(inputs, planning.resolve_preset(inputs.model), *planning.datasheet_hardware(inputs.hardware))
    shown = plan_tables.shown_candidates(plan)
    peak = plan_tables.peak_components_frame(plan, shown)
    ranks = plan_tables.rank_memory_frame(plan, {"": plan.recommendation})
    held = {frame_name: {charts.plain_name(c) for c in frame.loc[frame["gb"] > 0, "component"]}
            for frame_name, frame in (("peak", peak), ("ranks", ranks))}
    return {
        "peak": {*(plan_tables.candidate_label(plan, c) for c in shown), *held["peak"], "budget 80 GB"},
        "ranks": {*held["ranks"], "budget 80 GB", "every rank"},
        "time": {str(plan.recommendation.layout), *plan_tables.TIME_TERMS},
        "scatter": {"fits", "rejected", "budget 80 GB", *{str(c.config.recompute) for c in plan.candidates}},
    }


def test_every_page_renders_in_chromium(dashboard, tmp_path):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    ARTIFACTS.mkdir(exist_ok=True)
    browser = _chromium(tmp_path)
    plan_charts = expected_plan()

    def charts_drawn(driver) -> bool:
        texts = driver.execute_script(CHART_TEXTS)
        return len(texts) == CHARTS[page] and all(texts)

    def screenshot(name: str) -> None:
        """The whole page: the window as tall as Streamlit's scrolling main column."""
        height = browser.execute_script("return document.querySelector('[data-testid=\"stMain\"]').scrollHeight")
        browser.set_window_size(1400, max(1800, height + 100))
        time.sleep(1)
        browser.save_screenshot(str(ARTIFACTS / name))
        browser.set_window_size(1400, 1800)

    try:
        for page, expected in PAGES.items():
            browser.get(f"{dashboard}/{'' if page == 'plan' else page}")  # Plan is the default page: /

            def rendered(driver) -> bool:
                body = driver.find_element(By.TAG_NAME, "body").text
                # Still running, or elements still drawn as grey placeholders: not rendered yet.
                busy = driver.find_elements(By.CSS_SELECTOR, "[data-testid='stStatusWidget'], [data-testid='stSkeleton']")
                return all(text in body for text in expected) and not busy

            try:
                WebDriverWait(browser, 90, poll_frequency=0.5).until(rendered)
                WebDriverWait(browser, 30, poll_frequency=0.5).until(charts_drawn)
            finally:
                screenshot(f"dashboard-{page}.png")
            body = browser.find_element(By.TAG_NAME, "body").text
            assert not browser.find_elements(By.CSS_SELECTOR, "[data-testid='stException']"), f"{page}: {body}"
            assert "Traceback" not in body and "Page not found" not in body, f"{page}: {body}"
            assert "headroom agent run --suite quick" not in body  # the store is not empty
            charts = browser.execute_script(CHART_TEXTS)
            for number, chart in enumerate(charts):
                cut = [text for text, _ in chart if text.endswith("…")]
                outside = [text for text, inside in chart if not inside]
                assert not cut and not outside, f"{page} chart {number}: cut {cut}, outside its box {outside}"
            if page == "plan":
                assert "Confidence:" in body and "datasheet" in body
                texts = [{text for text, _ in chart} for chart in charts]
                time_chart, ranks, peak, scatter = texts  # the page's order
                for name, found in (("time", time_chart), ("ranks", ranks), ("peak", peak), ("scatter", scatter)):
                    assert plan_charts[name] <= found, f"{name} misses {plan_charts[name] - found}"
                compare_with_another_plan(browser, By)
        assert len(browser.find_elements(By.CSS_SELECTOR, "canvas, svg")) > 0
    finally:
        browser.quit()


def compare_with_another_plan(browser, by) -> None:
    """Submit the Plan page's compare form with another budget; both plans show side by side."""
    from selenium.webdriver.common.keys import Keys
    from selenium.webdriver.support.ui import WebDriverWait

    from headroom.dashboard.planning import PlanInputs

    model = PlanInputs().model
    budget = browser.find_element(by.CSS_SELECTOR, "input[aria-label='budget per GPU']")
    budget.send_keys("60GB", Keys.TAB)
    next(b for b in browser.find_elements(by.TAG_NAME, "button") if b.text == "Compare").click()
    WebDriverWait(browser, 60, poll_frequency=0.5).until(
        lambda driver: f"Other plan: {model} on h100-sxm (datasheet), budget 60.0 GB"
        in driver.find_element(by.TAG_NAME, "body").text)
    body = browser.find_element(by.TAG_NAME, "body").text
    assert f"This plan: {model} on h100-sxm (datasheet), budget 80.0 GB" in body
    heading = browser.find_element(by.XPATH, "//*[contains(text(), 'Other plan:')]")
    browser.execute_script("arguments[0].scrollIntoView({block: 'center'})", heading)
    browser.save_screenshot(str(ARTIFACTS / "dashboard-plan-compare.png"))
