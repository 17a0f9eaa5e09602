"""Which way imports go, checked from the source (docs/architecture.md draws it).

``evolution`` (the domain and the engine) never imports ``review``, ``api``, ``lab`` or a management command, even
inside a function, and ``api`` never imports ``review`` or ``lab`` (the sealed rules and reads both share live in
``evolution``); ``evolution``'s modules import each other without a cycle; and no module reads another module's
``_private`` names. Each rule is also run on a small tree written here, so a rule that could never fire shows up as
a failure.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

from tests.conftest import REPO_ROOT

PROJECT_PACKAGES = ("evolution", "review", "api", "lab", "rsiweb")
# The packages each package may not import (docs/architecture.md's table), nor any management command.
FORBIDDEN: dict[str, tuple[str, ...]] = {
    "evolution": ("review", "api", "lab"),
    "api": ("review", "lab"),
}
# Inside ``evolution``: the modules a layer may not import, even inside a function (docs/architecture.md). The
# services sit below the loop and the tasks: the loop calls a service and acts on its result, never the reverse.
INNER_FORBIDDEN: dict[str, tuple[str, ...]] = {
    "evolution.services": ("evolution.loop", "evolution.tasks"),
}
# Layers that may not import each other in a circle, counting the imports inside functions.
LAYERS = ("evolution.services", "evolution.loop", "evolution.tasks")
# The one module that sends Celery messages, each after its transaction commits; no other module sends one.
DISPATCH = "evolution.dispatch"
SENDS = frozenset({"delay", "apply_async", "send_task", "delay_on_commit", "apply_async_on_commit"})
# A view (a function of review/views/ under a require_* or permission decorator) parses the request, calls one page
# builder (review/pages/) or service and renders: at most this many lines after its docstring. 30 holds parsing a
# few parameters, an htmx partial branch and a message for a refused action (the candidate page's view takes 10,
# the trial comparison's 12, the diff's 10, the diff context's 29); a longer view is building its page itself.
VIEW_LINES = 30
# The views still longer than VIEW_LINES when the rule came (issue 38), at their length then: each may only shrink
# until it is thinned to VIEW_LINES, then leaves this table.
LONGER_VIEWS: dict[str, int] = {
    "annotations:annotate_queue": 56,
    "annotations:annotation_stats": 58,
    "annotations:trial_annotations": 34,
    "candidates:diff_viewed": 37,
    "experiments:experiment": 43,
    "lineage:lineage": 37,
    "queue:queue": 43,
    "results:matrix": 56,
    "results:trial": 56,
    "runs:run_start": 34,
}
VIEW_DECORATORS = ("require_GET", "require_POST", "require_http_methods", "permission_required", "login_required")


def module_name(root: Path, path: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def project_modules(root: Path, packages: tuple[str, ...]) -> dict[str, Path]:
    found = {}
    for package in packages:
        for path in sorted((root / package).rglob("*.py")):
            if "migrations" not in path.parts:
                found[module_name(root, path)] = path
    return found


def _type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def imports(tree: ast.Module) -> Iterator[tuple[str, list[str], bool, int]]:
    """(module, names imported from it, at module level?, line) for every absolute import in the file.

    Module level means Python runs it when the file is imported: not inside a function, not under TYPE_CHECKING.
    """

    def walk(nodes: list[ast.stmt], top: bool) -> Iterator[tuple[str, list[str], bool, int]]:
        for node in nodes:
            if isinstance(node, ast.Import):
                for alias in node.names:
                    yield alias.name, [], top, node.lineno
            elif isinstance(node, ast.ImportFrom):
                if node.level == 0 and node.module:
                    yield node.module, [alias.name for alias in node.names], top, node.lineno
            elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                yield from walk(node.body, False)
            elif isinstance(node, ast.If) and _type_checking(node):
                yield from walk(node.body, False)
                yield from walk(node.orelse, top)
            else:
                for field in ("body", "orelse", "finalbody", "handlers"):
                    children = getattr(node, field, None)
                    if isinstance(children, list):
                        yield from walk([child for child in children if isinstance(child, ast.stmt)], top)
                if isinstance(node, ast.Try):
                    for handler in node.handlers:
                        yield from walk(handler.body, top)

    yield from walk(tree.body, True)


def targets(module: str, names: list[str], known: dict[str, Path]) -> set[str]:
    """The project modules an import statement names: ``from a.b import c`` is ``a.b.c`` when that is a module."""
    found = {module} if module in known else set()
    found |= {f"{module}.{name}" for name in names if f"{module}.{name}" in known}
    return found


def boundary_violations(root: Path) -> list[str]:
    """Imports (anywhere in a file) from a package of ``FORBIDDEN`` of what it may not import, or of a management
    command."""
    found = []
    for package, above in FORBIDDEN.items():
        for path in project_modules(root, (package,)).values():
            for imported, names, _, line in imports(ast.parse(path.read_text(encoding="utf-8"))):
                reached = [imported] + [f"{imported}.{name}" for name in names]
                for name in reached:
                    if name.split(".")[0] in above or ".management.commands." in f"{name}.":
                        found.append(f"{path.relative_to(root)}:{line} imports {name}")
                        break
    return found


def import_graph(root: Path, *, lazy: bool = False) -> dict[str, set[str]]:
    """``evolution``'s modules and the ones each imports: at module level, or anywhere with ``lazy``."""
    known = project_modules(root, ("evolution",))
    graph: dict[str, set[str]] = {module: set() for module in known}
    for module, path in known.items():
        for imported, names, top, _ in imports(ast.parse(path.read_text(encoding="utf-8"))):
            if top or lazy:
                graph[module] |= targets(imported, names, known) - {module}
    return graph


def strongly_connected(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm, iterative so a deep graph
    cannot exhaust the stack)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles = []
    for start in graph:
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    cycles.append(sorted(component))
    return cycles


def import_cycles(root: Path) -> list[list[str]]:
    """Strongly connected components of more than one module among ``evolution``'s module-level imports."""
    return strongly_connected(import_graph(root))


def _within(name: str, prefix: str) -> bool:
    return name == prefix or name.startswith(f"{prefix}.")


def layer_violations(root: Path) -> list[str]:
    """Imports (anywhere in a file) by a module of an ``INNER_FORBIDDEN`` layer of what that layer may not import."""
    found = []
    modules = project_modules(root, ("evolution",))
    for layer, above in INNER_FORBIDDEN.items():
        for module, path in modules.items():
            if not _within(module, layer):
                continue
            for imported, names, _, line in imports(ast.parse(path.read_text(encoding="utf-8"))):
                reached = [imported] + [f"{imported}.{name}" for name in names]
                for name in reached:
                    if any(_within(name, forbidden) for forbidden in above):
                        found.append(f"{path.relative_to(root)}:{line} imports {name}")
                        break
    return found


def layer_cycles(root: Path) -> list[list[str]]:
    """Import circles (imports inside functions included) that run through more than one of ``LAYERS``."""
    return [
        component
        for component in strongly_connected(import_graph(root, lazy=True))
        if len({layer for module in component for layer in LAYERS if _within(module, layer)}) > 1
    ]


def task_sends(root: Path, packages: tuple[str, ...] = PROJECT_PACKAGES) -> list[str]:
    """Calls of ``.delay``, ``.apply_async``, ``send_task`` (and their ``_on_commit`` forms) outside ``DISPATCH``."""
    found = []
    for module, path in project_modules(root, packages).items():
        if module == DISPATCH:
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name | ast.Attribute):
                name = node.func.id if isinstance(node.func, ast.Name) else node.func.attr
                if name in SENDS:
                    found.append(f"{path.relative_to(root)}:{node.lineno} calls {name}")
    return sorted(found)


def private_reads(root: Path, packages: tuple[str, ...] = PROJECT_PACKAGES) -> list[str]:
    """``from other import _name`` and ``other._name`` where ``other`` is another project module."""
    known = project_modules(root, packages)
    found = []
    for module, path in known.items():
        tree = ast.parse(path.read_text(encoding="utf-8"))
        aliases: dict[str, str] = {}
        for imported, names, _, line in imports(tree):
            if imported.split(".")[0] not in packages:
                continue
            for name in names:
                if name.startswith("_") and not name.startswith("__") and imported != module:
                    found.append(f"{path.relative_to(root)}:{line} imports {imported}.{name}")
                elif f"{imported}.{name}" in known:
                    aliases[name] = f"{imported}.{name}"
        for node in ast.walk(tree):
            if isinstance(node, ast.alias) and node.asname and node.name in known:
                aliases[node.asname] = node.name
            elif isinstance(node, ast.ImportFrom) and node.module:
                for alias in node.names:
                    if alias.asname and f"{node.module}.{alias.name}" in known:
                        aliases[alias.asname] = f"{node.module}.{alias.name}"
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Attribute)
                and isinstance(node.value, ast.Name)
                and node.value.id in aliases
                and aliases[node.value.id] != module
                and node.attr.startswith("_")
                and not node.attr.startswith("__")
            ):
                found.append(f"{path.relative_to(root)}:{node.lineno} reads {aliases[node.value.id]}.{node.attr}")
    return found


def markup_in_views(root: Path) -> list[str]:
    """Views that mark text safe themselves (``mark_safe`` or ``SafeString(...)``): markup is built in
    ``review.charts``, ``review.matrix``, ``review.diffs`` or a template, never in a view."""
    found = []
    for path in sorted((root / "review" / "views").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name | ast.Attribute):
                name = node.func.id if isinstance(node.func, ast.Name) else node.func.attr
                if name in {"mark_safe", "SafeString"}:
                    found.append(f"{path.relative_to(root)}:{node.lineno} calls {name}")
    return found


def view_lengths(root: Path) -> dict[str, int]:
    """``module:view`` -> the view's lines after its docstring, for every view of ``review/views/``."""
    lengths = {}
    for path in sorted((root / "review" / "views").glob("*.py")):
        for node in ast.parse(path.read_text(encoding="utf-8")).body:
            if not isinstance(node, ast.FunctionDef) or not any(
                any(name in ast.unparse(decorator) for name in VIEW_DECORATORS) for decorator in node.decorator_list
            ):
                continue
            body = node.body
            if len(body) > 1 and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                body = body[1:]  # the docstring
            lengths[f"{path.stem}:{node.name}"] = (node.end_lineno or node.lineno) - body[0].lineno + 1
    return lengths


def fat_views(root: Path, longer: dict[str, int] | None = None) -> list[str]:
    """Views longer than ``VIEW_LINES`` (or than their ``LONGER_VIEWS`` length), and a ``review/display.py``: the
    screens' display rows are the page builders' dataclasses, not attributes set on model instances."""
    longer = LONGER_VIEWS if longer is None else longer
    found = [
        f"review/views/{name.replace(':', '.py:')} has {lines} lines (at most {longer.get(name, VIEW_LINES)})"
        for name, lines in view_lengths(root).items()
        if lines > longer.get(name, VIEW_LINES)
    ]
    if (root / "review" / "display.py").exists():
        found.append("review/display.py exists: build the page's dataclasses in review/pages/ instead")
    return found


def write_tree(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


def test_evolution_and_api_import_nothing_above_them() -> None:
    assert boundary_violations(REPO_ROOT) == []


def test_evolution_modules_import_each_other_without_a_cycle() -> None:
    assert import_cycles(REPO_ROOT) == []


def test_services_import_neither_the_loop_nor_the_tasks() -> None:
    assert layer_violations(REPO_ROOT) == []


def test_services_loop_and_tasks_import_each_other_in_no_circle() -> None:
    assert layer_cycles(REPO_ROOT) == []


def test_only_the_dispatch_module_sends_tasks() -> None:
    assert task_sends(REPO_ROOT) == []


def test_no_module_reads_another_modules_private_names() -> None:
    assert private_reads(REPO_ROOT) == []


def test_views_mark_nothing_safe_themselves() -> None:
    assert markup_in_views(REPO_ROOT) == []


def test_views_stay_thin_and_display_py_stays_gone() -> None:
    assert fat_views(REPO_ROOT) == []


def test_the_thin_views_rule_fires_on_a_tree_that_breaks_it(tmp_path: Path) -> None:
    body = "".join(f"    x{n} = {n}\n" for n in range(VIEW_LINES))  # VIEW_LINES lines: at the bound
    root = write_tree(
        tmp_path,
        {
            "review/display.py": "",
            "review/views/pages.py": (
                "from django.views.decorators.http import require_GET\n\n"
                f'@require_GET\ndef thin(request):\n    """A docstring\n    of two lines."""\n{body}\n'
                f"@access.permission_required()\ndef fat(request):\n{body}    return x0\n\n"
                f"def helper(request):\n{body}    return x0\n\n"
                f"@require_GET\ndef shrinking(request):\n{body}    x = 1\n    return x\n"
            ),
        },
    )

    # thin sits at the bound (its docstring is not counted); helper is no view; shrinking is allowed 32, not 31.
    assert view_lengths(root) == {"pages:thin": VIEW_LINES, "pages:fat": VIEW_LINES + 1, "pages:shrinking": 32}
    assert fat_views(root, {"pages:shrinking": 32}) == [
        f"review/views/pages.py:fat has {VIEW_LINES + 1} lines (at most {VIEW_LINES})",
        "review/display.py exists: build the page's dataclasses in review/pages/ instead",
    ]
    assert fat_views(root, {"pages:shrinking": 31})[1] == "review/views/pages.py:shrinking has 32 lines (at most 31)"


def test_the_rules_fire_on_a_tree_that_breaks_them(tmp_path: Path) -> None:
    root = write_tree(
        tmp_path,
        {
            "evolution/__init__.py": "",
            "evolution/a.py": "from evolution import b\n",
            "evolution/b.py": "import evolution.c\n",
            "evolution/c.py": "from evolution.a import thing\n\ndef later():\n    from review.access import roles\n",
            "evolution/d.py": "def f():\n    from evolution.management.commands.load import Command\n",
            "evolution/e.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from evolution import a\n",
            "evolution/management/__init__.py": "",
            "evolution/management/commands/__init__.py": "",
            "evolution/management/commands/load.py": "from lab import trust\n",
            "review/__init__.py": "",
            "review/access.py": "from evolution.a import _hidden\nfrom evolution import d as dee\n\ndee._step()\n",
            "review/views/page.py": "from django.utils import safestring\n\nsafestring.mark_safe('<b>')\n",
            "api/__init__.py": "",
            "api/views.py": "from evolution import access\n\ndef start():\n    from review import selectors\n",
            "api/permissions.py": "import review.access\n",
        },
    )

    assert boundary_violations(root) == [
        "evolution/c.py:4 imports review.access",
        "evolution/d.py:2 imports evolution.management.commands.load",
        "evolution/management/commands/load.py:1 imports lab",
        "api/permissions.py:1 imports review.access",
        "api/views.py:4 imports review",
    ]
    # a -> b -> c -> a at module level is a cycle; e's import under TYPE_CHECKING is not an edge.
    assert import_cycles(root) == [["evolution.a", "evolution.b", "evolution.c"]]
    assert private_reads(root, ("evolution", "review")) == [
        "review/access.py:1 imports evolution.a._hidden",
        "review/access.py:4 reads evolution.d._step",
    ]
    assert markup_in_views(root) == ["review/views/page.py:3 calls mark_safe"]


def test_the_layer_and_dispatch_rules_fire_on_a_tree_that_breaks_them(tmp_path: Path) -> None:
    root = write_tree(
        tmp_path,
        {
            "evolution/__init__.py": "",
            "evolution/dispatch.py": "from celery import current_app\n\ndef send():\n    current_app.send_task('a')\n",
            "evolution/services/__init__.py": "",
            "evolution/services/records.py": (
                "from evolution.loop.lifecycle import run_pause\n"
                "from evolution.services import snapshots\n\n"
                "def later():\n    from evolution import tasks\n    tasks.run_advance.delay(1)\n"
            ),
            "evolution/services/snapshots.py": "from evolution import dispatch\n",
            "evolution/loop/__init__.py": "",
            "evolution/loop/lifecycle.py": "def pause():\n    from evolution.services import records\n",
            "evolution/loop/steps.py": "def go(task):\n    task.apply_async((1,), countdown=2)\n",
            "evolution/tasks.py": "from evolution.loop import lifecycle, steps\n",
            "review/__init__.py": "",
            "review/views.py": "def approve(task):\n    task.delay_on_commit(3)\n",
        },
    )

    assert layer_violations(root) == [
        "evolution/services/records.py:1 imports evolution.loop.lifecycle",
        "evolution/services/records.py:5 imports evolution.tasks",
    ]
    # records -> lifecycle at module level, lifecycle -> records inside a function: a circle only lazily.
    assert import_cycles(root) == []
    assert layer_cycles(root) == [["evolution.loop.lifecycle", "evolution.services.records", "evolution.tasks"]]
    assert task_sends(root, ("evolution", "review")) == [
        "evolution/loop/steps.py:2 calls apply_async",
        "evolution/services/records.py:6 calls delay",
        "review/views.py:2 calls delay_on_commit",
    ]
