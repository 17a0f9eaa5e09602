"""Import the run of another tool as an external evaluation: a Harbor job
folder, a terminal-bench 1.x run folder (``tb run``) or an Inspect AI eval
log (``.eval`` or ``.json``); see evolution/services/job_imports.py.
``import_harbor_job`` is the same command under its first name.

Exit codes: 0 imported (or imported before), 1 not such a run, or one that
contradicts itself (the message names the file), 2 refused: over an input
limit (docs/security.md), a symbolic link, or an experiment that job imports
did not make; nothing is written on error.
"""

from __future__ import annotations

from evolution.management.job_import_command import JobImportCommand


class Command(JobImportCommand):
    help = (
        "Import a Harbor job folder, a terminal-bench 1.x run folder or an Inspect AI log (.eval, .json) as an "
        "external evaluation; safe to repeat."
    )
