"""Imports run one way, down the layers (docs/architecture.md), read from every module's source: model at the
bottom imports none of the service's packages, storage imports only model, a storage backend none of another
backend (what both use lives in storage/ itself), collector and detectors see storage only through its ports,
migrations restate what they need, only the shell imports the shell, and of the shell only its wiring
(tailwatch.compose) names a backend."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("model", "collector", "storage", "detectors", "migrations", "tailwatch")
# Shipped beside the service's packages, so held to the production rules that are not about layers.
PRODUCTION = (*PACKAGES, "simulator")
BACKENDS = ("storage.duckdb", "storage.clickhouse")
WIRING = "tailwatch.compose"


def package_of(name: str) -> str:
    return name.partition(".")[0]


def backend_of(name: str) -> str | None:
    return next((b for b in BACKENDS if name == b or name.startswith(b + ".")), None)


def imported(tree: ast.Module, module: str, is_package: bool) -> Iterator[tuple[int, str]]:
    """(line, dotted name) of every import in the module, inside functions too. `from a.b import c` gives
    `a.b.c`, since `c` may be a module; a relative import is resolved against `module`."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                parts = module.split(".") if is_package else module.split(".")[:-1]
                base = ".".join(parts[: len(parts) - node.level + 1] + ([node.module] if node.module else []))
            else:
                base = node.module or ""
            for alias in node.names:
                yield node.lineno, base if alias.name == "*" else f"{base}.{alias.name}"


def broken_rule(importer: str, name: str) -> str | None:
    """The rule `importer` breaks by importing `name`, or None."""
    layer, target = package_of(importer), package_of(name)
    own, other = backend_of(importer), backend_of(name)
    if own is not None and other is not None and own != other:
        return f"{own} imports nothing of another backend: what both use lives in storage/"
    if layer == "tailwatch" and other is not None and importer != WIRING:
        return f"of the shell only {WIRING} names a backend; the rest sees storage through storage.ports"
    if target not in PACKAGES or target == layer:
        return None
    if layer == "model":
        return "model imports none of the service's packages"
    if layer == "storage" and target != "model":
        return "storage imports only model and storage"
    if layer in ("collector", "detectors") and target == "storage" and not _through_ports(name):
        return f"{layer} sees storage only through storage.ports"
    if target == "tailwatch":
        return "nothing outside tailwatch imports tailwatch"
    if layer == "migrations" and target in ("collector", "detectors"):
        return "migrations import none of collector, detectors or tailwatch"
    return None


def _through_ports(name: str) -> bool:
    return name == "storage.ports" or name.startswith("storage.ports.")


def violations(source: str, path: str, module: str, is_package: bool = False) -> list[str]:
    tree = ast.parse(source, path)
    found = []
    for line, name in imported(tree, module, is_package):
        rule = broken_rule(module, name)
        if rule is not None:
            found.append(f"{path}:{line} imports {name}: {rule}")
    return found


def modules(packages: tuple[str, ...] = PACKAGES) -> Iterator[tuple[Path, str, bool]]:
    """(file, dotted module name, whether it is a package's __init__) of every module of the packages."""
    for package in packages:
        for path in sorted((ROOT / package).rglob("*.py")):
            parts = path.relative_to(ROOT).with_suffix("").parts
            is_package = parts[-1] == "__init__"
            yield path, ".".join(parts[:-1] if is_package else parts), is_package


def test_every_module_imports_only_the_layers_its_own_may_import() -> None:
    read = list(modules())
    # A wrong root or an emptied package would make the rule hold over nothing.
    assert {package_of(module) for _, module, _ in read} == set(PACKAGES)
    found = [
        v
        for path, module, is_package in read
        for v in violations(path.read_text(), str(path.relative_to(ROOT)), module, is_package)
    ]
    assert not found, "imports that run back up the layers:\n" + "\n".join(found)


def test_the_rule_names_the_file_and_import_of_each_planted_violation() -> None:
    # One function-level import back up the layers, below two that are allowed.
    storage = (
        "import pyarrow as pa\nfrom model.columns import SPAN_COLUMNS\n\n\ndef f():\n    from collector.x import Y\n"
    )
    assert violations(storage, "storage/spool.py", "storage.spool") == [
        "storage/spool.py:6 imports collector.x.Y: storage imports only model and storage"
    ]
    assert violations("import storage.duckdb\n", "model/columns.py", "model.columns") == [
        "model/columns.py:1 imports storage.duckdb: model imports none of the service's packages"
    ]
    detectors = "from storage.ports import Window\nfrom storage import ports\nfrom storage.duckdb.reads import R\n"
    assert violations(detectors, "detectors/x.py", "detectors.x") == [
        "detectors/x.py:3 imports storage.duckdb.reads.R: detectors sees storage only through storage.ports"
    ]
    assert violations("import storage\n", "collector/x.py", "collector.x") == [
        "collector/x.py:1 imports storage: collector sees storage only through storage.ports"
    ]
    assert violations("from tailwatch.settings import Settings\n", "collector/x.py", "collector.x") == [
        "collector/x.py:1 imports tailwatch.settings.Settings: nothing outside tailwatch imports tailwatch"
    ]
    assert violations("from detectors import registry\n", "migrations/versions/x.py", "migrations.versions.x") == [
        "migrations/versions/x.py:1 imports detectors.registry: migrations import none of collector, detectors or "
        "tailwatch"
    ]
    clickhouse = "from storage.span_layout import SPAN_ROWS\nfrom storage.duckdb.writer import WriterMetrics\n"
    assert violations(clickhouse, "storage/clickhouse/writer.py", "storage.clickhouse.writer") == [
        "storage/clickhouse/writer.py:2 imports storage.duckdb.writer.WriterMetrics: storage.clickhouse imports "
        "nothing of another backend: what both use lives in storage/"
    ]
    assert violations("from ..clickhouse import schema\n", "storage/duckdb/x.py", "storage.duckdb.x") == [
        "storage/duckdb/x.py:1 imports storage.clickhouse.schema: storage.duckdb imports nothing of another backend: "
        "what both use lives in storage/"
    ]
    shell = "from storage.ports import Storage\n\n\ndef f():\n    from storage.duckdb.backend import DuckDBStorage\n"
    assert violations(shell, "tailwatch/service.py", "tailwatch.service") == [
        "tailwatch/service.py:5 imports storage.duckdb.backend.DuckDBStorage: of the shell only tailwatch.compose "
        "names a backend; the rest sees storage through storage.ports"
    ]
    assert violations("from storage import clickhouse\n", "tailwatch/cli.py", "tailwatch.cli") == [
        "tailwatch/cli.py:1 imports storage.clickhouse: of the shell only tailwatch.compose names a backend; the rest "
        "sees storage through storage.ports"
    ]
    # Relative imports are resolved against the module: within its own package they are allowed.
    relative = "from ..ports import SpanSink\nfrom . import reads\nfrom .. import ports\n"
    assert violations(relative, "storage/duckdb/writer.py", "storage.duckdb.writer") == []
    assert violations("from .duckdb import writer\n", "storage/__init__.py", "storage", is_package=True) == []


def test_what_the_shell_and_the_layers_may_import_is_allowed() -> None:
    shell = (
        "from collector.decode import Decoder\nfrom storage.duckdb.backend import B\nfrom detectors import registry\n"
    )
    assert violations(shell, "tailwatch/compose.py", "tailwatch.compose") == []
    layers = "from model.columns import MAX_TIME_NS\nfrom storage.ports import SpanSink\n"
    assert violations(layers, "collector/x.py", "collector.x") == []
    assert violations("from model.attribute_split import MOVES\n", "storage/x.py", "storage.x") == []
    # Shared modules of storage/ may use a backend (the request evaluator runs DuckDB), and a backend them.
    shared = "from storage.duckdb.window_source import S\nfrom storage.clickhouse.client import C\n"
    assert violations(shared, "storage/request_evaluator.py", "storage.request_evaluator") == []
    assert (
        violations("from storage.span_layout import SPAN_ROWS\n", "storage/clickhouse/x.py", "storage.clickhouse.x")
        == []
    )
    assert violations("from model.columns import SPAN_COLUMNS\n", "migrations/x.py", "migrations.x") == []


def asserts(source: str, path: str) -> list[str]:
    """Every `assert` statement in the module, inside functions too."""
    return [
        f"{path}:{node.lineno} asserts: check the condition and raise instead"
        for node in ast.walk(ast.parse(source, path))
        if isinstance(node, ast.Assert)
    ]


def test_no_production_module_uses_assert() -> None:
    # `python -O` strips every assert: a condition the code relies on at run time must raise on its own.
    read = list(modules(PRODUCTION))
    assert {package_of(module) for _, module, _ in read} >= set(PACKAGES)
    found = [a for path, _, _ in read for a in asserts(path.read_text(), str(path.relative_to(ROOT)))]
    assert not found, "asserts in production code:\n" + "\n".join(found)


def test_the_assert_rule_names_each_planted_assert_and_nothing_else() -> None:
    source = (
        '"""assert in a docstring is text."""\n'
        "# assert in a comment is not a statement\n"
        "def f(x):\n"
        "    if x is None:\n"
        '        raise ValueError("x is required")\n'
        '    assert x > 0, "positive"\n'
        "    return [y for y in x if (lambda: y)()]\n"
        "\n"
        "\n"
        "class C:\n"
        "    def g(self):\n"
        "        assert isinstance(self, C)\n"
    )
    assert asserts(source, "storage/x.py") == [
        "storage/x.py:6 asserts: check the condition and raise instead",
        "storage/x.py:12 asserts: check the condition and raise instead",
    ]
