"""gpuctk: give containers NVIDIA GPUs (CDI generation, a runc shim, an OCI hook)."""

import os as _os
import sys as _sys

__version__ = "0.1.0"

_TOP = _os.path.dirname(_os.path.dirname(_os.path.abspath(__file__)))

if _os.path.isfile(_os.path.join(_TOP, "pyproject.toml")):  # a checkout, not an install

    class _CheckoutFinder:
        """Imported from a source checkout (`python -m gpuctk ...` in its root, where this
        folder shadows any installed gpuctk): finds gpuctk.cdi, gpuctk.hook, ... in their own
        folders, as pyproject.toml's package-dir maps them (read on the first miss)."""

        def __init__(self) -> None:
            self.dirs: dict[str, str] | None = None

        def find_spec(self, name: str, path: object = None, target: object = None) -> object:
            if not name.startswith("gpuctk.") or name.count(".") != 1:
                return None
            if self.dirs is None:
                self.dirs = {}
                with open(_os.path.join(_TOP, "pyproject.toml"), encoding="utf-8") as f:
                    table = f.read().partition("[tool.setuptools.package-dir]\n")[2]
                for line in table.partition("\n[")[0].splitlines():  # "gpuctk.cdi" = "cdi"
                    key, eq, value = (part.strip().strip('"') for part in line.partition("="))
                    if eq and key.startswith("gpuctk"):
                        self.dirs[key] = _os.path.join(_TOP, value)
            folder = self.dirs.get(name)
            init = _os.path.join(folder or "", "__init__.py")
            if folder is None or not _os.path.isfile(init):
                return None
            from importlib.util import spec_from_file_location

            return spec_from_file_location(name, init, submodule_search_locations=[folder])

    _sys.meta_path.append(_CheckoutFinder())  # type: ignore[arg-type]
