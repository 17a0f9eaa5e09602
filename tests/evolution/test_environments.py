"""The Dockerfile replay planner (evolution/environments.py) on real
Dockerfiles of Harbor and Terminal-Bench tasks (tests/fixtures/harbor_environments/SOURCE.md):
each supported instruction and each refusal. No build here: the build and a
trial in a built environment are tests/evolution/test_environment_build.py."""

from __future__ import annotations

import base64
from pathlib import Path

import pytest

from evolution import environments
from evolution.environments import EnvironmentRefused, plan

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "harbor_environments"


def _dockerfile(name: str) -> str:
    return (FIXTURES / f"{name}.Dockerfile").read_text()


def _context(tmp_path: Path, files: dict[str, bytes]) -> Path:
    """A build context holding ``files`` (the tasks' own are not needed to plan their Dockerfiles)."""
    for name, data in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_bytes(data)
    return tmp_path


def test_build_pmars_runs_apt_and_copies_into_the_workspace(tmp_path: Path) -> None:
    context = _context(tmp_path, {"warriors/flashpaper.red": b";redcode\n", "warriors/rave.red": b";redcode-94\n"})
    recipe = plan(_dockerfile("tb2-build-pmars"), context=context)
    assert recipe.suite == "trixie"
    # RUN: replayed as written, in the working directory of its place in the file.
    assert recipe.steps == [{"run": "apt-get update && apt-get install -y tmux asciinema", "env": {}, "workdir": "/"}]
    # WORKDIR; COPY into /app: the agent's workspace (Harbor's /app), not baked into the root.
    assert recipe.workdir == "/app"
    assert recipe.workspace == {"flashpaper.red": b";redcode\n", "rave.red": b";redcode-94\n"}
    # debian:13.0-slim is a point release the archive no longer serves apart: said, not hidden.
    assert recipe.notes == [
        "debian:13.0-slim: built from Debian trixie's current packages, not that exact point release"
    ]
    assert recipe.document()["base"] == {"suite": "trixie", "variant": "minbase", "mirror": environments.MIRROR}


def test_the_digest_covers_the_copied_bytes(tmp_path: Path) -> None:
    one = plan(_dockerfile("vintage-story"), context=_context(tmp_path / "a", _vintage_files(b"#!/bin/sh\n")))
    same = plan(_dockerfile("vintage-story"), context=_context(tmp_path / "b", _vintage_files(b"#!/bin/sh\n")))
    other = plan(_dockerfile("vintage-story"), context=_context(tmp_path / "c", _vintage_files(b"#!/bin/bash\n")))
    assert one.digest == same.digest
    assert one.digest != other.digest
    assert len(one.digest) == 64


def _vintage_files(entrypoint: bytes) -> dict[str, bytes]:
    return {"entrypoint.sh": entrypoint, "src/run.sh": b"run\n", "src/download_server.sh": b"dl\n"}


def test_env_glob_copy_and_ignored_instructions(tmp_path: Path) -> None:
    recipe = plan(_dockerfile("vintage-story"), context=_context(tmp_path, _vintage_files(b"#!/bin/sh\n")))
    assert recipe.suite == "trixie"
    # ENV: quotes removed, kept for the steps after it and for the trials.
    env = {"DEBIAN_FRONTEND": "noninteractive", "LANG": "en_US.UTF-8", "LC_ALL": "en_US.UTF-8"}
    assert recipe.env == env
    copies = [step["copy"] for step in recipe.steps if "copy" in step]
    # COPY outside /app is baked into the root; a glob copies every match into the folder.
    assert [[entry["path"] for entry in copy] for copy in copies] == [
        ["/entrypoint.sh"],
        ["/usr/local/bin/download_server.sh", "/usr/local/bin/run.sh"],
    ]
    assert base64.b64decode(copies[0][0]["data"]) == b"#!/bin/sh\n"
    runs = [step for step in recipe.steps if "run" in step]
    assert len(runs) == 1
    assert runs[0]["env"] == env and runs[0]["workdir"] == "/app"
    assert runs[0]["run"].startswith("chmod -R +x /usr/local/bin/* /entrypoint.sh; apt-get update;")
    assert runs[0]["run"].endswith("locale-gen")
    # EXPOSE, VOLUME, ENTRYPOINT, CMD change no file: nothing else.
    assert len(recipe.steps) == 3 and recipe.workspace == {}


def test_arg_and_the_old_env_form(tmp_path: Path) -> None:
    recipe = plan(_dockerfile("docker-debian-emacs"), context=tmp_path)
    assert recipe.suite == "bookworm"
    assert recipe.env == {"TZ": "Asia/Tokyo"}
    first = recipe.steps[0]
    # The ARG's value reaches the step's environment, where the shell expands $TZ.
    assert first["run"] == "ln -snvf /usr/share/zoneinfo/$TZ /etc/localtime && echo $TZ > /etc/timezone"
    assert first["env"] == {"tz": "Asia/Tokyo", "TZ": "Asia/Tokyo"}
    assert recipe.steps[1]["run"].startswith("apt-get update && apt-get install --no-install-recommends -y emacs")


@pytest.mark.parametrize(
    ("name", "reason"),
    [
        ("harbor-hello-world", "Dockerfile line 1: base image 'ubuntu:24.04' cannot be built from Debian's packages"),
        ("harbor-hello-alpine", "Dockerfile line 1: base image 'alpine:3.22' cannot be built from Debian's packages"),
        ("harbor-llm-judge-example", "Dockerfile line 1: base image 'ubuntu:24.04' cannot"),
        (
            "harbor-word-count",
            "Dockerfile line 3: base image 'python:3.13-slim' cannot be built from Debian's packages",
        ),
        (
            "terminal-bench-env-ubuntu-ghcr",
            "Dockerfile line 1: base image 'ghcr.io/laude-institute/t-bench/ubuntu-24-04:20250624' cannot",
        ),
        ("log-report", "Dockerfile line 1: base image 'python:3.12-slim@sha256:57cd7c3a"),
        (
            "tb2-qemu-alpine-ssh",
            "Dockerfile line 17: RUN fetches from dl-cdn.alpinelinux.org, which this machine cannot reach",
        ),
    ],
)
def test_refused_with_the_reason(tmp_path: Path, name: str, reason: str) -> None:
    with pytest.raises(EnvironmentRefused) as refused:
        plan(_dockerfile(name), context=_context(tmp_path, {"access.log": b"x\n"}))
    assert str(refused.value).startswith(reason)
    assert "\n" not in str(refused.value)


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        # The step each real Dockerfile would need to be refused for, set in the emacs image's file.
        (("RUN ln", "RUN --mount=type=cache,target=/var/lib/apt ln"), "line 4: RUN --mount cannot be replayed"),
        (("RUN ln", "RUN git clone https://deb.debian.org/x && ln"), "line 4: RUN clones a git repository"),
        (("RUN ln", "RUN add-apt-repository ppa:x && ln"), "line 4: RUN adds a package source other than Debian's"),
        (("ENTRYPOINT", "SHELL"), "line 12: SHELL cannot be replayed"),
        (("ENTRYPOINT", "USER nobody\nCMD"), "line 12: USER nobody (trials run as their own user"),
        (("ENTRYPOINT", "COPY --from=builder /x /y\nCMD"), "line 12: COPY --from (another image) cannot be replayed"),
        (("ENTRYPOINT", "FROM debian:12\nCMD"), "line 12: a second FROM (multi-stage builds cannot be replayed)"),
        (("ENTRYPOINT", "ADD https://pypi.org/x.tar.gz /x\nCMD"), "line 12: ADD of a URL or an archive"),
        (("ENTRYPOINT", "COPY missing.txt /x\nCMD"), "line 12: COPY source 'missing.txt' is missing"),
        (("ENTRYPOINT", "COPY ../secret /x\nCMD"), "line 12: COPY source '../secret' leaves the build context"),
        (("FROM debian:12.6-slim", "FROM debian:buster"), "line 1: base image 'debian:buster' cannot"),
    ],
)
def test_each_unreplayable_step_is_refused(tmp_path: Path, change: tuple[str, str], reason: str) -> None:
    text = _dockerfile("docker-debian-emacs").replace(*change, 1)
    with pytest.raises(EnvironmentRefused) as refused:
        plan(text, context=tmp_path)
    assert str(refused.value).startswith(f"Dockerfile {reason}")


def test_registries_and_debian_are_allowed_hosts(tmp_path: Path) -> None:
    text = _dockerfile("docker-debian-emacs").replace(
        "RUN ln", "RUN pip install --index-url https://pypi.org/simple pytest && echo https://deb.debian.org && ln", 1
    )
    assert plan(text, context=tmp_path).steps[0]["run"].startswith("pip install --index-url https://pypi.org/simple")


def test_docker_image_in_task_toml_is_no_reason_to_refuse(tmp_path: Path) -> None:
    """A Terminal-Bench 2 task names a prebuilt image Harbor would pull; here
    the environment comes from its Dockerfile, so the task imports."""
    from evolution.agents import harbor

    task = tmp_path / "build-pmars"
    _context(
        task,
        {
            "instruction.md": b"Build pMARS from Debian sources.\n",
            "task.toml": b'[environment]\ndocker_image = "alexgshaw/build-pmars:20251031"\n',
            "tests/test.sh": b"#!/bin/bash\necho 1 > /logs/verifier/reward.txt\n",
            "environment/Dockerfile": _dockerfile("tb2-build-pmars").encode(),
            "environment/warriors/flashpaper.red": b";redcode\n",
            "environment/warriors/rave.red": b";redcode-94\n",
        },
    )
    read = harbor.read_task(task)
    assert read.files == {"workspace/flashpaper.red": b";redcode\n", "workspace/rave.red": b";redcode-94\n"}
    assert read.expected["environment"]["base"]["suite"] == "trixie"
    assert read.metadata["environment"]["digest"] == environments.recipe_digest(read.expected["environment"])
    (task / "environment" / "Dockerfile").write_text(_dockerfile("harbor-hello-world"))
    with pytest.raises(harbor.HarborTaskRefused, match=r"^build-pmars: Dockerfile line 1: base image 'ubuntu:24.04'"):
        harbor.read_task(task)


@pytest.mark.django_db
def test_the_worked_example_imports_two_tasks_and_refuses_the_third() -> None:
    import io

    from django.core.management import call_command

    from evolution.agents import cli_runner
    from evolution.models import Experiment

    folder = Path(cli_runner.__file__).parent / "terminal_bench_example"
    out = io.StringIO()
    call_command("import_harbor_tasks", str(folder), "--name", "tb-debian", stdout=out)
    lines = out.getvalue().splitlines()
    assert lines[0] == (
        "refused qemu-alpine-ssh: Dockerfile line 17: RUN fetches from dl-cdn.alpinelinux.org, which this machine "
        "cannot reach: wget -q https://dl-cdn.alpinelinux.org/alpine/v3.19/releases/x86_64/alpine-extended-3.19.0-"
        "x86_64.iso -O /app/alpine.iso"
    )
    experiment = Experiment.objects.get(name="tb-debian")
    tasks = {task.external_id: task for task in experiment.benchmark.tasks.all()}
    assert sorted(tasks) == ["build-pmars", "winning-avg-corewars"]
    corewars = tasks["winning-avg-corewars"].expected["environment"]
    assert [step["run"][:30] for step in corewars["steps"]] == [
        "apt-get update && apt-get inst",
        "echo 'deb-src http://deb.debia",
        "apt-get update",
        "apt-get source pmars && cd /ap",
    ]
    # The warriors copied into /app start the agent's workspace; the tests stay private.
    assert tasks["winning-avg-corewars"].public_files is not None
    assert "test.sh" in tasks["build-pmars"].expected["tests"]
    assert experiment.evaluator.timeout_seconds == 3600
    assert lines[-1].startswith("imported experiment 'tb-debian'")
