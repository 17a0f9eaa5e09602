"""Create the first admin user with a generated password (never a fixed one)."""

from __future__ import annotations

import os
import secrets
from typing import Any

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandParser


class Command(BaseCommand):
    help = "Create the admin user with a generated password if it does not exist, and say how to log in."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--username", default="admin")
        parser.add_argument("--reset", action="store_true", help="generate a new password for an existing user")

    def handle(self, *args: Any, **options: Any) -> None:
        username = options["username"]
        password_file = settings.VAR_DIR / "admin-password"
        User = get_user_model()
        user = User.objects.filter(username=username).first()
        if user is not None and not options["reset"]:
            where = f"the password in {password_file}" if password_file.exists() else "your password"
            self.stdout.write(f"log in as {username!r} with {where}")
            if password_file.exists():
                self.stdout.write(f"password: {password_file.read_text().strip()}")
            return
        password = secrets.token_urlsafe(12)
        if user is None:
            User.objects.create_superuser(username=username, email="", password=password)
        else:
            user.set_password(password)
            user.save(update_fields=["password"])
        # Kept only for the laptop setup, readable by this user alone.
        fd = os.open(password_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as handle:
            handle.write(password + "\n")
        self.stdout.write(f"log in as {username!r} with password: {password}")
