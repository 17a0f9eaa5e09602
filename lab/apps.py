from __future__ import annotations

from django.apps import AppConfig


class LabConfig(AppConfig):
    # No models: installed for its management commands (trust_suite, bench).
    name = "lab"
    verbose_name = "Lab"
