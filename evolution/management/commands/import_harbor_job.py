"""Import a Harbor job folder (``harbor run`` output) as an external evaluation.

``import_job`` under the name it first had: it takes a terminal-bench run
folder or an Inspect AI log as well (evolution/services/job_imports.py).
Exit codes: 0 imported (or imported before), 1 not a valid job (the message
names the file), 2 refused: over an input limit (docs/security.md), a
symbolic link in the folder, or an experiment that job imports did not
make; nothing is written on error.
"""

from __future__ import annotations

from evolution.management.job_import_command import JobImportCommand


class Command(JobImportCommand):
    help = "Import a Harbor job folder (config.json, result.json, one folder per trial), or what import_job takes."
    path_help = "the job folder Harbor wrote (jobs/<job name>)"
    experiment_help = "experiment name (created when missing; default: the job's name)"
