"""At run time, `gpuctk runtime` and the engine writers load no cdi or hook module. The static
rule (gpuctk.containerd imports only the spine) is tests/unit/test_layering.py's."""

from __future__ import annotations

import subprocess
import sys


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
