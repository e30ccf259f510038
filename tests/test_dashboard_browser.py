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
import re
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
def _serving(url: str, tmp_path: Path, source: str = "--db"):
    """`headroom dashboard` over the store at ``url`` (``source="--bundle"``: the bundle file at ``url``); yields
    its address."""
    _require_browser()
    port = _free_port()
    env = {k: v for k, v in os.environ.items() if k != "HEADROOM_DB"} | {"XDG_DATA_HOME": str(tmp_path)}
    server = subprocess.Popen(
        [sys.executable, "-m", "headroom.cli.main", "dashboard", source, url, "--port", str(port)],
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
    table = plan_tables.candidates_frame(plan)  # the scatter draws the Pareto front inside its window
    front = table[plan_tables.pareto_front(table) & plan_tables.in_window(table, plan_tables.decision_window(plan))]
    return {
        "peak": {*(plan_tables.candidate_label(plan, c) for c in shown), *held["peak"], "budget 80 GB"},
        "ranks": {*held["ranks"], "budget 80 GB", "every rank"},
        "time": {str(plan.recommendation.layout), *plan_tables.TIME_TERMS},
        "scatter": {"fits", "rejected", "budget 80 GB", *front["recompute"]},
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
                upload_a_network_file(browser, By, tmp_path)
                upload_nccl_tests_output(browser, By, tmp_path)
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


# --- The Plan page of a GPU's bundle at 1,440 px: the measured GPU, a budget that follows it, no text cut short --

REFERENCE_BUNDLE = Path(__file__).parent / "data" / "reference" / "nvidia-h200-2026-11-30.json.gz"
WIDE = (1440, 1800)
"""The window the page must read whole in (issue 43: layout names, rejection reasons, dropdowns and exports
were cut short at this width)."""
SEARCH = "gpus=8&pp=2&budget=10GB&interconnect=infinity-fabric"
"""A search with all of it on the page: 8 GPUs, pp pinned at 2 (a layout the HF Trainer, Lightning and
DeepSpeed cannot express), a budget that rejects candidates, the interconnect with the longest name; under a
second to plan."""
CUT_TEXTS = """
const cut = [];
for (const el of document.querySelectorAll("[data-testid='stMain'] *, [data-testid='stSidebar'] *")) {
  if (el.closest("[data-testid='stDataFrame']") || el.clientWidth === 0) continue;  // grids: GRID_TEXTS
  const text = el.tagName === "INPUT" ? el.value : (el.innerText || "");
  if (!text.trim()) continue;
  const style = getComputedStyle(el);
  const clips = el.tagName === "INPUT" || style.textOverflow === "ellipsis"
    || ["hidden", "clip", "auto", "scroll"].includes(style.overflowX);
  if (clips && el.scrollWidth > el.clientWidth + 1) {
    cut.push([el.tagName, el.getAttribute("aria-label") || el.getAttribute("data-testid") || "", text.slice(0, 80),
              el.scrollWidth, el.clientWidth]);
  }
}
return cut;
"""
"""Every text on the page (a select's value, the export code, a heading) wider than the box that clips it."""
GRID_TEXTS = """
return Array.from(document.querySelectorAll("[data-testid='stDataFrame']")).map(frame => {
  const scroller = frame.querySelector(".dvn-scroller");
  const themed = Array.from(frame.querySelectorAll("*")).find(e => getComputedStyle(e).getPropertyValue("--gdg-font-family"));
  const theme = getComputedStyle(themed || frame);
  const context = document.createElement("canvas").getContext("2d");
  context.font = `${theme.getPropertyValue("--gdg-base-font-style")} ${theme.getPropertyValue("--gdg-font-family")}`;
  const headers = {};
  frame.querySelectorAll("th[aria-colindex]").forEach(th => { headers[th.getAttribute("aria-colindex")] = th.textContent; });
  const cells = Array.from(frame.querySelectorAll("td[aria-colindex]")).map(td =>
    [headers[td.getAttribute("aria-colindex")], td.textContent, context.measureText(td.textContent).width]);
  return {sideways: scroller ? scroller.scrollWidth - scroller.clientWidth : 0, font: context.font, cells: cells};
});
"""
"""Each table's overflow sideways (its columns wider than the page) and its shown cells: header, text, and the
width the grid's own font draws the text in (the grid draws on a canvas: no element to measure)."""
WHOLE = {"layout", "candidate", "what breaks the budget", "why not chosen"}
"""The Plan page's text columns, sized from their text (headroom.dashboard.widths)."""


def upload_a_network_file(browser, by, tmp_path: Path) -> None:
    """The sidebar's network file (as `headroom plan --network FILE`): it fills GPUs per node and the inter-node
    network it gives; one with an unknown key is refused, naming the file and the key."""
    from selenium.webdriver.support.ui import WebDriverWait

    def field(label: str):
        return browser.find_element(by.CSS_SELECTOR, f"[data-testid='stSidebar'] input[aria-label='{label}']")

    def upload(name: str, text: str) -> None:
        path = tmp_path / name
        path.write_text(text)
        browser.find_element(by.CSS_SELECTOR, "[data-testid='stSidebar'] input[type='file']").send_keys(str(path))

    upload("cluster.toml", 'gpus_per_node = 4\ninterconnect = "4x200g"\n')
    WebDriverWait(browser, 30, poll_frequency=0.5).until(lambda _: field("GPUs per node").get_attribute("value") == "4")
    assert field("inter-node network").get_attribute("value") == "4x200g"
    upload("colour.toml", 'colour = "red"\n')
    WebDriverWait(browser, 30, poll_frequency=0.5).until(
        lambda d: "network file colour.toml: unknown key 'colour'" in d.find_element(by.TAG_NAME, "body").text)


def upload_nccl_tests_output(browser, by, tmp_path: Path) -> None:
    """The sidebar's nccl-tests output (as `headroom plan --nccl-tests FILE`), after the network file's 4 GPUs a
    node: one node's all_reduce_perf over 4 GPUs; searched over 4 GPUs, the plan's cluster names its collectives."""
    from selenium.webdriver.common.keys import Keys
    from selenium.webdriver.support.ui import WebDriverWait

    from tests.test_nccl_tests import log

    path = tmp_path / "all_reduce.log"
    path.write_bytes(log(ranks=4))
    browser.find_elements(by.CSS_SELECTOR, "[data-testid='stSidebar'] input[type='file']")[1].send_keys(str(path))
    gpus = browser.find_element(by.CSS_SELECTOR, "[data-testid='stSidebar'] input[aria-label='GPUs to search']")
    gpus.send_keys(Keys.CONTROL, "a")
    gpus.send_keys("4", Keys.TAB)
    WebDriverWait(browser, 90, poll_frequency=0.5).until(
        lambda d: "by nccl-tests on NVIDIA H100 80GB HBM3 (all_reduce.log: all_reduce over 4)"
        in d.find_element(by.TAG_NAME, "body").text)


def _plan_page(browser, address: str, query: str, shows: str) -> str:
    """The Plan page of ``query`` once it has run and shows ``shows`` (90 s at most); its text."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    browser.get(f"{address}/?{query}")

    def rendered(driver) -> bool:
        busy = driver.find_elements(By.CSS_SELECTOR, "[data-testid='stStatusWidget'], [data-testid='stSkeleton']")
        return shows in driver.find_element(By.TAG_NAME, "body").text and not busy

    WebDriverWait(browser, 90, poll_frequency=0.5).until(rendered)
    body = browser.find_element(By.TAG_NAME, "body").text
    assert not browser.find_elements(By.CSS_SELECTOR, "[data-testid='stException']"), body
    return body


def test_the_plan_page_plans_the_measured_gpu_and_cuts_no_text_at_1440_px(tmp_path):
    """`headroom dashboard --bundle` of the H200 reference run: the Plan page starts on the measured H200, the
    budget follows the card (all of an A100 40GB; 80 of an H200's 141 GB), and at 1,440 px no layout name,
    rejection reason, select's value or export is cut short; the export opens on a format that expresses the
    layout."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    from headroom.dashboard.widths import text_px

    ARTIFACTS.mkdir(exist_ok=True)
    with _serving(str(REFERENCE_BUNDLE), tmp_path, source="--bundle") as address:
        browser = _chromium(tmp_path)
        try:
            browser.set_window_size(*WIDE)
            body = _plan_page(browser, address, SEARCH, "Export")
            hardware = browser.find_element(By.CSS_SELECTOR, "[data-testid='stSidebar'] input[aria-label='hardware']")
            assert hardware.get_attribute("value") == "measured: NVIDIA H200"  # no hardware in the URL
            assert "NVIDIA H200 (measured)" in body and "datasheet: h100-sxm" not in body

            # Tables: drawn on a canvas, so measured in the grid's own font against what the page sized them for.
            WebDriverWait(browser, 30, poll_frequency=0.5).until(lambda d: d.execute_script(
                "return document.fonts.status") == "loaded" and sum(bool(g["cells"]) for g in d.execute_script(
                    GRID_TEXTS)) >= 3)  # layouts searched, ranked, rejected
            grids = browser.execute_script(GRID_TEXTS)
            assert [g["sideways"] for g in grids] == [0] * len(grids), "a table scrolls sideways at 1,440 px"
            checked = [(header, text, width) for g in grids for header, text, width in g["cells"] if header in WHOLE]
            assert {header for header, _, _ in checked} == WHOLE, grids[0]["font"]
            wider = [(header, text, round(width, 1), round(text_px(text), 1)) for header, text, width in checked
                     if width > text_px(text)]
            assert not wider, f"drawn wider than headroom.dashboard.widths allows in {grids[0]['font']}: {wider}"

            # Everything else, and the export tabs: the first expresses the layout; each one's code wraps whole.
            tabs = browser.find_elements(By.CSS_SELECTOR, "[data-testid='stTabs'] [role='tab']")
            labels = [tab.text for tab in tabs]
            assert "(approximate)" not in labels[0] and "hf (approximate)" in labels, labels
            for tab in tabs:
                browser.execute_script("arguments[0].click()", tab)
                WebDriverWait(browser, 10, poll_frequency=0.2).until(
                    lambda _, tab=tab: tab.get_attribute("aria-selected") == "true")
                cut = browser.execute_script(CUT_TEXTS)
                assert not cut, f"cut short at 1,440 px with the {tab.text} tab open: {cut}"
            height = browser.execute_script("return document.querySelector('[data-testid=\"stMain\"]').scrollHeight")
            browser.set_window_size(WIDE[0], max(WIDE[1], height + 100))
            browser.save_screenshot(str(ARTIFACTS / "dashboard-plan-1440.png"))
            browser.set_window_size(*WIDE)

            # The budget follows the card: all of a smaller one, 80 GB of a bigger one and the page says so.
            a100 = _plan_page(browser, address, "hardware=a100-sxm-40gb", "Recommendation")
            assert re.search(r"budget 40(\.0)? GB per GPU", a100), a100[:2000]
            h200 = _plan_page(browser, address, "hardware=h200", "Recommendation")
            assert re.search(r"budget 80(\.0)? GB per GPU", h200), h200[:2000]
            assert re.search(r"\b80(\.0)? (GB )?of (the )?([\w-]+'s )?141(\.0)? GB", h200), h200[:2000]
        finally:
            browser.quit()
