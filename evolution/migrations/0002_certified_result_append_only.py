"""Reject UPDATE and DELETE on certified results in the database itself.

PostgreSQL gets a trigger against both. SQLite gets the UPDATE trigger only:
Django flushes SQLite tables with DELETE (PostgreSQL with TRUNCATE, which
row triggers do not see), so a DELETE trigger would break test isolation;
the model refuses deletes and verify_records detects a missing record.
Someone with DDL rights can drop any trigger: verify_records is the check
that does not depend on the database's honesty.
"""

from __future__ import annotations

from django.db import migrations

POSTGRES_UP = """
CREATE OR REPLACE FUNCTION evolution_certifiedresult_append_only() RETURNS trigger AS $$
BEGIN
    RAISE EXCEPTION USING MESSAGE = 'certified results are append-only (' || TG_OP || ' refused)';
END;
$$ LANGUAGE plpgsql;
CREATE TRIGGER evolution_certifiedresult_no_update_delete
    BEFORE UPDATE OR DELETE ON evolution_certifiedresult
    FOR EACH ROW EXECUTE FUNCTION evolution_certifiedresult_append_only();
"""
POSTGRES_DOWN = """
DROP TRIGGER IF EXISTS evolution_certifiedresult_no_update_delete ON evolution_certifiedresult;
DROP FUNCTION IF EXISTS evolution_certifiedresult_append_only();
"""
SQLITE_UP = [
    """CREATE TRIGGER evolution_certifiedresult_no_update BEFORE UPDATE ON evolution_certifiedresult
       BEGIN SELECT RAISE(ABORT, 'certified results are append-only (UPDATE refused)'); END;""",
]
SQLITE_DOWN = [
    "DROP TRIGGER IF EXISTS evolution_certifiedresult_no_update;",
]


def forwards(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(POSTGRES_UP)
    elif schema_editor.connection.vendor == "sqlite":
        for statement in SQLITE_UP:
            schema_editor.execute(statement)


def backwards(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(POSTGRES_DOWN)
    elif schema_editor.connection.vendor == "sqlite":
        for statement in SQLITE_DOWN:
            schema_editor.execute(statement)


class Migration(migrations.Migration):
    dependencies = [("evolution", "0001_initial")]

    operations = [migrations.RunPython(forwards, backwards)]
