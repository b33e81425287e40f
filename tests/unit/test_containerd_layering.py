"""gpuctk.containerd depends only on the spine (gpuctk.errors, gpuctk.fs, gpuctk.cli)."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "containerd-config"
SPINE = {"gpuctk", "gpuctk.errors", "gpuctk.fs", "gpuctk.cli"}


def imported(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
            names |= {f"{node.module}.{alias.name}" for alias in node.names}
    return names


def test_static_imports_stay_on_the_spine() -> None:
    bad = {}
    for path in sorted(PACKAGE.glob("*.py")):
        for name in imported(path):
            if name.split(".")[0] != "gpuctk" or name.startswith("gpuctk.containerd"):
                continue
            if name not in SPINE and ".".join(name.split(".")[:2]) not in SPINE:
                bad[path.name] = name
    assert not bad, bad


def test_runtime_command_loads_no_cdi_or_hook_module() -> None:
    code = (
        "import sys\n"
        "from gpuctk.cli import main\n"
        "try:\n"
        "    main(['runtime', 'runtimeclass'])\n"
        "except SystemExit:\n"
        "    pass\n"
        "import gpuctk.containerd.cli, gpuctk.containerd.containerd, gpuctk.containerd.crio\n"
        "import gpuctk.containerd.docker, gpuctk.containerd.podman\n"
        "print(' '.join(m for m in sys.modules if m.startswith(('gpuctk.cdi', 'gpuctk.hook'))))\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert proc.stdout.splitlines()[-1] == ""
