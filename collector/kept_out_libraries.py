"""Libraries installed beside Tailwatch that the DuckDB service and the decoder processes do not load.

pyarrow imports pandas, when it is installed, the first time it converts a Python value (`pa.scalar`,
`pa.array` of a list), only to ask whether that value is a pandas object. pandas is installed because
chDB needs it; the DuckDB service and every decoder process never use it, and each would hold ~33 MiB
more for its whole life. pyarrow treats a pandas that cannot be imported as absent.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from importlib.machinery import ModuleSpec
from types import ModuleType

KEPT_OUT = ("pandas",)


class _KeptOut:
    """An import finder that refuses the named packages, with a sentence saying why."""

    def __init__(self, packages: tuple[str, ...]) -> None:
        self.packages = packages

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> ModuleSpec | None:
        if fullname in self.packages:  # a submodule is only ever looked for after its package
            raise ModuleNotFoundError(
                f"{fullname} is not loaded in Tailwatch's service and decoder processes "
                "(collector/kept_out_libraries.py)",
                name=fullname,
            )
        return None


def keep_out() -> None:
    """Refuse KEPT_OUT from here on in this process. Call it before anything imports them."""
    loaded = [name for name in KEPT_OUT if name in sys.modules]
    if loaded:
        raise RuntimeError(f"already imported, too late to keep out: {', '.join(loaded)}")
    if not any(isinstance(finder, _KeptOut) for finder in sys.meta_path):
        sys.meta_path.insert(0, _KeptOut(KEPT_OUT))
