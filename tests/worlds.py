"""Worlds of the screen and API tests: rows built once, loaded into each test.

A world is built once per session (``world_dump``: the build runs in a
transaction that is rolled back after the evolution app's rows are dumped),
deserialized once (``world_rows``), and inserted again in bulk into each
test's database (``world_load``), which takes a fraction of the build.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from pathlib import Path
from typing import Any

from django.core import serializers
from django.core.management import call_command
from django.core.management.color import no_style
from django.db import connection, transaction
from django.db.models import Model

WorldRows = list[tuple[type[Model], list[Model]]]


def world_dump(build: Callable[[], None], *, path: Path, django_db_blocker: Any) -> None:
    """Run ``build``, dump the evolution app's rows to ``path`` and roll the
    build back, so the session's database is left as it was."""
    with django_db_blocker.unblock(), transaction.atomic():
        build()
        # Labels come from a data migration and are in every test database already.
        call_command("dumpdata", "evolution", exclude=["evolution.AnnotationLabel"], output=str(path), verbosity=0)
        transaction.set_rollback(True)


def world_rows(path: Path) -> WorldRows:
    """The dump at ``path`` deserialized: runs of rows of one model, in dump order."""
    groups: WorldRows = []
    with path.open() as handle:
        for item in serializers.deserialize("json", handle):
            if item.m2m_data and any(item.m2m_data.values()):
                raise AssertionError(f"the world has many-to-many data the loader does not copy: {item}")
            model = type(item.object)
            if groups and groups[-1][0] is model:
                groups[-1][1].append(item.object)
            else:
                groups.append((model, [item.object]))
    return groups


def world_load(rows: WorldRows) -> None:
    """Insert ``rows`` (copies: the same rows serve every test) into the test's database.

    Inserted in bulk inside one transaction (foreign keys are checked at
    commit on both databases, so the dump order is enough), then the
    primary-key sequences are moved past the loaded rows.
    """
    with transaction.atomic():  # one transaction, also in transactional tests
        for model, objects in rows:
            model._default_manager.bulk_create(copy.copy(obj) for obj in objects)
    models = list(dict.fromkeys(model for model, _ in rows))
    statements = connection.ops.sequence_reset_sql(no_style(), models)
    if statements:
        with connection.cursor() as cursor:
            for statement in statements:
                cursor.execute(statement)
