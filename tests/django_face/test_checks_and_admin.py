"""System checks, settings handling and the read-only admin."""

from __future__ import annotations

import socket
import warnings

import pytest
from django.core.checks import run_checks
from django.core.exceptions import ImproperlyConfigured
from django.test import override_settings

from rmq_eventstore.django.conf import store_settings
from rmq_eventstore.django.connection import stores
from tests.django_face.testapp.models import OrderEvent


def ids(**kwargs):
    return sorted(m.id for m in run_checks(tags=["rmq_eventstore"], **kwargs) if m.id.startswith("rmq_eventstore"))


def test_good_settings_pass():
    assert ids() == []


@pytest.mark.parametrize("conf, needle", [
    ({}, "is not set"),
    ({"default": "file:///x"}, "must be a dict"),
    ({"default": {}}, "has no 'URL'"),
    ({"default": {"URL": "file://relative/path"}}, "names a host"),
    ({"default": {"URL": "http://x:9876"}}, "scheme 'http'"),
    ({"default": {"URL": "rmq://:9876"}}, "names no host"),
    ({"default": {"URL": "file:///tmp/x", "OPTIONS": {"MODE": "turbo"}}}, "['MODE'] is 'turbo'"),
    ({"default": {"URL": "file:///tmp/x", "OPTIONS": {"MODEL": "shared"}}}, "unknown option 'MODEL'"),
    ({"default": {"URL": "file:///tmp/x", "OPTIONS": {"SEND_TIMEOUT_MS": "3"}}}, "wrong type"),
    ({"default": {"URL": "file:///tmp/x", "LOCATION": "/y"}}, "unknown keys ['LOCATION']"),
])
def test_malformed_settings_are_E001(conf, needle):
    with override_settings(RMQ_EVENTSTORE=conf):
        msgs = [m for m in run_checks(tags=["rmq_eventstore"]) if m.id == "rmq_eventstore.E001"]
        assert msgs and needle in " ".join(m.msg for m in msgs), [m.msg for m in msgs]
        if conf:
            with pytest.raises(ImproperlyConfigured):
                store_settings("default")


def test_unwritable_store_path_is_E002(tmp_path):
    target = tmp_path / "file"
    target.write_text("not a directory")
    with override_settings(RMQ_EVENTSTORE={"default": {"URL": f"file://{target}/store"}}):
        assert "rmq_eventstore.E002" in ids()


def test_unreachable_broker_is_W001():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()  # nothing listens there now
    with override_settings(RMQ_EVENTSTORE={"default": {"URL": f"rmq://127.0.0.1:{port}"}}):
        assert ids() == ["rmq_eventstore.W001"]


def test_sqlite_with_deferred_transactions_is_W002(settings):
    """The check reads DATABASES only (it opens nothing), so a second, SQLite alias is added to whichever
    database the suite runs on: DEFERRED (Django's default) warns, IMMEDIATE does not; the suite's own does not."""
    def w002(options):
        dbs = {**settings.DATABASES, "events_sqlite": {"ENGINE": "django.db.backends.sqlite3", "NAME": ":memory:",
                                                       "OPTIONS": options}}
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", "Overriding setting DATABASES")  # only read by the check here
            with override_settings(DATABASES=dbs):
                return [m for m in run_checks(tags=["rmq_eventstore"]) if m.id == "rmq_eventstore.W002"]

    msgs = w002({"timeout": 20})
    assert len(msgs) == 1 and "'events_sqlite'" in msgs[0].msg and "IMMEDIATE" in msgs[0].hint
    assert w002({"timeout": 20, "transaction_mode": "IMMEDIATE"}) == []


def test_event_model_checks(monkeypatch):
    monkeypatch.setattr(OrderEvent, "topic", "bad topic/..")
    monkeypatch.setattr(OrderEvent, "store_alias", "elsewhere")
    monkeypatch.setattr(OrderEvent, "codec", "no.such.Codec")
    assert ids() == ["rmq_eventstore.E003", "rmq_eventstore.E004", "rmq_eventstore.E005"]


def test_unknown_alias_is_clear():
    with pytest.raises(ImproperlyConfigured, match="no store alias 'other'"):
        stores["other"]


def test_nothing_is_opened_before_use(tmp_path):
    store = tmp_path / "lazy"
    with override_settings(RMQ_EVENTSTORE={"default": {"URL": f"file://{store}", "OPTIONS": {"MODE": "embedded"}}}):
        qs = OrderEvent.objects.filter(keys="x")  # building a QuerySet reaches nothing
        assert not store.exists()
        del qs


@pytest.fixture
def admin_events(event_store):
    out = [OrderEvent.objects.append({"n": i}, keys=f"k-{i}", tags=("Placed", "Paid")[i % 2],
                                     stream=f"s-{i % 3}") for i in range(60)]
    return out


@pytest.mark.django_db(transaction=True)  # appends inside TestCase's transaction would stay half messages
def test_admin_changelist_filters_search_and_pages(admin_client, admin_events, django_assert_num_queries):
    r = admin_client.get("/admin/testapp/orderevent/")
    assert r.status_code == 200
    page = r.content.decode()
    assert "60 order events" in page and "Add order event" not in page
    assert admin_events[-1].msg_id in page and admin_events[0].msg_id not in page  # newest first, 50 a page
    r = admin_client.get("/admin/testapp/orderevent/?p=2")
    assert admin_events[0].msg_id in r.content.decode()
    r = admin_client.get("/admin/testapp/orderevent/?q=k-7")
    assert r.status_code == 200 and "1 order event" in r.content.decode()
    r = admin_client.get(f"/admin/testapp/orderevent/?q={admin_events[3].msg_id}")
    assert admin_events[3].msg_id in r.content.decode()
    r = admin_client.get("/admin/testapp/orderevent/?q=s-1")
    assert "20 order events" in r.content.decode()
    q = admin_events[0].queue_id
    r = admin_client.get(f"/admin/testapp/orderevent/?queue_id={q}")
    in_q = len([e for e in admin_events if e.queue_id == q])
    assert r.status_code == 200 and f"{in_q} order event" in r.content.decode()
    r = admin_client.get("/admin/testapp/orderevent/?stored_at__gte=2000-01-01+00:00:00%2B00:00")
    assert r.status_code == 200
    r = admin_client.get("/admin/testapp/orderevent/?o=2")  # sort by the stored_at column
    assert r.status_code == 200


@pytest.mark.django_db(transaction=True)
def test_admin_detail_page_is_read_only(admin_client, admin_events):
    e = admin_events[5]
    r = admin_client.get(f"/admin/testapp/orderevent/{e.msg_id}/change/")
    page = r.content.decode()
    assert r.status_code == 200 and e.msg_id in page and "&quot;n&quot;: 5" in page
    assert 'name="_save"' not in page
    r = admin_client.get("/admin/testapp/orderevent/NOPE/change/")
    assert r.status_code == 302  # Django's "doesn't exist" redirect to the admin index
    r = admin_client.post(f"/admin/testapp/orderevent/{e.msg_id}/delete/")
    assert r.status_code == 403


@pytest.mark.django_db(transaction=True)
def test_admin_date_hierarchy_from_store_times(admin_client, admin_events, monkeypatch):
    from django.contrib import admin as django_admin

    model_admin = django_admin.site._registry[OrderEvent]
    monkeypatch.setattr(model_admin, "date_hierarchy", "stored_at")
    year = OrderEvent.objects.first().stored_at.year  # append results carry no store time
    r = admin_client.get("/admin/testapp/orderevent/")
    assert r.status_code == 200 and f"?stored_at__year={year}" in r.content.decode()
    r = admin_client.get(f"/admin/testapp/orderevent/?stored_at__year={year}")
    assert r.status_code == 200 and "60 order events" in r.content.decode()
