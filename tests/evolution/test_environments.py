"""The Dockerfile replay planner (evolution/environments.py) on real
Dockerfiles of Harbor and Terminal-Bench tasks (tests/fixtures/harbor_environments/SOURCE.md):
each supported instruction and each refusal. No build here: the build and a
trial in a built environment are tests/evolution/test_environment_build.py."""

from __future__ import annotations

import base64
import json
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
    assert recipe.document()["base"] == {
        "suite": "trixie",
        "variant": "minbase",
        "mirror": environments.MIRROR,
        "apt_sources": environments.APT_SOURCES,
    }


def test_the_built_root_lists_the_official_images_apt_sources(tmp_path: Path) -> None:
    # configure-openssh-ca-only-proxyjump pins openssh-server 1:9.2p1-2+deb12u7, which Debian serves only
    # from bookworm-updates: debootstrap's sources.list (the suite alone) cannot install it, the image's can.
    recipe = plan(_dockerfile("configure-openssh-ca-only-proxyjump"), context=_context(tmp_path, {"app/x": b"x"}))
    assert recipe.document()["base"]["apt_sources"] == environments.APT_SOURCES
    root = tmp_path / "root"
    (root / "etc" / "apt").mkdir(parents=True)
    (root / "etc" / "apt" / "sources.list").write_text(f"deb {environments.MIRROR} bookworm main\n")
    environments._write_apt_sources(root, recipe.suite)
    assert not (root / "etc" / "apt" / "sources.list").exists()
    text = (root / "etc" / "apt" / "sources.list.d" / "debian.sources").read_text()
    keyring = "Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg"
    assert text == "\n".join(
        [
            "Types: deb\nURIs: http://deb.debian.org/debian\nSuites: bookworm bookworm-updates\n"
            f"Components: main\n{keyring}\n",
            "Types: deb\nURIs: http://deb.debian.org/debian-security\nSuites: bookworm-security\n"
            f"Components: main\n{keyring}\n",
        ]
    )
    assert "Suites: trixie trixie-updates\n" in environments.official_apt_sources("trixie")[1]
    # bullseye's image predates deb822: one line a suite in sources.list.
    assert environments.official_apt_sources("bullseye") == (
        "etc/apt/sources.list",
        "deb http://deb.debian.org/debian bullseye main\n"
        "deb http://deb.debian.org/debian-security bullseye-security main\n"
        "deb http://deb.debian.org/debian bullseye-updates main\n",
    )


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
def test_the_terminal_bench_tasks_are_refused_for_their_tests_downloads() -> None:
    """The three Terminal-Bench 2.1 tasks: qemu-alpine-ssh for its Dockerfile,
    the two others for their tests/test.sh, which installs uv from astral.sh
    while grading (a verifier that could never pass here); nothing imported."""
    import io

    from django.core.management import CommandError, call_command

    from evolution.agents import cli_runner
    from evolution.models import Experiment

    folder = Path(cli_runner.__file__).parent / "terminal_bench_example"
    with pytest.raises(CommandError) as refused:
        call_command("import_harbor_tasks", str(folder), "--name", "tb-debian", stdout=io.StringIO())
    message = str(refused.value)
    for task in ("build-pmars", "winning-avg-corewars"):
        assert (
            f"{task}: tests/test.sh line 8 fetches from astral.sh, which this machine cannot reach: "
            "curl -LsSf https://astral.sh/uv/0.9.5/install.sh | sh"
        ) in message
    assert "qemu-alpine-ssh: Dockerfile line 17: RUN fetches from dl-cdn.alpinelinux.org" in message
    assert not Experiment.objects.filter(name="tb-debian").exists()


def _harbor_task(folder: Path, *, test_sh: str, task_toml: str) -> Path:
    return _context(
        folder,
        {
            "instruction.md": b"Configure OpenSSH.\n",
            "task.toml": task_toml.encode(),
            "tests/test.sh": test_sh.encode(),
            "environment/Dockerfile": _dockerfile("configure-openssh-ca-only-proxyjump").encode(),
            "environment/app/README": b"the task's app/ folder is not needed to plan\n",
        },
    )


def test_tests_that_install_from_pypi_import_and_those_that_download_uv_do_not(tmp_path: Path) -> None:
    from evolution.agents import harbor

    task_toml = (FIXTURES / "configure-openssh-ca-only-proxyjump.task.toml").read_text()
    accepted = _harbor_task(
        tmp_path / "configure-openssh-ca-only-proxyjump",
        test_sh=(FIXTURES / "configure-openssh-ca-only-proxyjump.test.sh").read_text(),
        task_toml=task_toml,
    )
    read = harbor.read_task(accepted)
    # No allow_internet: Harbor's default is true, for the agent and the verifier alike.
    assert read.expected["network"] == {"agent": True, "verifier": True}
    assert read.metadata["environment"]["network"] == {"agent": True, "verifier": True}
    # Terminal-Bench 2.1's test.sh (the same lines as many Harbor tasks'): uv from astral.sh while grading.
    tb2_test_sh = FIXTURES.parent.parent.parent / "evolution/agents/terminal_bench_example/build-pmars/tests/test.sh"
    refused = _harbor_task(tmp_path / "build-pmars", test_sh=tb2_test_sh.read_text(), task_toml=task_toml)
    with pytest.raises(harbor.HarborTaskRefused) as exc:
        harbor.read_task(refused)
    assert str(exc.value) == (
        "build-pmars: tests/test.sh line 8 fetches from astral.sh, which this machine cannot reach: "
        "curl -LsSf https://astral.sh/uv/0.9.5/install.sh | sh"
    )
    # A comment naming a host is not a download; a server of the task's own on localhost is reachable.
    environments.check_test_scripts({"test.sh": "# see https://github.com/x/y\ncurl http://localhost:8080/health\n"})


@pytest.mark.parametrize(
    ("toml", "network"),
    [
        ("", {"agent": True, "verifier": True}),
        ("[environment]\nallow_internet = false\n", {"agent": False, "verifier": False}),
        ("[environment]\nallow_internet = true\n", {"agent": True, "verifier": True}),
        ('[environment]\nnetwork_mode = "no-network"\n', {"agent": False, "verifier": False}),
        (
            '[environment]\nallow_internet = false\n[verifier]\nnetwork_mode = "public"\n',
            {"agent": False, "verifier": True},
        ),
        ('[agent]\nnetwork_mode = "no-network"\n', {"agent": False, "verifier": True}),
    ],
)
def test_network_follows_harbors_task_toml(toml: str, network: dict[str, bool]) -> None:
    import tomllib

    from evolution.agents import harbor

    assert harbor.task_network(tomllib.loads(toml)) == network


def test_an_allowlist_of_hosts_is_refused() -> None:
    from evolution.agents import harbor

    with pytest.raises(EnvironmentRefused, match=r"agent network_mode 'allowlist' cannot be enforced here"):
        harbor.task_network({"environment": {"allowed_hosts": ["pypi.org"]}})


def _base(folder: Path, suite: str) -> Path:
    """The files base_valid reads, as debootstrap leaves them, and the marker written last."""
    for name in environments.BASE_ESSENTIALS:
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_text("12.11\n")
    document = environments.base_document(suite)
    (folder / environments.BASE_MARKER).write_text(
        json.dumps({**document, "digest": environments.recipe_digest(document)})
    )
    return folder


def test_a_cached_base_is_reused_and_an_unfinished_or_damaged_one_is_not(tmp_path: Path) -> None:
    final = environments.base_path("bookworm", bases=tmp_path)
    assert final.name.startswith("base-bookworm-minbase-")
    _base(final, "bookworm")
    messages: list[str] = []
    # Reused as it is: no debootstrap, no lock taken.
    assert (
        environments.base_build("bookworm", root=tmp_path / "elsewhere", bases=tmp_path, progress=messages.append)
        == final
    )
    assert messages == [f"base bookworm reused from {final}"]
    assert not environments.base_valid(final, "trixie")  # another suite's marker
    (final / "usr" / "bin" / "apt-get").unlink()  # damaged
    assert not environments.base_valid(final, "bookworm")
    _base(final, "bookworm")
    (final / environments.BASE_MARKER).unlink()  # debootstrap stopped before the marker
    assert not environments.base_valid(final, "bookworm")
    (final / environments.BASE_MARKER).write_text("{")  # cut short
    assert not environments.base_valid(final, "bookworm")


def test_the_dockerfiles_env_reaches_the_verifiers_test_script(tmp_path: Path) -> None:
    """ENV lines are the image's environment for the tests too, not only for the agent."""
    from evolution.agents import harbor_verify

    recipe = plan(
        _dockerfile("configure-openssh-ca-only-proxyjump"), context=_context(tmp_path / "ctx", {"app/x": b""})
    )
    assert recipe.env == {"DEBIAN_FRONTEND": "noninteractive"}
    document = {**recipe.document(), "env": {**recipe.env, "DATA": "/app/data.txt"}}
    output = tmp_path / "output"
    (output / "workspace").mkdir(parents=True)
    (output / "workspace" / "data.txt").write_text("x\n")
    test_sh = (
        '[ "$DEBIAN_FRONTEND" = noninteractive ] && [ -f "$DATA" ] '
        "&& echo 1 > /logs/verifier/reward.txt || echo 0 > /logs/verifier/reward.txt\n"
    )
    expected = {"tests": {"test.sh": test_sh}, "workspace_files": {}, "environment": document}
    (tmp_path / "private").mkdir()
    assert harbor_verify.grade(output, {"expected": expected}, tmp_path / "private")["score"] == 1.0
    del expected["environment"]
    (tmp_path / "private2").mkdir()
    assert harbor_verify.grade(output, {"expected": expected}, tmp_path / "private2")["score"] == 0.0


def test_a_phase_with_the_network_gets_the_machines_proxy_and_ca_bundle(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A grading-time ``pip install`` in a task environment goes through the machine's proxy,
    whose certificates only the host's bundle holds: the trial passes both, and test.sh sees them."""
    from evolution import trials
    from evolution.agents import harbor_verify

    monkeypatch.setenv("https_proxy", "http://proxy.invalid:3128")
    monkeypatch.setenv("NO_PROXY", "localhost")
    assert trials._host_network(tmp_path, None) == ({}, [])  # the host's root: nothing to add
    env, dirs = trials._host_network(tmp_path, tmp_path / "root")
    if environments.HOST_CA_BUNDLE.is_file():
        bundle = tmp_path / "host-ca" / "ca-certificates.crt"
        assert dirs == [bundle.parent]
        assert bundle.read_bytes() == environments.HOST_CA_BUNDLE.read_bytes()
        assert env["SSL_CERT_FILE"] == env["PIP_CERT"] == env["REQUESTS_CA_BUNDLE"] == str(bundle)
    assert env["https_proxy"] == "http://proxy.invalid:3128" and env["NO_PROXY"] == "localhost"
    assert set(env) <= set(harbor_verify.NETWORK_VARIABLES)

    monkeypatch.setenv("PIP_CERT", "/the/bundle.crt")
    output = tmp_path / "output"
    (output / "workspace").mkdir(parents=True)
    test_sh = (
        '[ "$https_proxy" = http://proxy.invalid:3128 ] && [ "$PIP_CERT" = /the/bundle.crt ] '
        "&& echo 1 > /logs/verifier/reward.txt || echo 0 > /logs/verifier/reward.txt\n"
    )
    expected = {"tests": {"test.sh": test_sh}, "workspace_files": {}}
    (tmp_path / "private").mkdir()
    assert harbor_verify.grade(output, {"expected": expected}, tmp_path / "private")["score"] == 1.0
