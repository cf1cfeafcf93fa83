"""Rules the suite keeps about itself, read from its source: every wait has a deadline, and a test whose real
component is missing fails in CI instead of skipping (docs/testing.md, "What the suite promises")."""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

from tailwatch.settings import load_settings

TESTS = Path(__file__).resolve().parent
# Calls that block until something happens elsewhere: without an argument they wait for ever.
WAITS = frozenset(("result", "exception", "join", "wait", "communicate", "get"))
# Calls that block on another process or a socket: they take their deadline as `timeout=`.
NEEDS_TIMEOUT = frozenset(
    ("subprocess.run", "subprocess.check_output", "subprocess.check_call", "urlopen", "socket.create_connection")
)
# The one place a missing component may skip (outside CI only), and the one skip that is not about a component:
# fuzzing is too slow on the mutation tool's rewritten code, and no component is missing there.
SKIP_ALLOWED = {("receivers.py", "require_or_skip"), ("test_fuzz.py", "under_mutation")}


def sources() -> Iterator[tuple[Path, ast.Module]]:
    for path in sorted(TESTS.rglob("*.py")):
        yield path, ast.parse(path.read_text(), str(path))


def called(node: ast.Call) -> tuple[str | None, str | None]:
    """(the method or function's name, that name qualified by a plain module name: `subprocess.run`)."""
    func = node.func
    if isinstance(func, ast.Name):
        return func.id, func.id
    if isinstance(func, ast.Attribute):
        owner = func.value
        return func.attr, f"{owner.id}.{func.attr}" if isinstance(owner, ast.Name) else func.attr
    return None, None


def waits_without_deadline(tree: ast.Module) -> list[int]:
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        name, qualified = called(node)
        keywords = {k.arg for k in node.keywords}
        forever = name in WAITS and not node.args and not keywords
        if forever or (qualified in NEEDS_TIMEOUT and "timeout" not in keywords):
            found.append(node.lineno)
    return found


def skips(tree: ast.Module) -> Iterator[tuple[str, int]]:
    """(the enclosing function or assignment, line) of every skip, importorskip or skip marker."""
    owners: dict[ast.AST, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            for child in ast.walk(node):
                owners.setdefault(child, node.name)
        elif isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name):
            for child in ast.walk(node):
                owners.setdefault(child, node.targets[0].id)
    # `except pytest.skip.Exception` names the exception a skip raises; it skips nothing.
    caught = {n.value for n in ast.walk(tree) if isinstance(n, ast.Attribute) and n.attr == "Exception"}
    for node in ast.walk(tree):
        skipping = isinstance(node, ast.Attribute) and node.attr in ("skip", "skipif", "importorskip", "xfail")
        if skipping and node not in caught:
            yield owners.get(node, "<module>"), node.lineno


def test_every_wait_in_the_suite_has_a_deadline() -> None:
    found = {f"{path.relative_to(TESTS)}:{line}" for path, tree in sources() for line in waits_without_deadline(tree)}
    assert not found, f"waits without a deadline (give each a timeout, e.g. waiting.HANG_GUARD): {sorted(found)}"


def test_a_missing_component_is_skipped_only_through_require_or_skip() -> None:
    found = {
        f"{path.relative_to(TESTS)}:{line} ({owner})"
        for path, tree in sources()
        for owner, line in skips(tree)
        if (path.name, owner) not in SKIP_ALLOWED
    }
    assert not found, f"skips that CI would not turn into failures (use receivers.require_or_skip): {sorted(found)}"


def test_the_rules_see_a_wait_without_a_deadline_and_a_bare_skip() -> None:
    planted = ast.parse(
        "def t(f, thread, proc):\n"
        "    f.result()\n"
        "    thread.join()\n"
        "    subprocess.run(['true'])\n"
        "    f.result(HANG_GUARD)\n"
        "    thread.join(timeout=1)\n"
        "    subprocess.run(['true'], timeout=1)\n"
        "    ', '.join(['a'])\n"
        "    pytest.importorskip('x')\n"
    )
    assert waits_without_deadline(planted) == [2, 3, 4]
    assert list(skips(planted)) == [("t", 9)]


def test_the_check_scripts_set_no_tailwatch_variable_the_service_would_refuse() -> None:
    # Every `tailwatch` a test starts inherits the runner's environment, and an unknown TAILWATCH_* variable
    # stops it with a configuration error: `scripts/test --all` once exported TAILWATCH_TESTS and failed 27 tests.
    root = TESTS.parent
    exported = {
        name: "1"
        for script in (root / "scripts" / "test", root / ".ci" / "run")
        for name in re.findall(r"\b(TAILWATCH_[A-Z0-9_]+)=", script.read_text())
    }
    load_settings(environ=exported)
