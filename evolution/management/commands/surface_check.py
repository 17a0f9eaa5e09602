"""Check a git diff against a surface and print the verdict as JSON.

Exit codes: 0 allowed, 1 not allowed, 2 unusable input (missing or
unreadable file, bad surface YAML, bad diff, unknown experiment).
"""

from __future__ import annotations

import json
import sys
import uuid
from argparse import ArgumentParser
from pathlib import Path
from typing import Any

from django.core.management.base import BaseCommand, CommandError
from django.db import DatabaseError

from evolution import limits
from evolution.gitdiff import DiffParseError
from evolution.models import Experiment
from evolution.selectors import split_concentration_warnings
from evolution.surfaces import DEFAULT_RESERVED, SurfaceSpec, SurfaceSpecError, check_diff, parse_surface

UNUSABLE = 2


class Command(BaseCommand):
    help = "Check a git diff against a surface; prints JSON, exits 0 allowed, 1 not allowed, 2 unusable input."

    def add_arguments(self, parser: ArgumentParser) -> None:
        source = parser.add_mutually_exclusive_group(required=True)
        source.add_argument("--experiment", help="experiment id (or uid) whose surface to use")
        source.add_argument("--surface", help="surface YAML file")
        parser.add_argument("--diff", required=True, help="file holding `git diff` output, or - for stdin")
        parser.add_argument(
            "--reserved",
            action="append",
            default=[],
            metavar="PREFIX",
            help="extra reserved path prefix, outside every surface (repeatable)",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        spec = self._load_spec(options["experiment"], options["surface"])
        if options["experiment"] is not None:
            # Advice, not a violation: a split that holds every task of some kind hides that capability.
            for line in split_concentration_warnings(experiment_id=_experiment_id(options["experiment"])):
                self.stderr.write(f"warning: {line}")
        diff_text = self._read_diff(options["diff"])
        try:
            verdict = check_diff(spec, diff_text, reserved=(*DEFAULT_RESERVED, *options["reserved"]))
        except DiffParseError as exc:
            raise CommandError(f"diff is not usable: {exc}", returncode=UNUSABLE) from exc
        # ASCII-escaped so that odd path bytes never break the output stream.
        self.stdout.write(json.dumps(verdict.to_json(), indent=2))
        if not verdict.allowed:
            raise CommandError(f"{len(verdict.violations)} surface violation(s)", returncode=1)

    def _load_spec(self, experiment: str | None, surface_file: str | None) -> SurfaceSpec:
        if surface_file is not None:
            try:
                data = limits.read_bytes(Path(surface_file), setting="RSI_MAX_SURFACE_BYTES", what="surface")
                text = data.decode("utf-8")
            except limits.InputLimitError as exc:
                raise CommandError(f"surface file {surface_file} is refused: {exc}", returncode=UNUSABLE) from exc
            except (OSError, UnicodeDecodeError) as exc:
                raise CommandError(f"cannot read surface file {surface_file}: {exc}", returncode=UNUSABLE) from exc
            origin = surface_file
        else:
            assert experiment is not None  # argparse requires one of the two
            text = _experiment_surface_text(experiment)
            origin = f"experiment {experiment}"
        try:
            return parse_surface(text)
        except SurfaceSpecError as exc:
            raise CommandError(f"surface of {origin} is not valid: {exc}", returncode=UNUSABLE) from exc

    def _read_diff(self, name: str) -> str:
        try:
            data = sys.stdin.buffer.read() if name == "-" else Path(name).read_bytes()
        except OSError as exc:
            raise CommandError(f"cannot read diff {name}: {exc}", returncode=UNUSABLE) from exc
        # git writes paths as raw bytes; keep invalid UTF-8 visible to the
        # path checks instead of failing or replacing it.
        return data.decode("utf-8", errors="surrogateescape")


def _experiment_id(experiment: str) -> int:
    if experiment.isdigit():
        return int(experiment)
    return int(Experiment.objects.values_list("pk", flat=True).get(uid=uuid.UUID(experiment)))


def _experiment_surface_text(experiment: str) -> str:
    """Surface YAML of an experiment looked up by numeric id or uid."""
    lookup: dict[str, Any]
    if experiment.isdigit():
        lookup = {"pk": int(experiment)}
    else:
        try:
            lookup = {"uid": uuid.UUID(experiment)}
        except ValueError:
            raise CommandError(f"experiment {experiment!r} is not an id or uid", returncode=UNUSABLE) from None
    try:
        return Experiment.objects.select_related("surface").get(**lookup).surface.spec
    except Experiment.DoesNotExist:
        raise CommandError(f"experiment {experiment} does not exist", returncode=UNUSABLE) from None
    except DatabaseError as exc:
        raise CommandError(f"cannot load experiment {experiment}: {exc}", returncode=UNUSABLE) from exc
