"""MODE "shared" (the default for file:// URLs): every process of the app uses the one broker process that
owns the store, found or started on first use, and follows it when it is replaced."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest
from django.test import override_settings

from rmq_eventstore.client.local import find_local_broker, stop_local_broker
from rmq_eventstore.django.connection import stores
from tests.django_face.testapp.models import OrderEvent

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
READER = textwrap.dedent("""
    import json, django
    django.setup()
    from rmq_eventstore.django.connection import stores
    from tests.django_face.testapp.models import OrderEvent
    e = OrderEvent.objects.append({"from": "child"}, keys="child")
    print(json.dumps({"namesrv": stores["default"].namesrv, "keys": sorted(x.keys for x in OrderEvent.objects.all())}))
""")


@pytest.fixture
def shared_store(tmp_path):
    path = tmp_path / "store"
    conf = {"default": {"URL": f"file://{path}", "OPTIONS": {"PRODUCER_GROUP": "shared_tests",
                                                            "BROKER": {"mapped_file_size_commit_log": 4 << 20}}}}
    with override_settings(RMQ_EVENTSTORE=conf):
        try:
            yield path
        finally:
            stores.close_all()
            stop_local_broker(path)


def test_processes_share_one_broker_and_follow_a_new_one(shared_store):
    OrderEvent.objects.append({"from": "parent"}, keys="parent")
    owner = find_local_broker(shared_store)
    assert owner is not None and owner.pid != os.getpid()
    env = dict(os.environ, DJANGO_SETTINGS_MODULE="tests.django_face.settings", PYTHONPATH=ROOT,
               RMQ_TEST_STORE_URL=f"file://{shared_store}")
    # the child's settings give the same URL; MODE defaults to embedded in the test settings, so override
    child = READER.replace("django.setup()", "django.setup()\n"
                           "from django.conf import settings\n"
                           "settings.RMQ_EVENTSTORE['default']['OPTIONS']['MODE'] = 'shared'")
    out = subprocess.run([sys.executable, "-c", child], cwd=ROOT, env=env, capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stderr
    seen = json.loads(out.stdout.strip().splitlines()[-1])
    assert seen["namesrv"] == owner.namesrv_addr and seen["keys"] == ["child", "parent"]
    assert find_local_broker(shared_store).pid == owner.pid  # nobody started a second broker
    os.kill(owner.pid, signal.SIGKILL)
    time.sleep(1.1)
    OrderEvent.objects.append({"after": "kill"}, keys="after")  # finds that the broker is gone, starts one
    new = find_local_broker(shared_store)
    assert new is not None and new.pid != owner.pid
    assert sorted(x.keys for x in OrderEvent.objects.all()) == ["after", "child", "parent"]
