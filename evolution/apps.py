from __future__ import annotations

from django.apps import AppConfig


class EvolutionConfig(AppConfig):
    name = "evolution"
    verbose_name = "Evolution"

    def ready(self) -> None:
        # Every process that runs django.setup() (the web server, Celery workers, management commands, tests)
        # registers the operators here, once: the bundled ones and settings.RSI_OPERATOR_MODULES.
        from evolution import operators

        operators.operators_load()
