"""Store each certified record's payload as its RFC 8785 canonical text.

The column was JSON (``jsonb`` on PostgreSQL), which keeps neither the bytes
nor the key order that were hashed, so verifying a record meant reading the
JSON back as text and encoding it again. Now the column holds the exact
bytes the record digest is taken over.

The type change leaves each row in the database's own JSON text form;
``canonicalize`` then rewrites every row as its canonical text, with the
append-only trigger suspended (on SQLite the table is rebuilt by the type
change, which drops its trigger: it is created again). The digests, links and
signatures are unchanged: they were taken over these very bytes.
"""

from __future__ import annotations

import json

from django.db import migrations

from evolution import records
from evolution.fields import CanonicalJSONField

TABLE = "evolution_certifiedresult"
POSTGRES_TRIGGER = "evolution_certifiedresult_no_update_delete"
SQLITE_TRIGGER = "evolution_certifiedresult_no_update"
SQLITE_TRIGGER_SQL = f"""CREATE TRIGGER IF NOT EXISTS {SQLITE_TRIGGER} BEFORE UPDATE ON {TABLE}
       BEGIN SELECT RAISE(ABORT, 'certified results are append-only (UPDATE refused)'); END;"""
BATCH = 1000


def canonicalize(apps, schema_editor) -> None:
    """Rewrite every stored payload as its canonical text (``apps`` unused: the
    rows are read and written as plain text)."""
    vendor = schema_editor.connection.vendor
    with schema_editor.connection.cursor() as cursor:
        if vendor == "postgresql":
            # Deferred foreign-key checks first: ALTER TABLE refuses a table with pending trigger events.
            cursor.execute("SET CONSTRAINTS ALL IMMEDIATE")
            cursor.execute(f"ALTER TABLE {TABLE} DISABLE TRIGGER {POSTGRES_TRIGGER}")
        else:
            cursor.execute(f"DROP TRIGGER IF EXISTS {SQLITE_TRIGGER}")
        last = 0
        while True:
            cursor.execute(f"SELECT id, payload FROM {TABLE} WHERE id > %s ORDER BY id LIMIT %s", [last, BATCH])
            rows = cursor.fetchall()
            if not rows:
                break
            last = rows[-1][0]
            changed = []
            for pk, text in rows:
                try:
                    canonical = records.canonical_payload(json.loads(text)).decode()
                except ValueError:  # no certifier wrote this (a number RFC 8785 refuses): kept for verify to report
                    continue
                if canonical != text:
                    changed.append((canonical, pk))
            cursor.executemany(f"UPDATE {TABLE} SET payload = %s WHERE id = %s", changed)
        if vendor == "postgresql":
            cursor.execute(f"ALTER TABLE {TABLE} ENABLE TRIGGER {POSTGRES_TRIGGER}")
        else:
            cursor.execute(SQLITE_TRIGGER_SQL)


def restore_sqlite_trigger(apps, schema_editor) -> None:
    """Going back rebuilds the SQLite table again, which drops its trigger."""
    if schema_editor.connection.vendor == "sqlite":
        schema_editor.execute(SQLITE_TRIGGER_SQL)


class Migration(migrations.Migration):
    dependencies = [("evolution", "0008_ledger_run_round")]

    operations = [
        # Undone last, after the table was rebuilt back.
        migrations.RunPython(migrations.RunPython.noop, restore_sqlite_trigger),
        migrations.AlterField(model_name="certifiedresult", name="payload", field=CanonicalJSONField()),
        migrations.RunPython(canonicalize, migrations.RunPython.noop),
    ]
