"""The staff dashboard: admin pages over a real store (embedded broker), with Django's test client (access,
numbers against the store, lookups, the chart data, aliases) and in a real browser (Debian's chromium driven
by Selenium against `live_server`: pages render, a lookup finds a message, the charts draw, no console
errors)."""

from __future__ import annotations

import os
import re
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth import get_user_model
from django.test import Client, override_settings
from django.urls import reverse

from rmq_eventstore.client import Message, PullConsumer
from rmq_eventstore.django.connection import EventStore, _embedded, close_embedded_brokers, stores
from tests.django_face.conftest import BROKER, store_at
from tests.django_face.testapp.models import AuditEvent, OrderEvent

FAST_STATS = {**BROKER, "stats_sample_interval": 200}
PAGES = ("changelist", "topics", "groups", "lookup", "charts", "chart_data")


def url(name: str, **query: str) -> str:
    base = reverse(f"admin:rmq_eventstore_dashboard_{name}")
    return base + ("?" + "&".join(f"{k}={v}" for k, v in query.items()) if query else "")


@pytest.fixture(scope="module")
def dash_store(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EventStore]:
    with store_at(tmp_path_factory.mktemp("dash"), BROKER=FAST_STATS) as s:
        yield s


@pytest.fixture(scope="module")
def events(dash_store: EventStore) -> list[Any]:
    """12 order events in two queues' worth of keys, 2 audit events, and a group 'billing' behind."""
    out = [OrderEvent.objects.append({"n": i, "sku": f"s-{i % 4}"}, keys=[f"o-{i}"], tags="Placed")
           for i in range(12)]
    out += [AuditEvent.objects.append({"who": "x"}, keys="a-1")]
    out += [AuditEvent.objects.append({"who": "y"}, keys="a-2")]
    c = PullConsumer(dash_store.namesrv, "billing").start()
    try:
        for q in dash_store.queue_ids("orders"):
            c.commit_offset("orders", q, 1)
    finally:
        c.shutdown()
    return out


def running_store(store: EventStore) -> Any:
    """The embedded broker's MessageStore (the ground truth the pages are checked against)."""
    return _embedded[store.settings.path].store


@pytest.fixture
def staff(db: Any) -> Client:
    user = get_user_model().objects.create_user("staffer", password="pw-staffer", is_staff=True)
    c = Client()
    c.force_login(user)
    return c


# -- access ------------------------------------------------------------------------------------------------
def test_anonymous_and_non_staff_users_are_sent_to_the_login(db: Any, dash_store: EventStore) -> None:
    nobody = get_user_model().objects.create_user("nobody", password="pw-nobody")
    member = Client()
    member.force_login(nobody)
    for client in (Client(), member):
        for name in PAGES:
            r = client.get(url(name))
            assert r.status_code == 302, name
            assert r["Location"].startswith(reverse("admin:login")), name


def test_staff_see_the_link_on_the_admin_index_and_every_page(staff: Client, events: list[Any]) -> None:
    index = staff.get(reverse("admin:index")).content.decode()
    assert f'href="{url("changelist")}"' in index and "Dashboard" in index
    for name in PAGES:
        r = staff.get(url(name))
        assert r.status_code == 200, name
    page = staff.get(url("changelist")).content.decode()
    assert 'src="/static/rmq_eventstore/dashboard.js"' in page and "cdn" not in page.lower()
    assert "admin/css/base.css" in page  # the admin's look: base_site.html


def test_no_add_change_or_delete(admin_client: Client, dash_store: EventStore) -> None:
    r = admin_client.get(reverse("admin:app_list", kwargs={"app_label": "rmq_eventstore"}))
    assert r.status_code == 200 and b"Dashboard" in r.content
    assert b"/add/" not in r.content.split(b'id="content-main"')[1].split(b"</table>")[0]


# -- numbers ---------------------------------------------------------------------------------------------
def test_overview_shows_the_stores_health(staff: Client, events: list[Any], dash_store: EventStore) -> None:
    ms = running_store(dash_store)
    ms.wait_for_dispatch(5)
    page = staff.get(url("changelist")).content.decode()
    assert f'data-key="commitLogMaxOffset">{ms.get_max_phy_offset()}<' in page
    assert f'data-key="commitLogMinOffset">{ms.get_min_phy_offset()}<' in page
    assert 'data-key="dispatchBehindBytes">0<' in page
    assert "physicMsgTimestamp" in page and "diskSpaceWarningLevelRatio 90" in page
    assert ms.config.store_path_root_dir in page
    assert re.search(r'class="rmq-disk rmq-disk-(ok|warn|full)" data-percent="[0-9.]+"', page)


def test_topics_show_each_queue_as_stored(staff: Client, events: list[Any], dash_store: EventStore) -> None:
    ms = running_store(dash_store)
    page = staff.get(url("topics")).content.decode()
    for topic, expected in (("orders", 12), ("audit", 2)):
        block = page.split(f'<tbody data-topic="{topic}">')[1].split("</tbody>")[0]
        assert f'data-count="{expected}"' in block
        for q in ms.queue_ids(topic):
            assert f'data-max="{ms.get_max_offset_in_queue(topic, q)}"' in block.split(f'data-queue="{q}"')[1]
    assert "RMQ_SYS_TRANS_HALF_TOPIC" not in page and "TBW102" not in page
    assert "TBW102" in staff.get(url("topics", system="1")).content.decode()


def test_groups_show_the_lag_per_queue(staff: Client, events: list[Any], dash_store: EventStore) -> None:
    ms = running_store(dash_store)
    page = staff.get(url("groups")).content.decode()
    block = page.split('<tbody data-group="billing">')[1].split("</tbody>")[0]
    total = 0
    for q in range(4):
        high = ms.get_max_offset_in_queue("orders", q)
        lag = max(high - 1, 0) if q in ms.queue_ids("orders") else 0
        total += lag
        row = block.split(f'data-topic="orders" data-queue="{q}">')[1].split("</tr>")[0]
        assert f'data-lag="{lag}"' in row and f'<td class="num">{high}</td>' in row
    assert total == 12 - len(ms.queue_ids("orders"))
    assert f'<td class="num" data-lag="{total}">{total}</td>' in block
    assert "rmq_eventstore_django_reader" not in page  # the QuerySets' reader commits nothing: not a consumer


# -- lookup ------------------------------------------------------------------------------------------------
def test_lookup_by_key_message_id_and_offset(staff: Client, events: list[Any], dash_store: EventStore) -> None:
    e = events[5]
    by_key = staff.get(url("lookup", kind="key", topic="orders", q="o-5")).content.decode()
    assert "1 message found" in by_key and f'data-msg-id="{e.msg_id}"' in by_key
    assert "&quot;sku&quot;: &quot;s-1&quot;" in by_key  # decoded by the event model, the most specific one:
    assert "<th>event model</th><td>PlacedEvent</td>" in by_key  # its tag_set holds the message's tag
    for query in ({"topic": "orders"}, {}):  # the producer's msgId, with and without the topic
        page = staff.get(url("lookup", kind="msgid", q=e.msg_id, **query)).content.decode()
        assert "1 message found" in page and f"offset {e.queue_offset}" in page
    ms = running_store(dash_store)
    offset_msg_id = ms.look_message_by_offset(e.commit_log_offset).msg_id
    page = staff.get(url("lookup", kind="msgid", q=offset_msg_id)).content.decode()
    assert "1 message found" in page and f'data-msg-id="{e.msg_id}"' in page
    page = staff.get(url("lookup", kind="offset", q=str(e.commit_log_offset))).content.decode()
    assert "1 message found" in page and f"<td>{e.commit_log_offset}</td>" in page
    audit = staff.get(url("lookup", kind="key", topic="audit", q="a-2")).content.decode()
    assert "&quot;who&quot;: &quot;y&quot;" in audit and "AuditEvent" in audit


def test_lookup_explains_what_is_wrong(staff: Client, events: list[Any]) -> None:
    for query, message in (({"kind": "key", "q": "o-1"}, "needs the topic"),
                           ({"kind": "offset", "q": "abc"}, "not a commitlog offset"),
                           ({"kind": "msgid", "q": "zz-not-hex"}, "not a message id"),
                           ({"kind": "nope", "q": "x"}, "unknown lookup")):
        page = staff.get(url("lookup", **query)).content.decode()
        assert message in page, query
    none = staff.get(url("lookup", kind="key", topic="orders", q="no-such-key")).content.decode()
    assert "0 messages found" in none
    # an offsetMsgId naming another host is never contacted
    foreign = "0A0000010000270F0000000000000000"  # 10.0.0.1:9999, offset 0
    assert "0 messages found" in staff.get(url("lookup", kind="msgid", q=foreign)).content.decode()


# -- charts ----------------------------------------------------------------------------------------------
def test_chart_data_comes_from_the_brokers_history(staff: Client, events: list[Any]) -> None:
    deadline = time.monotonic() + 10
    while True:
        doc = staff.get(url("chart_data")).json()
        b = doc["brokers"][0]
        if b["samples"] >= 3 and "billing" in b["lag"] or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert b["broker"] == "broker-a" and b["intervalMillis"] == 200
    assert len(b["throughput"]) == b["samples"] - 1 and all(v >= 0 for _, v in b["throughput"])
    assert b["lag"]["billing"][-1][1] == 12 - len(running_store(stores["default"]).queue_ids("orders"))
    assert all(len(p) == 2 for p in b["dispatchBehind"])
    page = staff.get(url("charts")).content.decode()
    assert f'data-url="{url("chart_data")}?alias=default"' in page and 'id="rmq-chart-throughput"' in page


# -- aliases ---------------------------------------------------------------------------------------------
def test_every_page_takes_an_alias(staff: Client, tmp_path: Path) -> None:
    conf = {alias: {"URL": f"file://{tmp_path / alias}", "OPTIONS": {
        "MODE": "embedded", "PRODUCER_GROUP": "django_tests", "BROKER": dict(FAST_STATS)}}
        for alias in ("default", "other")}
    with override_settings(RMQ_EVENTSTORE=conf):
        try:
            stores["other"].producer.send(Message("only_other", b"{}", keys=["k"]))
            for name in PAGES:
                assert staff.get(url(name, alias="other")).status_code == 200, name
            other = staff.get(url("topics", alias="other")).content.decode()
            default = staff.get(url("topics")).content.decode()
            assert 'data-topic="only_other"' in other and 'data-topic="only_other"' not in default
            assert '<option value="other" selected>' in other
            assert "?alias=other" in other  # the tabs keep the alias
            assert staff.get(url("topics", alias="missing")).status_code == 404
        finally:
            stores.close_all()
            stores.reset()
            close_embedded_brokers()


# -- a real browser --------------------------------------------------------------------------------------
def _cannot_run(reason: str) -> None:
    """Skip when the browser test cannot run here, but fail under CI (CI=true), where it must run."""
    if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
        pytest.fail(f"CI is set and the browser test cannot run: {reason}")
    pytest.skip(reason)


def _chromium() -> tuple[str, str]:
    """(chromium, chromedriver) of Debian's packages."""
    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    driver = shutil.which("chromedriver") or ("/usr/bin/chromedriver" if os.path.exists("/usr/bin/chromedriver")
                                              else None)
    if not (browser and driver):
        _cannot_run("Debian's chromium and chromium-driver are not installed (`make chromium`, or "
                    "`apt-get install -y chromium chromium-driver`)")
    try:
        import selenium  # noqa: F401
    except ImportError:
        _cannot_run("selenium is not installed (pip install -e '.[dev]')")
    return str(browser), str(driver)


@pytest.fixture
def browser() -> Iterator[Any]:
    chromium, chromedriver = _chromium()
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
                "--window-size=1280,1000", "--no-proxy-server"):
        options.add_argument(arg)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(chromedriver), options=options)
    driver.set_page_load_timeout(30)
    try:
        yield driver
    finally:
        driver.quit()


def _console_errors(driver: Any) -> list[str]:
    # the browser asks for /favicon.ico on its own; the admin has none, which is not the page's error
    return [e["message"] for e in driver.get_log("browser")
            if e["level"] == "SEVERE" and "favicon.ico" not in e["message"]]


def test_in_a_real_browser(browser: Any, live_server: Any, transactional_db: Any, events: list[Any]) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as ec
    from selenium.webdriver.support.ui import Select, WebDriverWait

    get_user_model().objects.create_user("browser", password="pw-browser-1", is_staff=True)
    wait = WebDriverWait(browser, 20)
    browser.get(live_server.url + reverse("admin:login"))
    browser.find_element(By.NAME, "username").send_keys("browser")
    browser.find_element(By.NAME, "password").send_keys("pw-browser-1")
    browser.find_element(By.CSS_SELECTOR, "input[type=submit]").click()
    wait.until(ec.presence_of_element_located((By.ID, "site-name")))
    # the admin index links to the dashboard
    browser.find_element(By.LINK_TEXT, "Dashboard").click()
    wait.until(ec.presence_of_element_located((By.CSS_SELECTOR, ".rmq-broker")))
    assert "Broker broker-a" in browser.page_source
    fill = browser.find_element(By.CSS_SELECTOR, ".rmq-disk-fill")
    assert fill.value_of_css_property("width") != "0px"  # the script ran and sized the disk bar
    assert _console_errors(browser) == []
    # topics and groups render
    browser.find_element(By.LINK_TEXT, "Topics").click()
    wait.until(ec.presence_of_element_located((By.CSS_SELECTOR, 'tbody[data-topic="orders"]')))
    assert browser.find_element(By.CSS_SELECTOR, 'tbody[data-topic="orders"] [data-count]').text == "12"
    browser.find_element(By.LINK_TEXT, "Consumer groups").click()
    wait.until(ec.presence_of_element_located((By.CSS_SELECTOR, 'tbody[data-group="billing"]')))
    # a lookup finds a message
    browser.find_element(By.LINK_TEXT, "Lookup").click()
    wait.until(ec.presence_of_element_located((By.ID, "rmq-lookup")))
    Select(browser.find_element(By.ID, "rmq-kind")).select_by_value("key")
    Select(browser.find_element(By.ID, "rmq-topic")).select_by_value("orders")
    browser.find_element(By.ID, "rmq-q").send_keys("o-7")
    browser.find_element(By.ID, "rmq-search").click()
    found = wait.until(ec.presence_of_element_located((By.ID, "rmq-found")))
    assert found.text == "1 message found"
    data = browser.find_element(By.CSS_SELECTOR, ".rmq-message .rmq-data").text
    assert '"n": 7' in data and '"sku": "s-3"' in data
    assert browser.find_element(By.CSS_SELECTOR, ".rmq-message").get_attribute("data-msg-id") == events[7].msg_id
    assert _console_errors(browser) == []
    # the charts draw with data from the broker's history
    browser.find_element(By.LINK_TEXT, "Charts").click()
    wait.until(lambda d: d.find_element(By.ID, "rmq-charts").get_attribute("data-loaded") == "1"
               and int(d.find_element(By.ID, "rmq-chart-lag").get_attribute("data-drawn") or 0) >= 1
               and int(d.find_element(By.CSS_SELECTOR, "#rmq-chart-throughput path.rmq-line")
                       .get_attribute("data-points")) >= 2)
    for chart in ("rmq-chart-throughput", "rmq-chart-lag", "rmq-chart-dispatch"):
        path = browser.find_element(By.CSS_SELECTOR, f"#{chart} svg path.rmq-line")
        d = path.get_attribute("d")
        assert d.startswith("M") and d.count("L") >= 1, chart
        assert path.size["width"] > 0, chart
    lag_series = [p.get_attribute("data-series") for p in
                  browser.find_elements(By.CSS_SELECTOR, "#rmq-chart-lag path.rmq-line")]
    assert "billing" in lag_series
    assert "billing" in browser.find_element(By.CSS_SELECTOR, "#rmq-chart-lag .rmq-legend").text
    assert _console_errors(browser) == []
