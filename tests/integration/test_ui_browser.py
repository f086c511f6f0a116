"""The web UI in a real browser: headless Chromium (Debian's, installed by scripts/_browser.sh)
driven through chromedriver, against a real broker, processor, worker and run index.

Open the runs list, filter by status and label, open the run, see its graph and timeline, send
the approval signal from the form, and see the run turn `succeeded` without a reload.
RUNFOLD_UI_SCREENSHOT=path saves a screenshot of the run page (the README's).
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from executor_support import WorkerThread
from processor_support import make_settings, running
from test_index import APPROVAL, EXAMPLES, FAILING
from ui_support import ui_server

from processors.client import RunClient
from processors.executors import Worker
from processors.runtime.settings import ProcessorSettings
from topology.admin import create_topology
from topology.settings import KafkaSettings

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]
REPO = Path(__file__).resolve().parents[2]


def _browser_binaries() -> tuple[str, str]:
    done = subprocess.run(["bash", str(REPO / "scripts" / "_browser.sh")], capture_output=True, text=True)
    lines = done.stdout.split()
    if done.returncode != 0 or len(lines) != 2:
        reason = f"BROWSER TEST NOT RUN: chromium could not be installed: {done.stderr.strip()[-500:]}"
        if os.environ.get("CI"):
            pytest.fail(reason)  # CI must have a browser
        pytest.skip(reason)
    return lines[0], lines[1]


@pytest.fixture(scope="module")
def browser() -> Iterator[object]:
    chromium, driver_path = _browser_binaries()
    from selenium import webdriver  # selenium is imported only once a browser exists
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--window-size=1400,1800"):
        options.add_argument(arg)
    driver = webdriver.Chrome(service=Service(executable_path=driver_path), options=options)
    driver.set_page_load_timeout(30)
    try:
        yield driver
    finally:
        driver.quit()


@pytest.fixture
def settings(
    kafka_bootstrap: str, topic_prefix: str, tmp_path: Path, kafka_settings: KafkaSettings
) -> ProcessorSettings:
    s = make_settings(kafka_bootstrap, topic_prefix, tmp_path / "state")
    create_topology(s)
    return s


def test_filter_open_signal_and_see_it_succeed_without_reload(
    browser: object, settings: ProcessorSettings, tmp_path: Path
) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as ec
    from selenium.webdriver.support.ui import Select, WebDriverWait

    driver: object = browser
    kafka = KafkaSettings(bootstrap_servers=settings.bootstrap_servers, topic_prefix=settings.topic_prefix)
    worker = Worker(name="browser-test", queues=["default", "agents"])
    with RunClient(kafka, timeout_s=10) as client:
        # registered before the processor starts, which reads every definition before it folds
        # a command: one registered while it runs may reach it after a StartRun that names it
        client.register(EXAMPLES / "one-step.yaml")
        client.register(APPROVAL)
        client.register(FAILING)
    with (
        RunClient(kafka, timeout_s=10) as client,
        running(settings),
        WorkerThread(worker, settings),
    ):
        done = client.start("one-step", {"text": "hi"}, labels={"team": "a"})
        other = client.start("failing", {}, labels={"team": "b"})
        waiting = client.start("approval", {"text": "draft"}, labels={"team": "a"})
        client.wait_all([done, other], timeout=60)
        for ev in client.events(waiting, follow=True, timeout=30):
            if ev["type"] == "RunWaiting":
                break
        with ui_server(kafka, tmp_path / "ui.sqlite", token="browser-test-token") as base:
            wait = WebDriverWait(driver, 30)
            driver.get(f"{base}/?token=browser-test-token")  # type: ignore[attr-defined]
            # the list is live: it shows every run once the index holds it
            wait.until(
                lambda d: (
                    {
                        r.get_attribute("data-run-id")
                        for r in d.find_elements(By.CSS_SELECTOR, "#runs-table tbody tr[data-run-id]")
                    }
                    == {done, other, waiting}
                )
            )
            # filter by status and label
            Select(driver.find_element(By.ID, "filter-status")).select_by_value("waiting")  # type: ignore[attr-defined]
            driver.find_element(By.ID, "filter-label").send_keys("team=a")  # type: ignore[attr-defined]
            driver.find_element(By.ID, "filter-apply").click()  # type: ignore[attr-defined]
            wait.until(ec.url_contains("status=waiting"))
            rows = driver.find_elements(By.CSS_SELECTOR, "#runs-table tbody tr[data-run-id]")  # type: ignore[attr-defined]
            assert [r.get_attribute("data-run-id") for r in rows] == [waiting]
            # open the run: its graph (laid out by dagre) and its timeline
            rows[0].find_element(By.TAG_NAME, "a").click()
            review = wait.until(
                ec.presence_of_element_located((By.CSS_SELECTOR, '#run-graph svg g.node[data-node="review"]'))
            )
            assert review.get_attribute("data-status") == "waiting"
            draft = driver.find_element(By.CSS_SELECTOR, '#run-graph svg g.node[data-node="draft"]')  # type: ignore[attr-defined]
            assert draft.get_attribute("data-status") == "succeeded"
            timeline = driver.find_elements(By.CSS_SELECTOR, "#timeline .tl-row")  # type: ignore[attr-defined]
            assert {t.get_attribute("data-step"): t.get_attribute("data-status") for t in timeline} == {
                "draft": "succeeded",
                "review": "waiting",
            }
            assert driver.find_element(By.ID, "run-status").get_attribute("data-status") == "waiting"  # type: ignore[attr-defined]
            driver.execute_script("window.__sameDocument = true;")  # type: ignore[attr-defined]
            # the approval from the form
            assert driver.find_element(By.ID, "signal-name").get_attribute("value") == "approval"  # type: ignore[attr-defined]
            driver.find_element(By.ID, "signal-send").click()  # type: ignore[attr-defined]
            answer = wait.until(ec.presence_of_element_located((By.ID, "answer")))
            assert answer.get_attribute("data-ok") == "true", answer.text
            assert "SignalReceived" in answer.text
            wait.until(
                lambda d: d.find_element(By.ID, "run-status").get_attribute("data-status") == "succeeded"
            )
            assert driver.execute_script("return window.__sameDocument === true;")  # type: ignore[attr-defined]
            node = driver.find_element(By.CSS_SELECTOR, '#run-graph svg g.node[data-node="review"]')  # type: ignore[attr-defined]
            assert node.get_attribute("data-status") == "succeeded"
            shot = os.environ.get("RUNFOLD_UI_SCREENSHOT")
            if shot:
                driver.save_screenshot(shot)  # type: ignore[attr-defined]
