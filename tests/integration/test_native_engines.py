"""The engines that apply CDI themselves really do, through fixtures.sidengines.

Each engine (Debian sid's containerd 2.x and dockerd 28, trixie's containerd 1.7, unpacked from
the archive with a private apt configuration, run on private sockets, roots and /run) gets a
spec folder holding one tiny CDI spec: `example.com/dev=one` sets HELLO=cdi and bind-mounts a
host file read-only at /opt/marker. No gpuctk code is on the path: nothing but the engine can
put them in the container.

- containerd 2.x and 1.7 through CRI, as the kubelet asks: the ContainerConfig CDI_devices
  field (DRA, device plugins' cdi-cri), and the `cdi.k8s.io/...` container annotation;
- docker: `--device example.com/dev=one`;
- the same container without the request sees neither (the negative control: with CDI off or
  the request dropped, the positive tests fail).
"""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from fixtures.images import ImageError, build_image
from fixtures.sidengines import Containerd2, Containerd17, Docker, require

pytestmark = pytest.mark.integration

DEVICE = "example.com/dev=one"
ANNOTATION = "cdi.k8s.io/test"
IMAGE = "gpuctk.test/debian:1"
# what the container sees: HELLO, the marker's text, whether the marker can be written
SCRIPT = (
    'echo "HELLO=${HELLO:-unset}"; '
    'if [ -e /opt/marker ]; then echo "MARKER=$(cat /opt/marker)"; else echo MARKER=absent; fi; '
    "if echo x >> /opt/marker; then echo WRITABLE; fi 2>/dev/null"
)
COMMAND = ["/bin/sh", "-c", SCRIPT]


class Cdi:
    """A spec folder with the one spec, and the token its marker file holds."""

    def __init__(self, base: Path) -> None:
        self.token = uuid.uuid4().hex
        self.marker = base / "marker"
        self.marker.write_text(self.token + "\n")
        self.marker.chmod(0o644)
        self.spec_dir = base / "cdi"
        self.spec_dir.mkdir()
        spec = {
            "cdiVersion": "0.5.0",
            "kind": "example.com/dev",
            "devices": [
                {
                    "name": "one",
                    "containerEdits": {
                        "env": ["HELLO=cdi"],
                        "mounts": [
                            {
                                "hostPath": str(self.marker),
                                "containerPath": "/opt/marker",
                                "options": ["ro", "bind"],
                            }
                        ],
                    },
                }
            ],
        }
        (self.spec_dir / "example.json").write_text(json.dumps(spec, indent=1))

    def check_applied(self, code: int, output: str) -> None:
        assert code == 0, output
        lines = output.splitlines()
        assert "HELLO=cdi" in lines, output
        assert f"MARKER={self.token}" in lines, output
        assert "WRITABLE" not in lines, output  # the mount is read-only
        assert self.marker.read_text() == self.token + "\n"

    @staticmethod
    def check_absent(code: int, output: str) -> None:
        assert code == 0, output
        lines = output.splitlines()
        assert "HELLO=unset" in lines, output
        assert "MARKER=absent" in lines, output


@pytest.fixture(scope="module")
def cdi(tmp_path_factory: pytest.TempPathFactory) -> Cdi:
    return Cdi(tmp_path_factory.mktemp("native-cdi"))


@pytest.fixture(scope="module")
def rootfs() -> Path:
    try:
        return build_image("debian")
    except ImageError as exc:
        if os.environ.get("GPUCTK_REQUIRE_IMAGES") == "1":
            pytest.fail(f"cannot build test images: {exc}")
        pytest.skip(f"cannot build test images: {exc}")


@pytest.fixture(scope="module", params=["containerd2", "containerd17"])
def cri_engine(
    request: pytest.FixtureRequest,
    tmp_path_factory: pytest.TempPathFactory,
    cdi: Cdi,
    rootfs: Path,
) -> Iterator[Containerd2 | Containerd17]:
    kind: str = request.param
    require(kind)
    engine_class: type[Containerd2 | Containerd17]
    engine_class = Containerd2 if kind == "containerd2" else Containerd17
    with engine_class(tmp_path_factory.mktemp(kind), cdi.spec_dir) as engine:
        engine.import_image(rootfs, IMAGE)
        yield engine


@pytest.fixture(scope="module")
def docker(tmp_path_factory: pytest.TempPathFactory, cdi: Cdi, rootfs: Path) -> Iterator[Docker]:
    require("docker")
    with Docker(tmp_path_factory.mktemp("docker"), cdi.spec_dir) as engine:
        engine.import_image(rootfs, IMAGE)
        yield engine


def test_cri_cdi_devices_field(cri_engine: Containerd2 | Containerd17, cdi: Cdi) -> None:
    """The kubelet's way (1.28+): the device in ContainerConfig's CDI_devices."""
    cdi.check_applied(*cri_engine.run(IMAGE, COMMAND, cdi_devices=[DEVICE]))


def test_cri_cdi_annotation(cri_engine: Containerd2 | Containerd17, cdi: Cdi) -> None:
    """The device plugin's older way: a `cdi.k8s.io/` container annotation."""
    cdi.check_applied(*cri_engine.run(IMAGE, COMMAND, annotations={ANNOTATION: DEVICE}))


def test_cri_without_device_gets_nothing(cri_engine: Containerd2 | Containerd17) -> None:
    Cdi.check_absent(*cri_engine.run(IMAGE, COMMAND, annotations={"example.com/x": DEVICE}))


def test_docker_device_flag(docker: Docker, cdi: Cdi) -> None:
    cdi.check_applied(*docker.run(IMAGE, COMMAND, devices=[DEVICE]))


def test_docker_without_device_gets_nothing(docker: Docker) -> None:
    Cdi.check_absent(*docker.run(IMAGE, COMMAND))
