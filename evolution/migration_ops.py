"""Migration operations of our own. Migrations import them: change them only
in ways that keep every existing migration's meaning."""

from __future__ import annotations

from typing import Any

from django.db import migrations


class DropForeignKeyIndex(migrations.AlterField):
    """``AlterField`` to ``db_index=False`` on a foreign key, done as a drop
    of the column's own index (and PostgreSQL's ``_like`` index beside it) only.

    For this change Django's own ``AlterField`` drops and adds the foreign key
    constraint again on PostgreSQL, which checks every row again under an
    exclusive lock, and copies the whole table on SQLite. Going back creates
    the index Django would have made.
    """

    def database_forwards(self, app_label: str, schema_editor: Any, from_state: Any, to_state: Any) -> None:
        model = from_state.apps.get_model(app_label, self.model_name)
        if not self.allow_migrate_model(schema_editor.connection.alias, model):
            return
        table = model._meta.db_table
        column = model._meta.get_field(self.name).column
        own = {schema_editor._create_index_name(table, [column], suffix=suffix) for suffix in ("", "_like")}
        with schema_editor.connection.cursor() as cursor:
            existing = schema_editor.connection.introspection.get_constraints(cursor, table)
        for name in sorted(own & existing.keys()):
            schema_editor.execute(schema_editor._delete_index_sql(model, name))

    def database_backwards(self, app_label: str, schema_editor: Any, from_state: Any, to_state: Any) -> None:
        model = to_state.apps.get_model(app_label, self.model_name)
        if not self.allow_migrate_model(schema_editor.connection.alias, model):
            return
        for statement in schema_editor._field_indexes_sql(model, model._meta.get_field(self.name)):
            schema_editor.execute(statement)

    def describe(self) -> str:
        return f"Drop the index of {self.model_name_lower}.{self.name} (covered by a composite index)"
