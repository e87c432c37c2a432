from django.apps import AppConfig


class OutboxConfig(AppConfig):
    name = "benchmarks.bench_django_outbox"
    label = "bench_django_outbox"
