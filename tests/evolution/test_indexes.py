"""No index of ours that another index already serves, on the database under test.

Django gives every foreign key an index of its own. Where a composite index or
unique constraint of the same table starts with that column, the single-column
index serves no lookup the composite one does not, and every insert (and every
update of an indexed column: a trial's claim and finish change its ``state``)
writes it too. Migration 0018 dropped those; this keeps new ones from coming
back, and checks that going back through the migration restores them.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pytest
from django.apps import apps
from django.db import connection
from django.db.migrations.executor import MigrationExecutor

OUR_APPS = ("evolution", "review")


def covered(constraints: Mapping[str, Any]) -> list[tuple[str, str]]:
    """(index, the index that covers it) for every plain index whose columns lead another index of the table."""
    keyed = {
        name: tuple(info["columns"])
        for name, info in constraints.items()
        if (info["index"] or info["unique"] or info["primary_key"]) and info["columns"]
    }
    found = []
    for name, columns in sorted(keyed.items()):
        info = constraints[name]
        if info["unique"] or info["primary_key"] or info.get("type") not in (None, "btree", "idx"):
            continue
        for other, wider in sorted(keyed.items()):
            if other != name and len(wider) > len(columns) and wider[: len(columns)] == columns:
                found.append((name, other))
                break
    return found


def our_covered_indexes() -> list[tuple[str, str]]:
    found = []
    with connection.cursor() as cursor:
        for app in OUR_APPS:
            for model in apps.get_app_config(app).get_models():
                found += covered(connection.introspection.get_constraints(cursor, model._meta.db_table))
    return found


def test_the_rule_finds_a_covered_index_and_only_that() -> None:
    constraints = {
        "t_pkey": {"columns": ["id"], "primary_key": True, "unique": True, "index": False},
        "t_parent": {"columns": ["parent_id"], "primary_key": False, "unique": False, "index": True, "type": "btree"},
        "t_parent_name": {"columns": ["parent_id", "name"], "primary_key": False, "unique": True, "index": False},
        "t_name": {"columns": ["name"], "primary_key": False, "unique": False, "index": True, "type": "btree"},
        "t_parent_name_x": {
            "columns": ["parent_id", "name", "x"],
            "primary_key": False,
            "unique": False,
            "index": True,
        },
        "t_fk": {
            "columns": ["parent_id"],
            "primary_key": False,
            "unique": False,
            "index": False,
            "foreign_key": ("p", "id"),
        },
    }
    assert covered(constraints) == [("t_parent", "t_parent_name")]


@pytest.mark.django_db
def test_no_index_of_ours_is_covered_by_another() -> None:
    assert our_covered_indexes() == []


@pytest.mark.django_db(transaction=True)
def test_the_migration_drops_only_those_indexes_and_going_back_restores_them() -> None:
    executor = MigrationExecutor(connection)
    latest = [key for key in executor.loader.graph.leaf_nodes() if key[0] in OUR_APPS]
    try:
        executor.migrate([("review", "0003_operators_view_runs"), ("evolution", "0017_evaluator_agent_network")])
        before = our_covered_indexes()
        restored = {name for name, _ in before}
        assert "evolution_trial_evaluation_id_cc5cce1d" in restored
        assert "evolution_trajectorystep_trajectory_id_23dbb2d8" in restored
        assert "review_viewedfile_user_id_2d7c1463" in restored
        # 18 foreign keys, and on PostgreSQL the pattern index of the one that is text (a tree's digest).
        assert len(restored) == (19 if connection.vendor == "postgresql" else 18)
    finally:
        executor = MigrationExecutor(connection)
        executor.migrate(latest)
    assert our_covered_indexes() == []
    with connection.cursor() as cursor:
        trial = connection.introspection.get_constraints(cursor, "evolution_trial")
    foreign_keys = {info["columns"][0] for info in trial.values() if info["foreign_key"]}
    assert foreign_keys == {"evaluation_id", "candidate_id", "task_id"}
