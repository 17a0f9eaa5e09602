"""Task environments built here from Debian packages: a Harbor task's
``environment/Dockerfile`` read into a recipe, and the recipe built into a
root filesystem (no ORM).

There is no container daemon and no image registry on our machines, but
Debian's archive and PyPI answer. So a Dockerfile is not pulled: its base
maps to a Debian suite built with ``debootstrap --variant=minbase`` once a
machine, and its steps are replayed inside a copy of that root:

- ``FROM debian:<suite or version>[-slim][@digest]``: the suite (bookworm,
  trixie, bullseye; 11, 12, 13 and their point releases, which the archive
  no longer serves apart, so the suite's current packages are installed).
  Any other base (``ubuntu:*``, ``python:*``, another registry) is refused:
  its files are not Debian's packages, and a substitute would be a
  different environment under the same name.
  Its apt sources are those of Docker's official image of the suite
  (``official_apt_sources``: the suite, -updates and -security), so a
  version pinned from bookworm-updates installs as it does on the image.
- ``RUN`` (its ``--network=...`` flag dropped): run by ``/bin/sh -c`` inside
  the root, as root, with the network, ``PIP_BREAK_SYSTEM_PACKAGES=1``
  (Debian's pip refuses the system Python otherwise) and the host's CA
  bundle. Refused when it names a host other than Debian's archive or the
  Python and npm registries (the others do not answer here) or clones with
  git, or uses ``--mount``.
- ``COPY``/``ADD`` of files in the build context: baked into the root, but
  those copied into ``/app`` (Harbor's working directory, which trials map
  to the agent's workspace) become the task's workspace files instead.
  ``--from``, URLs and archives are refused.
- ``WORKDIR``, ``ENV``, ``ARG`` (their values substituted where Docker does),
  and what has no effect on files (``LABEL``, ``EXPOSE``, ``CMD``,
  ``ENTRYPOINT``, ``VOLUME``, ``STOPSIGNAL``, ``HEALTHCHECK``, ``USER root``).
  Anything else is refused, so a task never runs in something its
  Dockerfile did not describe.

A recipe's digest (``recipe_digest``) covers the base, every step and every
copied file's bytes; a built root lives under ``<environments dir>/<digest>``
and is reused by every task with the same recipe.
"""

from __future__ import annotations

import base64
import contextlib
import fcntl
import json
import os
import re
import shlex
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

from evolution import digests

RECIPE_KIND = "debian-environment/1"
VARIANT = "minbase"
MIRROR = "http://deb.debian.org/debian"
# The apt sources Docker's official ``debian:<suite>`` images carry (debuerreotype
# writes them: the suite, <suite>-updates and <suite>-security, component main;
# deb822 in /etc/apt/sources.list.d/debian.sources from bookworm on, a one-line
# sources.list before), written into every environment so ``apt-get install
# pkg=<version>`` finds the versions the image finds. debootstrap alone lists
# only the suite itself. A recipe names them by this value (part of its digest).
APT_SOURCES = "docker-official-image/1"
SECURITY_MIRROR = "http://deb.debian.org/debian-security"
# Docker's official Debian tags name a suite or a release number.
SUITES = {"bullseye": "bullseye", "bookworm": "bookworm", "trixie": "trixie", "11": "bullseye", "12": "bookworm"}
SUITES["13"] = "trixie"
# Where a step may fetch from: the hosts that answer from our machines.
ALLOWED_HOSTS = (
    "deb.debian.org",
    "security.debian.org",
    "pypi.org",
    "files.pythonhosted.org",
    "registry.npmjs.org",
    # The machine itself: a task's own server, started by the task.
    "localhost",
    "127.0.0.1",
)
# Harbor's working directory; the trial maps it to the agent's workspace.
APP_DIR = "/app"
# Instructions that change nothing in the file system.
IGNORED = {"LABEL", "EXPOSE", "CMD", "ENTRYPOINT", "VOLUME", "STOPSIGNAL", "HEALTHCHECK", "MAINTAINER"}
MAX_COPIED_BYTES = 16 << 20
BUILD_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
HOST_CA_BUNDLE = Path("/etc/ssl/certs/ca-certificates.crt")
# The machine's proxy settings: HTTPS to the registries goes through its proxy.
PROXY_VARIABLES = ("http_proxy", "https_proxy", "no_proxy", "HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY")

_FROM = re.compile(r"(?:(?:docker\.io/)?(?:library/)?)debian:(?P<tag>[A-Za-z0-9._-]+)(?:@sha256:[0-9a-f]{64})?")
_TAG = re.compile(r"(?P<name>bullseye|bookworm|trixie|\d+)(?:\.\d+)*(?:-\d{8})?(?:-slim)?")
_URL = re.compile(r"(?:https?|ftp|git|ssh)://([^/\s:'\"]+)", re.IGNORECASE)
_VAR = re.compile(
    r"\$(?:\{(?P<braced>[A-Za-z_][A-Za-z0-9_]*)(?::?-(?P<default>[^}]*))?\}|(?P<plain>[A-Za-z_][A-Za-z0-9_]*))"
)


class EnvironmentRefused(ValueError):
    """A Dockerfile this machine cannot rebuild from Debian; the message says why (one line)."""


class EnvironmentBuildError(RuntimeError):
    """Building a root filesystem failed; the message names the step and the output's tail."""


@dataclass
class Recipe:
    """What a Dockerfile builds: a Debian suite and the steps replayed in it.

    ``steps`` are ``{"run": cmd, "env": {...}, "workdir": dir}`` or
    ``{"copy": [{"path", "mode", "data" (base64)}]}``; ``workspace`` are the
    files copied into ``/app`` (the agent's starting workspace), by path
    relative to it.
    """

    suite: str
    steps: list[dict[str, Any]] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    workdir: str = "/"
    workspace: dict[str, bytes] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    def document(self) -> dict[str, Any]:
        """The recipe as JSON (what the digest covers, and what a build needs)."""
        return {
            "kind": RECIPE_KIND,
            "base": {"suite": self.suite, "variant": VARIANT, "mirror": MIRROR, "apt_sources": APT_SOURCES},
            "steps": self.steps,
            "env": self.env,
            "workdir": self.workdir,
        }

    @property
    def digest(self) -> str:
        return recipe_digest(self.document())


def recipe_digest(document: dict[str, Any]) -> str:
    return digests.json_digest(document)


# --- reading a Dockerfile -------------------------------------------------------


def instructions(text: str) -> list[tuple[int, str, str]]:
    """(line number, INSTRUCTION, arguments) of a Dockerfile: continuation
    lines joined, comments and blank lines dropped (also inside a
    continuation, as Docker does)."""
    found: list[tuple[int, str, str]] = []
    pending: list[str] = []
    start = 0
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not pending and (not line or line.startswith("#")):
            continue
        if pending and (not line or line.startswith("#")):
            continue
        if not pending:
            start = number
        if line.endswith("\\"):
            pending.append(line[:-1].rstrip())
            continue
        pending.append(line)
        joined = " ".join(part for part in pending if part)
        pending = []
        keyword, _, rest = joined.partition(" ")
        found.append((start, keyword.upper(), rest.strip()))
    if pending:
        joined = " ".join(part for part in pending if part)
        keyword, _, rest = joined.partition(" ")
        found.append((start, keyword.upper(), rest.strip()))
    return found


def expand(value: str, variables: dict[str, str]) -> str:
    """``$NAME``, ``${NAME}`` and ``${NAME:-default}`` replaced as Docker does
    in WORKDIR, ENV, COPY and ARG; unknown names become empty."""

    def replace(match: re.Match[str]) -> str:
        name = match.group("braced") or match.group("plain")
        default = match.group("default")
        return variables.get(name) or (default if default is not None else "")

    return _VAR.sub(replace, value)


def _flags(arguments: str) -> tuple[dict[str, str], str]:
    """Leading ``--name=value`` flags of an instruction, and the rest."""
    flags: dict[str, str] = {}
    rest = arguments
    while rest.startswith("--"):
        word, _, rest = rest.partition(" ")
        name, _, value = word[2:].partition("=")
        flags[name] = value
        rest = rest.lstrip()
    return flags, rest


def _words(arguments: str) -> list[str]:
    """An instruction's arguments in JSON (exec) form or shell words."""
    if arguments.startswith("["):
        try:
            value = json.loads(arguments)
        except json.JSONDecodeError as exc:
            raise EnvironmentRefused(f"cannot read {arguments[:60]!r}: {exc}") from None
        if isinstance(value, list) and all(isinstance(item, str) for item in value):
            return value
    try:
        return shlex.split(arguments)
    except ValueError as exc:
        raise EnvironmentRefused(f"cannot read {arguments[:60]!r}: {exc}") from None


def _pairs(arguments: str) -> list[tuple[str, str]]:
    """ENV/ARG arguments: ``K=V K2="V 2"`` or the old ``K V`` form."""
    words = _words(arguments)
    if words and "=" not in words[0]:
        return [(words[0], arguments.partition(" ")[2].strip())]
    return [(word.partition("=")[0], word.partition("=")[2]) for word in words]


def base_suite(image: str) -> tuple[str, list[str]]:
    """The Debian suite a ``FROM`` image maps to, and notes; EnvironmentRefused
    for an image that is not Debian's own."""
    match = _FROM.fullmatch(image)
    tag = _TAG.fullmatch(match.group("tag")) if match else None
    if match is None or tag is None or tag.group("name") not in SUITES:
        raise EnvironmentRefused(
            f"base image {image!r} cannot be built from Debian's packages "
            f"(only debian:<{'|'.join(sorted(set(SUITES.values())))}|11|12|13>[-slim])"
        )
    suite = SUITES[tag.group("name")]
    notes = []
    if match.group("tag") not in {tag.group("name"), f"{tag.group('name')}-slim"}:
        notes.append(f"{image}: built from Debian {suite}'s current packages, not that exact point release")
    return suite, notes


def _check_fetches(command: str, *, what: str = "RUN") -> None:
    """Refuse a step that would fetch from a host that does not answer here."""
    for host in _URL.findall(command):
        if host.lower() not in ALLOWED_HOSTS:
            raise EnvironmentRefused(f"{what} fetches from {host}, which this machine cannot reach: {command[:120]}")
    if re.search(r"\bgit\s+clone\b", command):
        raise EnvironmentRefused(f"{what} clones a git repository, which this machine cannot reach: {command[:120]}")
    if re.search(r"\badd-apt-repository\b|\bppa:", command):
        raise EnvironmentRefused(f"{what} adds a package source other than Debian's: {command[:120]}")


def check_test_scripts(tests: dict[str, str]) -> None:
    """Refuse tests whose shell scripts fetch from a host that does not answer
    here (Terminal-Bench 2's test.sh installs uv from astral.sh while grading):
    their verifier could never pass, so the task is not imported. Comment
    lines are not read; each other line is scanned as a RUN step is."""
    for name, text in sorted(tests.items()):
        if not name.endswith(".sh"):
            continue
        for number, line in enumerate(text.splitlines(), start=1):
            if line.lstrip().startswith("#"):
                continue
            _check_fetches(line.strip(), what=f"tests/{name} line {number}")


def _context_files(context: Path, source: str) -> list[tuple[str, Path]]:
    """(path relative to the match's root, file) for a COPY source in the build context."""
    relative = PurePosixPath(source.lstrip("/"))
    if ".." in relative.parts:
        raise EnvironmentRefused(f"COPY source {source!r} leaves the build context")
    root = context.resolve()
    matches = sorted(root.glob(str(relative))) if any(ch in source for ch in "*?[") else [root / relative]
    found: list[tuple[str, Path]] = []
    for match in matches:
        if match.is_symlink() or not match.exists():
            raise EnvironmentRefused(f"COPY source {source!r} is missing from the build context (or a link)")
        if match.is_dir():
            for path in sorted(match.rglob("*")):
                if path.is_symlink():
                    raise EnvironmentRefused(f"COPY source {path.relative_to(root)} is a symbolic link")
                if path.is_file():
                    found.append((path.relative_to(match).as_posix(), path))
        else:
            found.append((match.name, match))
    return found


def plan(dockerfile: str, *, context: Path) -> Recipe:
    """The recipe ``dockerfile`` describes, its COPY sources read from
    ``context`` (the ``environment/`` folder). EnvironmentRefused, naming the
    line, for anything this machine cannot rebuild from Debian."""
    recipe: Recipe | None = None
    variables: dict[str, str] = {}
    env: dict[str, str] = {}
    workdir = "/"
    workdirs = {workdir}
    copied = 0
    for line, keyword, arguments in instructions(dockerfile):
        where = f"Dockerfile line {line}"
        try:
            if keyword == "ARG":
                for name, value in _pairs(arguments):
                    variables.setdefault(name, expand(value, {**variables, **env}))
                continue
            if keyword == "FROM":
                if recipe is not None:
                    raise EnvironmentRefused("a second FROM (multi-stage builds cannot be replayed)")
                flags, image = _flags(arguments)
                image = expand(image.split()[0] if image else "", variables)
                suite, notes = base_suite(image)
                recipe = Recipe(suite=suite, notes=notes)
                continue
            if recipe is None:
                raise EnvironmentRefused(f"{keyword} before FROM")
            if keyword == "RUN":
                flags, command = _flags(arguments)
                if "mount" in flags:
                    raise EnvironmentRefused("RUN --mount cannot be replayed")
                if command.startswith("["):
                    command = shlex.join(_words(command))
                _check_fetches(command)
                recipe.steps.append({"run": command, "env": {**variables, **env}, "workdir": workdir})
            elif keyword in ("COPY", "ADD"):
                flags, rest = _flags(arguments)
                if "from" in flags:
                    raise EnvironmentRefused(f"{keyword} --from (another image) cannot be replayed")
                words = [expand(word, {**variables, **env}) for word in _words(rest)]
                if len(words) < 2:
                    raise EnvironmentRefused(f"{keyword} needs a source and a destination")
                *sources, dest = words
                if keyword == "ADD" and any(
                    _URL.match(s) or s.endswith((".tar", ".gz", ".tgz", ".xz")) for s in sources
                ):
                    raise EnvironmentRefused("ADD of a URL or an archive cannot be replayed")
                target = PurePosixPath(workdir) / dest
                # Into a folder: as Docker does for a trailing slash, several
                # sources, or a folder the Dockerfile made (its WORKDIRs, /app).
                into_dir = dest.endswith("/") or len(sources) > 1 or str(target) in {*workdirs, APP_DIR}
                entries: list[tuple[str, str, bytes]] = []
                for source in sources:
                    for relative, path in _context_files(context, source):
                        data = path.read_bytes()
                        copied += len(data)
                        if copied > MAX_COPIED_BYTES:
                            raise EnvironmentRefused(f"COPY sources hold more than {MAX_COPIED_BYTES} bytes")
                        single = not into_dir and not (context / source.lstrip("/")).is_dir()
                        placed = target if single and "*" not in source else target / relative
                        mode = "755" if os.access(path, os.X_OK) else "644"
                        entries.append((str(placed), mode, data))
                baked = []
                for where_to, mode, data in entries:
                    inside = PurePosixPath(where_to)
                    if inside == PurePosixPath(APP_DIR) or PurePosixPath(APP_DIR) in inside.parents:
                        recipe.workspace[inside.relative_to(APP_DIR).as_posix()] = data
                    else:
                        baked.append({"path": where_to, "mode": mode, "data": base64.b64encode(data).decode()})
                if baked:
                    recipe.steps.append({"copy": baked})
            elif keyword == "WORKDIR":
                workdir = str(PurePosixPath(workdir) / expand(arguments, {**variables, **env}))
                workdirs.add(workdir)
            elif keyword == "ENV":
                for name, value in _pairs(arguments):
                    env[name] = expand(value.strip('"'), {**variables, **env})
            elif keyword == "USER":
                if arguments.split(":")[0] not in ("root", "0"):
                    raise EnvironmentRefused(f"USER {arguments} (trials run as their own user; only root is replayed)")
            elif keyword in IGNORED:
                continue
            else:
                raise EnvironmentRefused(f"{keyword} cannot be replayed")
        except EnvironmentRefused as exc:
            raise EnvironmentRefused(f"{where}: {exc}") from None
    if recipe is None:
        raise EnvironmentRefused("Dockerfile has no FROM")
    recipe.env = env
    recipe.workdir = workdir
    return recipe


# --- building -------------------------------------------------------------------

Progress = Callable[[str], None]


def _quiet(message: str) -> None:
    return None


def builder() -> str:
    """The path of debootstrap; EnvironmentBuildError saying how to install it."""
    found = shutil.which("debootstrap") or next(
        (p for p in ("/usr/sbin/debootstrap", "/sbin/debootstrap") if os.access(p, os.X_OK)), None
    )
    if found is None:
        raise EnvironmentBuildError(
            "debootstrap is not installed: apt-get install -y debootstrap (a Debian package; .ci/run installs it)"
        )
    return found


BASE_KIND = "debian-base/1"
BASE_MARKER = ".rsi-base.json"
# What every minbase root holds; a copy missing one of them is not used.
BASE_ESSENTIALS = ("etc/debian_version", "bin/sh", "usr/bin/dpkg", "usr/bin/apt-get", "var/lib/dpkg/status")


def base_document(suite: str) -> dict[str, str]:
    """What a base is built from: its digest names its folder."""
    return {"kind": BASE_KIND, "suite": suite, "variant": VARIANT, "mirror": MIRROR}


def base_path(suite: str, *, bases: Path) -> Path:
    return bases / f"base-{suite}-{VARIANT}-{recipe_digest(base_document(suite))[:16]}"


def base_valid(path: Path, suite: str) -> bool:
    """True when ``path`` is a finished base of ``suite``: its marker (written
    last) names the same base document and its essential files are there. A
    debootstrap stopped half-way, or a cache emptied by hand, is not."""
    marker = path / BASE_MARKER
    try:
        recorded = json.loads(marker.read_text())
    except (OSError, ValueError):
        return False
    if recorded != {**base_document(suite), "digest": recipe_digest(base_document(suite))}:
        return False
    return all((path / name).exists() or (path / name).is_symlink() for name in BASE_ESSENTIALS)


def base_build(suite: str, *, root: Path, bases: Path | None = None, progress: Progress = _quiet) -> Path:
    """The minbase root of ``suite`` under ``bases`` (default ``root``; CI
    points it at a cache outside its clone, so a run reuses the last run's
    base), built once (debootstrap, as root). A base that is not finished or
    was damaged (``base_valid``) is removed and built again. Safe to repeat
    and to run at once in several processes (one builds, the others wait)."""
    final = base_path(suite, bases=bases or root)
    if base_valid(final, suite):
        progress(f"base {suite} reused from {final}")
        return final
    with _locked(final):
        return _base_build(suite, final=final, progress=progress)


def _base_build(suite: str, *, final: Path, progress: Progress) -> Path:
    if base_valid(final, suite):
        progress(f"base {suite} reused from {final}")
        return final
    if os.geteuid() != 0:
        raise EnvironmentBuildError("building a Debian root filesystem needs root (debootstrap)")
    program = builder()
    if final.exists() or final.is_symlink():
        progress(f"base {suite} at {final} is unfinished or damaged: removed, built again")
        if final.is_dir() and not final.is_symlink():
            shutil.rmtree(final)
        else:
            final.unlink()
    final.parent.mkdir(parents=True, exist_ok=True)
    # What a build stopped half-way left (the lock is ours: nobody else builds this suite now).
    for stale in final.parent.glob(f".base-{suite}-*"):
        shutil.rmtree(stale, ignore_errors=True)
    scratch = Path(tempfile.mkdtemp(prefix=f".base-{suite}-", dir=final.parent))
    started = time.monotonic()
    progress(f"debootstrap --variant={VARIANT} {suite} (Debian's packages from {MIRROR})")
    try:
        _run_logged(
            [program, f"--variant={VARIANT}", suite, str(scratch / "rootfs"), MIRROR],
            what=f"debootstrap {suite}",
            progress=progress,
        )
        document = base_document(suite)
        (scratch / "rootfs" / BASE_MARKER).write_text(json.dumps({**document, "digest": recipe_digest(document)}))
        os.rename(scratch / "rootfs", final)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    progress(f"base {suite} built in {time.monotonic() - started:.1f} s")
    return final


def official_apt_sources(suite: str) -> tuple[str, str]:
    """The apt sources file of Docker's official image of ``suite``: its path
    inside the root and its text (the image's snapshot comments left out)."""
    if suite == "bullseye":
        lines = [
            f"deb {MIRROR} {suite} main",
            f"deb {SECURITY_MIRROR} {suite}-security main",
            f"deb {MIRROR} {suite}-updates main",
        ]
        return "etc/apt/sources.list", "\n".join(lines) + "\n"
    keyring = "Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg"
    stanzas = [
        f"Types: deb\nURIs: {MIRROR}\nSuites: {suite} {suite}-updates\nComponents: main\n{keyring}\n",
        f"Types: deb\nURIs: {SECURITY_MIRROR}\nSuites: {suite}-security\nComponents: main\n{keyring}\n",
    ]
    return "etc/apt/sources.list.d/debian.sources", "\n".join(stanzas)


def _write_apt_sources(target: Path, suite: str) -> None:
    """Replace debootstrap's one-suite sources.list by the official image's sources."""
    (target / "etc" / "apt" / "sources.list").unlink(missing_ok=True)
    path, text = official_apt_sources(suite)
    (target / path).parent.mkdir(parents=True, exist_ok=True)
    (target / path).write_text(text)
    (target / path).chmod(0o644)


def environment_path(root: Path, digest: str) -> Path:
    return root / digest


def environment_build(
    document: dict[str, Any], *, root: Path, bases: Path | None = None, progress: Progress = _quiet
) -> Path:
    """The root filesystem of the recipe ``document`` under ``root/<digest>``:
    reused when built before, else a copy of the suite's base with every step
    replayed in it. Safe to repeat and to run at once (one process builds,
    the others wait for it; built aside and renamed into place).
    EnvironmentBuildError naming the failing step."""
    digest = recipe_digest(document)
    final = environment_path(root, digest)
    if (final / "etc" / "debian_version").is_file():
        progress(f"environment {digest[:12]} already built")
        return final
    with _locked(final):
        return _environment_build(document, digest=digest, final=final, root=root, bases=bases, progress=progress)


def _environment_build(
    document: dict[str, Any], *, digest: str, final: Path, root: Path, bases: Path | None, progress: Progress
) -> Path:
    if (final / "etc" / "debian_version").is_file():
        progress(f"environment {digest[:12]} already built")
        return final
    if document.get("kind") != RECIPE_KIND:
        raise EnvironmentBuildError(f"not an environment recipe: kind {document.get('kind')!r}")
    base = base_build(document["base"]["suite"], root=root, bases=bases, progress=progress)
    started = time.monotonic()
    scratch = Path(tempfile.mkdtemp(prefix=f".{digest[:12]}-", dir=root))
    target = scratch / "rootfs"
    try:
        progress(f"copying base {document['base']['suite']}")
        subprocess.run(["cp", "-a", "--reflink=auto", str(base), str(target)], check=True, capture_output=True)
        if document["base"].get("apt_sources") == APT_SOURCES:
            _write_apt_sources(target, document["base"]["suite"])
        steps = document["steps"]
        for number, step in enumerate(steps, start=1):
            if "run" in step:
                progress(f"step {number}/{len(steps)}: RUN {step['run'][:100]}")
                _replay_run(target, step, progress=progress)
            else:
                progress(f"step {number}/{len(steps)}: COPY {len(step['copy'])} file(s)")
                _replay_copy(target, step["copy"])
        (target / ".rsi-environment.json").write_text(json.dumps({"digest": digest, **document}, sort_keys=True))
        _rename_into_place(target, final)
    except subprocess.CalledProcessError as exc:
        raise EnvironmentBuildError(f"copying the base failed: {exc.stderr.decode(errors='replace')[-500:]}") from exc
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    progress(f"environment {digest[:12]} built in {time.monotonic() - started:.1f} s")
    return final


def _rename_into_place(source: Path, final: Path) -> None:
    try:
        os.rename(source, final)
    except OSError:
        if not (final / "etc" / "debian_version").is_file():
            raise  # not another process's finished build: a real failure


def _replay_copy(target: Path, entries: list[dict[str, Any]]) -> None:
    for entry in entries:
        inside = PurePosixPath(entry["path"])
        path = target / inside.relative_to("/")
        path.parent.mkdir(parents=True, exist_ok=True)
        if path.is_symlink():
            path.unlink()
        path.write_bytes(base64.b64decode(entry["data"]))
        path.chmod(int(entry["mode"], 8))


def _replay_run(target: Path, step: dict[str, Any], *, progress: Progress) -> None:
    """One RUN inside ``target`` as its root, with the network (bubblewrap,
    no user namespace: the worker is root), the host's resolver and CA bundle."""
    bwrap = shutil.which("bwrap")
    if bwrap is None:
        raise EnvironmentBuildError("bwrap is not installed: apt-get install -y bubblewrap")
    workdir = step.get("workdir") or "/"
    (target / workdir.lstrip("/")).mkdir(parents=True, exist_ok=True)
    env = {
        "PATH": BUILD_PATH,
        "HOME": "/root",
        "LANG": "C.UTF-8",
        "DEBIAN_FRONTEND": "noninteractive",
        "PIP_BREAK_SYSTEM_PACKAGES": "1",
        "PIP_ROOT_USER_ACTION": "ignore",
        **step.get("env", {}),
    }
    env.update(host_network_env(None))
    # /tmp world-writable with the sticky bit, as on any system: apt's own unprivileged user writes there.
    command = [
        bwrap,
        "--bind",
        str(target),
        "/",
        "--proc",
        "/proc",
        "--dev",
        "/dev",
        "--perms",
        "1777",
        "--tmpfs",
        "/tmp",
    ]
    command += ["--unshare-pid", "--unshare-ipc", "--unshare-uts", "--die-with-parent"]
    if Path("/etc/resolv.conf").exists():
        command += ["--ro-bind", os.path.realpath("/etc/resolv.conf"), "/etc/resolv.conf"]
    if HOST_CA_BUNDLE.is_file():
        command += ["--ro-bind", str(HOST_CA_BUNDLE), "/etc/rsi-host-ca.crt"]
        env.update(host_network_env("/etc/rsi-host-ca.crt"))
    command.append("--clearenv")
    for key, value in env.items():
        command += ["--setenv", key, value]
    command += ["--chdir", workdir, "/bin/sh", "-c", step["run"]]
    if not (target / "etc" / "rsi-host-ca.crt").exists() and HOST_CA_BUNDLE.is_file():
        (target / "etc" / "rsi-host-ca.crt").touch()  # the mount point of the host's bundle
    _run_logged(command, what=f"RUN {step['run'][:200]}", progress=progress)


def host_network_env(ca_bundle: str | None) -> dict[str, str]:
    """The variables a process in an environment needs to reach the registries
    as this machine does: its proxy settings and, when the caller mounts the
    host's CA bundle at ``ca_bundle``, that bundle for OpenSSL, pip and
    requests (the proxy's certificates are the host's, not Debian's)."""
    env = {name: os.environ[name] for name in PROXY_VARIABLES if name in os.environ}
    if ca_bundle is not None:
        env.update(SSL_CERT_FILE=ca_bundle, PIP_CERT=ca_bundle, REQUESTS_CA_BUNDLE=ca_bundle)
    return env


def _run_logged(command: list[str], *, what: str, progress: Progress) -> None:
    with tempfile.TemporaryFile() as log:
        process = subprocess.run(command, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, check=False)
        if process.returncode != 0:
            log.seek(max(0, log.seek(0, os.SEEK_END) - 2000))
            tail = log.read().decode(errors="replace")
            raise EnvironmentBuildError(f"{what} exited with status {process.returncode}; output tail:\n{tail}")


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    """Held while one process builds ``path``: another waits, then finds it built."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(f"{path}.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
