"""State of the review application itself (never evidence of the evolution)."""

from __future__ import annotations

from typing import ClassVar

from django.conf import settings
from django.db import models


class ViewedFile(models.Model):
    """A reviewer marked one file of a diff as viewed.

    Keyed by the content on both sides, like a code-review tool: when either
    side of the file changes, the digests differ and the mark no longer
    applies, so a changed file shows as not viewed again.
    """

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="+", db_index=False)
    path = models.CharField(max_length=1024)
    old_digest = models.CharField(max_length=64, blank=True)  # blank: the file is new
    new_digest = models.CharField(max_length=64, blank=True)  # blank: the file was deleted
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints: ClassVar = [
            models.UniqueConstraint(fields=["user", "path", "old_digest", "new_digest"], name="viewed_file_unique"),
        ]

    def __str__(self) -> str:
        return f"{self.user} viewed {self.path}"


class LoginFailure(models.Model):
    """One failed login, counted against an account and against a client address.

    Recorded before the password is checked and deleted again if the login
    succeeds (review.throttle.login_attempt_reserve), so a row may also be an
    attempt whose password is being checked right now.

    In the database rather than a per-process cache so that every web process
    (and every web machine) sees the same count: a throttle that each of
    eight processes keeps on its own lets eight times as many guesses through.
    Rows older than the window are deleted as they are counted.
    """

    class Scope(models.TextChoices):
        USERNAME = "username"
        ADDRESS = "address"

    scope = models.CharField(max_length=16, choices=Scope.choices)
    # The account the posted name resolves to (review.throttle.account_key) or the client address.
    key = models.CharField(max_length=255)
    failed_at = models.DateTimeField()

    class Meta:
        indexes: ClassVar = [models.Index(fields=["scope", "key", "failed_at"], name="login_failure_lookup")]

    def __str__(self) -> str:
        return f"failed login ({self.scope} {self.key}) at {self.failed_at}"
