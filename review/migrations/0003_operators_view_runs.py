"""The operator and admin groups may see the admin's run list.

docs/review.md promises operators the admin's run actions (pause, resume,
cancel), but the groups lacked ``evolution.view_run``, so a staff operator
got 403 on the list the actions are on. ``evolution.access.roles_ensure`` (after
every migrate) now grants it too; this migration grants it to the groups an
existing database already has, within the upgrade itself, and takes it away
again when migrated back.
"""

from __future__ import annotations

from typing import Any

from django.db import migrations

GROUPS = ("operator", "admin")


def view_run_permission(apps: Any) -> Any:
    # On a fresh database permissions are only created after the migrations (post_migrate).
    content_type_model = apps.get_model("contenttypes", "ContentType")
    permission_model = apps.get_model("auth", "Permission")
    run_type, _created = content_type_model.objects.get_or_create(app_label="evolution", model="run")
    permission, _created = permission_model.objects.get_or_create(
        content_type=run_type, codename="view_run", defaults={"name": "Can view run"}
    )
    return permission


def grant(apps: Any, schema_editor: Any) -> None:
    permission = view_run_permission(apps)
    for group in apps.get_model("auth", "Group").objects.filter(name__in=GROUPS):
        group.permissions.add(permission)


def revoke(apps: Any, schema_editor: Any) -> None:
    permission = (
        apps.get_model("auth", "Permission")
        .objects.filter(content_type__app_label="evolution", codename="view_run")
        .first()
    )
    if permission is None:
        return
    for group in apps.get_model("auth", "Group").objects.filter(name__in=GROUPS):
        group.permissions.remove(permission)


class Migration(migrations.Migration):
    dependencies = [
        ("review", "0002_login_failure"),
        ("evolution", "0001_initial"),
        ("auth", "0012_alter_user_first_name_max_length"),
        ("contenttypes", "0002_remove_content_type_name"),
    ]

    operations = [migrations.RunPython(grant, revoke)]
