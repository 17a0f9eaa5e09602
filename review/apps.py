from __future__ import annotations

from django.apps import AppConfig
from django.db.models.signals import post_migrate


class ReviewConfig(AppConfig):
    name = "review"
    verbose_name = "Review"

    def ready(self) -> None:
        from evolution.access import roles_ensure

        # After every migrate, once the permissions exist.
        post_migrate.connect(roles_ensure, sender=self, dispatch_uid="review.roles_ensure")
