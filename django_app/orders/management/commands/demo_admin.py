"""`manage.py demo_admin`: a local admin account for the reference project (DEBUG only, never twice)."""

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError


class Command(BaseCommand):
    help = "Create the user admin/admin for local use when DEBUG is on and no user exists yet."

    def handle(self, *args, **options) -> None:
        if not settings.DEBUG:
            raise CommandError("demo_admin runs only with DEBUG on (it creates a well-known password)")
        User = get_user_model()
        if User.objects.exists():
            self.stdout.write("users exist already; nothing created")
            return
        User.objects.create_superuser("admin", "admin@localhost", "admin")
        self.stdout.write(self.style.SUCCESS("created the superuser admin / admin (local use only)"))
