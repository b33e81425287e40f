"""The default spec in engines that apply CDI themselves: every image class x every engine x
every request form, checked with what real applications do (fixtures.appimages: Triton's
`ldconfig -p` lookup, `nvidia-smi` by name, dlopen of libcuda.so.1 and libnvidia-ml.so.1 and
of the development links' names libnvidia-ml.so and libcuda.so, the firmware and config files).

The spec is `gpuctk cdi generate` with no mode flag (the default folder spec) over the Debian
535 driver root and mknod'ed nodes of a simulated L4, with a private staging dir, exactly what
a node's refresh unit writes. The shim never runs here: the engine applies the spec, runc
runs its one hook entry (gpuctk-cdi-hook, handing some images to gpuctk-hook).

    engine         request form
    podman 4.3.1   --device nvidia.com/gpu=0
    containerd 2.1 the CRI container config's CDI devices (as the device plugin's cdi-cri and
                   DRA hand them), and the cdi.k8s.io/ annotation
    containerd 1.7 the CRI CDI devices (enable_cdi)
    docker 28      --device nvidia.com/gpu=0

Each container starts on a fresh copy of its image (the engines' own snapshotters), so nothing
one start writes reaches the next. The controls: the same spec less its hook entry gives the
debian image no driver in `ldconfig -p` and no nvidia-smi on PATH (what these checks would see
with the feature deleted).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tarfile
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from fixtures import appimages, sidengines
from fixtures.appimages import CLASSES
from fixtures.images import ImageError
from fixtures.podman import CdiPodman, generate_spec, private_podman

pytestmark = pytest.mark.integration

SCRIPT = "/bin/gpu-apps"
Runner = Callable[[str, str], str]  # (class name, spec folder name) -> the container's output


def tag(name: str) -> str:
    return f"localhost/gpuctk-matrix-{name}:latest"


class Matrix:
    def __init__(self, work: Path, roots: dict[str, Path], missing: dict[str, str]) -> None:
        self.work = work
        self.roots = roots
        self.missing = missing
        self.specs = {n: work / n / "cdi" for n in ("default", "nohook")}

    def need(self, name: str) -> None:
        if name in self.missing:
            if os.environ.get("GPUCTK_REQUIRE_IMAGES") == "1":
                pytest.fail(self.missing[name])
            pytest.skip(self.missing[name])


@pytest.fixture(scope="module")
def matrix(tmp_path_factory: pytest.TempPathFactory, driver_root: Path) -> Matrix:
    if os.geteuid() != 0:
        pytest.skip("needs root")
    for tool in ("runc", "unshare", "gcc", "ldconfig"):
        if shutil.which(tool) is None:
            pytest.skip(f"needs {tool}")
    work = tmp_path_factory.mktemp("matrix")
    doc = generate_spec(work, driver_root, "l4", "", "default", ("--staging-dir", str(work / "st")))
    bare = json.loads(json.dumps(doc))  # the control: the same spec less its hook entry
    for block in (bare["containerEdits"], *(d["containerEdits"] for d in bare["devices"])):
        block.pop("hooks", None)
    (work / "nohook" / "cdi").mkdir(parents=True)
    (work / "nohook" / "cdi" / "nvidia.json").write_text(json.dumps(bare))
    roots: dict[str, Path] = {}
    missing: dict[str, str] = {}
    for name in CLASSES:
        try:
            roots[name] = appimages.make_root(work, name)
        except ImageError as exc:
            missing[name] = f"cannot build the {name} image: {exc}"
    if "debian" in missing:
        pytest.skip(missing["debian"])
    return Matrix(work, roots, missing)


# ---- podman ---------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def podman(matrix: Matrix) -> Iterator[Runner]:
    if shutil.which("podman") is None:
        pytest.skip("needs podman")
    Path("/run/cdi").mkdir(parents=True, exist_ok=True)
    (matrix.work / "podman").mkdir()
    with private_podman(matrix.work / "podman", tag("base")) as base:
        for name, root in matrix.roots.items():
            tarball = matrix.work / f"{name}.tar"
            with tarfile.open(tarball, "w") as tar:
                tar.add(root, arcname=".")
            changes = [a for e in CLASSES[name].env for a in ("--change", f"ENV {e}")]
            done = subprocess.run([*base, "import", "-q", *changes, str(tarball), tag(name)],
                                  capture_output=True, text=True, check=False)  # fmt: skip
            assert done.returncode == 0, done.stderr
            tarball.unlink()
        engine = CdiPodman(base, matrix.specs, tag("debian"))

        def run(name: str, spec: str) -> str:
            cls = CLASSES[name]
            extra = [*(["--user", cls.user] if cls.user else []),
                     *(["--read-only"] if cls.readonly else [])]  # fmt: skip
            done = engine.run(SCRIPT, spec=spec, image=tag(name), extra=tuple(extra))
            assert done.returncode == 0, done.stdout + done.stderr
            return done.stdout

        yield run


@pytest.mark.parametrize("name", list(CLASSES))
def test_podman_device(matrix: Matrix, podman: Runner, name: str) -> None:
    matrix.need(name)
    appimages.check(name, podman(name, "default"))


def test_podman_control_without_the_hook_entry(matrix: Matrix, podman: Runner) -> None:
    got = appimages.report(podman("debian", "nohook"))
    assert got["TRITON"] == ["none"] and "BIN" not in got, got
    assert "not found" in got["SMI"][0], got


# ---- containerd 2.1, containerd 1.7 (CRI) and docker 28 --------------------------------------


def env_of(name: str) -> dict[str, str]:
    return dict(e.split("=", 1) for e in CLASSES[name].env)


def user_of(name: str) -> tuple[int, int] | None:
    user = CLASSES[name].user
    if not user:
        return None
    uid, _, gid = user.partition(":")
    return int(uid), int(gid)


@pytest.fixture(scope="module", params=["containerd2", "containerd17"])
def cri(request: pytest.FixtureRequest, matrix: Matrix) -> Iterator[Callable[..., str]]:
    kind = request.param
    sidengines.require(kind)
    engine_class = sidengines.Containerd2 if kind == "containerd2" else sidengines.Containerd17
    with engine_class(matrix.work / kind, matrix.specs["default"]) as engine:
        images = {n: engine.import_image(r, f"gpuctk.test/matrix-{n}:1")
                  for n, r in matrix.roots.items()}  # fmt: skip

        def run(name: str, form: str) -> str:
            request = {"cdi_devices": ["nvidia.com/gpu=0"]} if form == "field" else {
                "annotations": {"cdi.k8s.io/gpuctk-test": "nvidia.com/gpu=0"}}  # fmt: skip
            code, out = engine.run(images[name], [SCRIPT], env=env_of(name), user=user_of(name),
                                   readonly=CLASSES[name].readonly, **request)  # fmt: skip
            assert code == 0, out
            return out

        run.kind = kind  # type: ignore[attr-defined]
        yield run


@pytest.mark.parametrize("name", list(CLASSES))
@pytest.mark.parametrize("form", ["field", "annotation"])
def test_cri(matrix: Matrix, cri: Callable[..., str], form: str, name: str) -> None:
    """The CRI's CDI devices field (kubelet 1.28+: the device plugin's cdi-cri, DRA) and the
    cdi.k8s.io/ annotation (older kubelets, the device plugin's cdi-annotations)."""
    matrix.need(name)
    appimages.check(name, cri(name, form))


@pytest.fixture(scope="module")
def docker(matrix: Matrix) -> Iterator[Runner]:
    sidengines.require("docker")
    with sidengines.Docker(matrix.work / "docker", matrix.specs["default"]) as engine:
        images = {n: engine.import_image(r, f"gpuctk.test/matrix-{n}:1")
                  for n, r in matrix.roots.items()}  # fmt: skip

        def run(name: str, spec: str) -> str:
            cls = CLASSES[name]
            extra = [*(["--user", cls.user] if cls.user else []),
                     *(["--read-only"] if cls.readonly else [])]  # fmt: skip
            code, out = engine.run(images[name], [SCRIPT], env=env_of(name),
                                   devices=["nvidia.com/gpu=0"], extra=extra)  # fmt: skip
            assert code == 0, out
            return out

        yield run


@pytest.mark.parametrize("name", list(CLASSES))
def test_docker_device(matrix: Matrix, docker: Runner, name: str) -> None:
    matrix.need(name)
    appimages.check(name, docker(name, "default"))
