"""The dashboard in a real browser: `headroom dashboard` serving a smoke-filled store to headless Chromium.

Needs Chromium and its driver (Debian: ``apt-get install chromium chromium-driver``);
skips itself without them, except in CI (``CI`` set), where it must run.
Screenshots of every page go to test-artifacts/.
"""

from __future__ import annotations

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


@pytest.fixture
def dashboard(smoke_store, tmp_path):
    _require_browser()
    url, _ = smoke_store
    port = _free_port()
    env = {k: v for k, v in os.environ.items() if k != "HEADROOM_DB"} | {"XDG_DATA_HOME": str(tmp_path)}
    server = subprocess.Popen(
        [sys.executable, "-m", "cli.main", "dashboard", "--db", url, "--port", str(port)],
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


def test_every_page_renders_in_chromium(dashboard, tmp_path):
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in (*CHROMIUM_FLAGS, f"--user-data-dir={tmp_path / 'chromium'}"):
        options.add_argument(flag)
    ARTIFACTS.mkdir(exist_ok=True)
    browser = webdriver.Chrome(service=Service(DRIVER), options=options)
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
            finally:
                browser.save_screenshot(str(ARTIFACTS / f"dashboard-{page}.png"))
            body = browser.find_element(By.TAG_NAME, "body").text
            assert not browser.find_elements(By.CSS_SELECTOR, "[data-testid='stException']"), f"{page}: {body}"
            assert "Traceback" not in body and "Page not found" not in body, f"{page}: {body}"
            assert "headroom agent run --suite quick" not in body  # the store is not empty
            if page == "plan":
                assert "Confidence:" in body and "datasheet" in body
        assert len(browser.find_elements(By.CSS_SELECTOR, "canvas, svg")) > 0
    finally:
        browser.quit()
