"""What `pip install .` installs (the Docker image, any non-editable install) holds every module and data file the
service reads. An editable install reads the source tree and hides a package the build leaves out."""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("tailwatch", "model", "collector", "storage", "detectors", "simulator", "migrations")
# Files the service opens at run time beside its modules.
DATA_SUFFIXES = (".sql", ".mako", ".html", ".js", ".css")


def shipped(root: Path) -> set[str]:
    """Every module and data file of the packages in the source tree, as wheel paths."""
    files = set()
    for package in PACKAGES:
        for path in (root / package).rglob("*"):
            if "__pycache__" in path.parts or not path.is_file():
                continue
            if path.suffix == ".py" or path.suffix in DATA_SUFFIXES:
                files.add(path.relative_to(root).as_posix())
    return files


def test_a_built_wheel_holds_every_module_and_data_file_of_the_packages(tmp_path: Path) -> None:
    # From a copy: setuptools also packs what an earlier build left in build/lib and lists in *.egg-info,
    # which would hide a package the configuration loses.
    source = tmp_path / "source"
    left_out = shutil.ignore_patterns(".*", "build", "native", "mutants", "*.egg-info", "*.duckdb*")
    shutil.copytree(ROOT, source, ignore=left_out)
    done = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", str(source), "--no-deps", "-q", "-w", str(tmp_path)],
        capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    [wheel] = tmp_path.glob("tailwatch-*.whl")
    with zipfile.ZipFile(wheel) as built:
        names = set(built.namelist())
    expected = shipped(ROOT)
    assert "storage/duckdb/writer.py" in expected  # the walk found the subpackages
    assert sorted(expected - names) == []
