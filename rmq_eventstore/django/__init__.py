"""The Django face: event models over the store with QuerySets, appends bound to `transaction.atomic()`,
system checks, management commands and a staff dashboard.

Add ``"rmq_eventstore.django"`` to ``INSTALLED_APPS`` and configure stores like ``DATABASES``::

    RMQ_EVENTSTORE = {"default": {"URL": "file:///srv/app/var/store"}}

Nothing is opened at import or in ``ready()``: a store is reached on first use (see ``conf``).
"""
