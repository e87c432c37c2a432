"""The transactional outbox a Django user would write (django-outbox-pattern's shape): a row per event in the
caller's transaction, published on commit."""

from django.db import models


class Outbox(models.Model):
    topic = models.CharField(max_length=127)
    payload = models.JSONField()
    sent = models.BooleanField(default=False, db_index=True)
    created_at = models.DateTimeField(auto_now_add=True, db_index=True)

    class Meta:
        app_label = "bench_django_outbox"
