"""The dashboard (epochstream/dashboard.py, `epochstream dashboard`): its series against a known
truth, its JSON API, and the page in a real headless Chromium (Debian's chromium and
chromium-driver, installed by the Makefile; never skipped): it loads without console errors,
shows the topics, the lag plot grows while a publisher goes on, and the epoch browser shows the
right records, page by page. A screenshot is kept as an artifact
($EPOCHSTREAM_TEST_ARTIFACTS, else the test's tmp_path)."""

import json
import os
import shutil
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import pytest

from epochstream import Catalog, Publisher, Retention, Subscriber
from epochstream.dashboard import Dashboard, DashboardHistory, frontier_value
from epochstream.order import product
from epochstream.report import read_report

CHROMIUM, DRIVER = "/usr/bin/chromium", "/usr/bin/chromedriver"


def _records(t, n=120):
    return [{"carrier": "AA" if i % 2 else "UA", "day": t, "i": i} for i in range(n)]


def _publish(pub, times):
    for t in times:
        pub.send(t, _records(t))
        pub.advance_to(t + 1)
    pub.flush()


def _get(url):
    with urllib.request.urlopen(url, timeout=10) as r:
        return json.load(r)


def test_frontier_value_is_the_plotted_number():
    assert frontier_value((7,)) == 7
    assert frontier_value(((3, 9), (5, 1))) == 3  # the outer epoch every element reached
    assert frontier_value(()) is None and frontier_value(None) is None


def test_the_history_keeps_bounded_series_of_the_known_truth(tmp_path):
    cat = Catalog(tmp_path)
    with Publisher("t", catalog=cat, retention=Retention()) as pub:
        _publish(pub, range(10))
        with Subscriber("t", cat, durable="d", start="earliest") as sub:
            it = sub.epochs(timeout=5)
            for _ in range(4):
                sub.ack(next(it))
            h = DashboardHistory(keep=3)
            for _ in range(5):
                h.add(read_report(cat))
            state = h.to_json()
    assert state["samples"] == 5
    (t,) = state["topics"]
    (p,) = t["partitions"]
    assert p["lower"] == [10] and len(p["series"]["t"]) == 3  # bounded to keep
    assert p["series"]["lower"] == [10, 10, 10]
    (r,) = t["readers"]
    assert (r["kind"], r["name"], r["lag_epochs"], r["position"]) == ("durable", "d", 6, [4])
    assert r["series"]["lag_epochs"] == [6, 6, 6]


def test_the_api_serves_the_state_the_retained_epochs_and_pages_of_records(tmp_path):
    cat = Catalog(tmp_path)
    with Publisher("p", catalog=cat, order=product(2), retention=Retention()) as pub:
        pub.send((0, 0), _records(0, 5))
        pub.send((1, 0), _records(1, 7))
        pub.advance_to((2, 0))
        pub.flush()
        with Dashboard(cat, "tcp://127.0.0.1:*", interval=0.1) as board:
            state = _get(board.url + "api/state")
            assert [t["name"] for t in state["topics"]] == ["p"]
            assert state["topics"][0]["partitions"][0]["lower"] == [[2, 0]]
            epochs = _get(board.url + "api/epochs?topic=p")["epochs"]
            assert [e["time"] for e in epochs] == [[1, 0], [0, 0]]  # newest first
            page = _get(board.url + "api/epoch?topic=p&time=%5B1%2C0%5D&page=1&size=3")
            assert (page["total"], page["page"], page["records"]) == (
                7, 1, [r for r in _records(1, 7)][3:6])
            for bad in ("api/epoch?topic=p&time=%5B9%2C9%5D", "api/epochs?topic=nope"):
                with pytest.raises(urllib.error.HTTPError) as e:
                    urllib.request.urlopen(board.url + bad, timeout=10)
                assert e.value.code == 404 and "error" in json.load(e.value)
            with urllib.request.urlopen(board.url, timeout=10) as r:
                assert b"epochstream" in r.read()
            with urllib.request.urlopen(board.url + "static/vendor/uPlot.iife.min.js") as r:
                assert len(r.read()) > 40_000  # the vendored chart library, no CDN


def test_the_dashboard_command_serves_and_stops_on_sigterm(tmp_path):
    cat = Catalog(tmp_path)
    with Publisher("t", catalog=cat) as pub:
        _publish(pub, range(3))
        proc = subprocess.Popen([sys.executable, "-m", "epochstream", "dashboard", "--catalog",
                                 str(tmp_path), "--bind", "tcp://127.0.0.1:*"],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            line = proc.stdout.readline()
            assert line.startswith("dashboard on http://127.0.0.1:"), line
            url = line.split()[2]
            assert [t["name"] for t in _get(url + "api/state")["topics"]] == ["t"]
        finally:
            proc.terminate()
            assert proc.wait(20) == 0
    assert "dashboard stopped" in proc.stderr.read()


def _browser(tmp_path):
    for path in (CHROMIUM, DRIVER):
        assert os.path.exists(path), (f"{path} is missing: the dashboard's browser test needs "
                                      f"Debian's chromium and chromium-driver (make test "
                                      f"installs them)")
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    opts = webdriver.ChromeOptions()
    opts.binary_location = CHROMIUM
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                 "--disable-background-networking", "--disable-component-update",
                 "--disable-sync", "--no-first-run", "--window-size=1280,1000",
                 f"--user-data-dir={tmp_path / 'chrome'}"):
        opts.add_argument(flag)
    opts.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    return webdriver.Chrome(service=Service(DRIVER), options=opts)


def _wait(what, check, timeout=20.0):
    deadline = time.monotonic() + timeout
    while True:
        got = check()
        if got:
            return got
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


def test_the_page_in_a_real_headless_chromium(tmp_path):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    cat = Catalog(tmp_path / "cat")
    with Publisher("flights", catalog=cat, partitions=2, retention=Retention()) as p0, \
            Publisher("flights", 1, catalog=cat, partitions=2, retention=Retention()) as p1:
        for pub in (p0, p1):
            _publish(pub, range(5))
        sub = Subscriber("flights", cat, durable="billing", start="earliest")
        it = sub.epochs(timeout=5)
        sub.ack(next(it))
        stop = threading.Event()

        def go_on():  # the publishers keep publishing: the reader's lag grows
            t = 5
            while not stop.wait(0.15) and t < 60:
                for pub in (p0, p1):
                    _publish(pub, [t])
                t += 1

        board = Dashboard(cat, "tcp://127.0.0.1:*", interval=0.2).start()
        driver = _browser(tmp_path)
        writer = threading.Thread(target=go_on, daemon=True)
        try:
            driver.get(board.url)
            _wait("the topics table", lambda: driver.find_elements(
                By.CSS_SELECTOR, "#topics tbody tr[data-topic='flights']"))
            chart = _wait("the lag chart", lambda: driver.find_elements(
                By.ID, "lag-flights-durable-billing"))[0]
            lag0 = int(driver.find_element(By.CSS_SELECTOR, ".reader[data-name='billing']")
                       .get_attribute("data-lag-epochs"))
            points0 = int(chart.get_attribute("data-points"))
            writer.start()
            _wait("the lag plot to grow while the publishers go on", lambda: (
                int(driver.find_element(By.ID, "lag-flights-durable-billing")
                    .get_attribute("data-points")) >= points0 + 5
                and int(driver.find_element(By.CSS_SELECTOR, ".reader[data-name='billing']")
                        .get_attribute("data-lag-epochs")) > lag0 + 3))
            assert driver.find_elements(By.ID, "frontier-flights")  # the frontier plot
            # the epoch browser: epoch 3 of both partitions, 240 records, 50 a page
            Select(driver.find_element(By.ID, "browse-topic")).select_by_value("flights")
            _wait("the epoch list", lambda: len(driver.find_elements(
                By.CSS_SELECTOR, "#browse-epoch option")) > 5)
            Select(driver.find_element(By.ID, "browse-epoch")).select_by_value("3")
            _wait("the first page", lambda: "of 240" in driver.find_element(
                By.ID, "page-info").text)
            rows = driver.find_elements(By.CSS_SELECTOR, "#records tbody tr")
            heads = [th.text for th in driver.find_elements(By.CSS_SELECTOR, "#records th")]
            assert len(rows) == 50 and heads == ["carrier", "day", "i"]
            assert {r.find_elements(By.TAG_NAME, "td")[1].text for r in rows} == {"3"}
            driver.find_element(By.ID, "next").click()
            _wait("the second page", lambda: driver.find_element(By.ID, "page-info").text
                  .startswith("records 51–100 of 240"))
            artifacts = Path(os.environ.get("EPOCHSTREAM_TEST_ARTIFACTS", tmp_path))
            artifacts.mkdir(parents=True, exist_ok=True)
            assert driver.save_screenshot(str(artifacts / "dashboard.png"))
            errors = [e for e in driver.get_log("browser") if e["level"] == "SEVERE"]
            assert not errors, errors
        finally:
            stop.set()
            driver.quit()
            board.stop()
            sub.close()
            shutil.rmtree(tmp_path / "chrome", ignore_errors=True)
