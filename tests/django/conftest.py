"""pytest-django for the tests of the Django face, without a pytest.ini: the settings module is named
here (pytest-django is loaded as an installed plugin, or with ``-p pytest_django``).

Run them with ``python -m pytest tests/django``. Setting ``DJANGO_SETTINGS_MODULE`` when this conftest is
collected configures Django for the rest of the session too; the other tests never touch it.
"""

from __future__ import annotations

import importlib.util
import os
import sys
import types

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.django.settings")

import django  # noqa: E402

django.setup()

if importlib.util.find_spec("rmq_eventstore.django.connection") is None:  # pragma: no cover
    # `signals` drops cached store connections from `rmq_eventstore.django.connection` when the
    # `settings` fixture changes RMQ_EVENTSTORE; where that module is not written yet, a stand-in with
    # nothing cached keeps the receiver working. (It disappears by itself once the module exists.)
    _stub = types.ModuleType("rmq_eventstore.django.connection")

    class _NoStores:
        def close_all(self) -> None:
            pass

        def reset(self) -> None:
            pass

    _stub.stores = _NoStores()  # type: ignore[attr-defined]
    sys.modules["rmq_eventstore.django.connection"] = _stub
