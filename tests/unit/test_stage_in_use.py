"""`--prune-stages` never removes a stage a running container mounts.

A container is stood in for by a real process in a mount namespace of its own (`unshare -m
--propagation private`) that bind-mounts a stage, as runc mounts a folder spec's stage at
/usr/local/nvidia, and sleeps. Nothing of the kernel is faked: the prune reads the real
/proc/<pid>/mountinfo of every process. Needs root (mount namespaces, mounts, tmpfs).
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpuctk.cdi import stage, stagemounts, stageprune
from gpuctk.cdi.node.driverfiles import DriverFile, DriverFiles

V = "535.309.01"
LIB = f"/usr/lib/x86_64-linux-gnu/libcuda.so.{V}"

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="mount namespaces need root")


def make_driver(root: Path, content: bytes = b"libcuda") -> DriverFiles:
    """One library and one binary under `root` (the library holds `content`)."""
    lib, smi = root / LIB.lstrip("/"), root / "usr/bin/nvidia-smi"
    for path, data in ((lib, content), (smi, b"nvidia-smi")):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    return DriverFiles(
        libraries=(DriverFile(str(lib), LIB, "library", "compute", "libcuda.so.1", "x86_64"),),
        binaries=(DriverFile(str(smi), "/usr/bin/nvidia-smi", "binary", "utility", None, None),),
    )


def upgrade(driver: DriverFiles, content: bytes) -> None:
    """Replace the library by rename, as a package manager does: a new stage name."""
    host = Path(driver.libraries[0].host_path)
    new = host.with_name("new")
    new.write_bytes(content)
    new.rename(host)


class Container:
    """A process in a private mount namespace with `source` bind-mounted at `target`."""

    def __init__(self, source: Path, target: Path) -> None:
        target.mkdir(parents=True, exist_ok=True)
        self.target = target
        script = 'mount --bind -o ro "$1" "$2" && echo ready && exec sleep 600'
        argv = ["unshare", "-m", "--propagation", "private", "sh", "-c", script, "sh"]
        proc = subprocess.Popen(
            [*argv, str(source), str(target)], stdout=subprocess.PIPE, text=True
        )
        self.procs = [proc]
        assert self.procs[0].stdout is not None
        assert self.procs[0].stdout.readline() == "ready\n"
        assert not any(target.iterdir())  # private: the host does not see the mount

    @property
    def pid(self) -> int:
        return self.procs[0].pid

    def join(self) -> None:
        """A second process in the same mount namespace (a container's second process)."""
        self.procs.append(
            subprocess.Popen(["nsenter", f"--target={self.pid}", "--mount", "sleep", "600"])
        )

    def sees(self, rel: str) -> bytes:
        """`rel` under the mount, read in the container's namespace."""
        return (Path(f"/proc/{self.pid}/root") / str(self.target).lstrip("/") / rel).read_bytes()

    def mountinfo_root(self) -> str:
        """The root field of the container's mount of the stage."""
        for _dev, root, point in stagemounts.parse(Path(f"/proc/{self.pid}/mountinfo").read_text()):
            if point == str(self.target):
                return root
        raise AssertionError("no such mount")

    def stop(self) -> None:
        for p in self.procs:
            p.kill()
            p.wait()


@pytest.fixture
def containers() -> Iterator[list[Container]]:
    started: list[Container] = []
    yield started
    for c in started:
        c.stop()


@pytest.fixture
def tmpfs(tmp_path: Path) -> Iterator[Path]:
    """A tmpfs mounted at tmp_path/"stag ing" (another filesystem, a space in its path)."""
    path = tmp_path / "stag ing"
    path.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "mode=0755,size=64m", "gpuctk-test", str(path)],
                   check=True)  # fmt: skip
    yield path
    subprocess.run(["umount", "-l", str(path)], check=True)


def two_stages(tmp_path: Path, staging: Path, said: list[str]) -> tuple[Path, Path, Path]:
    """(old stage, new stage, spec folder): the old stage built before a driver upgrade, the
    new one after, and one spec in the folder that names only the new one."""
    driver = make_driver(tmp_path / "drv", b"old driver" * 100_000)
    old = Path(stage.stage_driver(driver, V, str(staging), said.append))
    upgrade(driver, b"new driver")
    new = Path(stage.stage_driver(driver, V, str(staging), said.append))
    specs = tmp_path / "cdi"
    specs.mkdir()
    (specs / "nvidia.yaml").write_text(f"mounts:\n- hostPath: {new}\n  containerPath: /x\n")
    return old, new, specs


@pytest.mark.parametrize("what", ["the stage", "its lib64"])
def test_a_stage_a_running_container_mounts_survives_the_prune(
    tmp_path: Path, containers: list[Container], what: str
) -> None:
    said: list[str] = []
    staging = tmp_path / "staging"
    old, new, specs = two_stages(tmp_path, staging, said)
    source = old if what == "the stage" else old / "lib64"
    c = Container(source, tmp_path / "ctr/usr/local/nvidia")
    containers.append(c)
    c.join()  # two processes, one namespace: counted once
    rel = f"lib64/libcuda.so.{V}" if what == "the stage" else f"libcuda.so.{V}"
    assert c.sees(rel) == b"old driver" * 100_000
    said.clear()
    assert stageprune.prune_stages(str(staging), str(new), (str(specs),), said.append) == []
    assert said == [
        f"kept {old}: no spec names it, but 1 mount namespace(s) (running containers) mount "
        "it; a later --prune-stages removes it"
    ]
    assert (old / f"lib64/libcuda.so.{V}").read_bytes() == b"old driver" * 100_000
    assert c.sees(rel) == b"old driver" * 100_000  # the container's files are all there
    assert (new / "bin/nvidia-smi").is_file()
    c.stop()
    said.clear()
    assert stageprune.prune_stages(str(staging), str(new), (str(specs),), said.append) == [str(old)]
    assert said == [f"removed {old}: no CDI spec in {specs} names it"]
    assert sorted(staging.iterdir()) == [new]


def test_a_staging_dir_on_its_own_filesystem(
    tmp_path: Path, tmpfs: Path, containers: list[Container]
) -> None:
    """The staging dir is a tmpfs: the files are copied (the MiB reported), and the container's
    mount reads `/<stage>` as its root, not the host path: the prune still finds it."""
    said: list[str] = []
    old, new, specs = two_stages(tmp_path, tmpfs, said)
    assert said[0] == (
        f"driver staged in {old}: 0 hard-linked, 2 copied (1 MiB: another filesystem), 2 links"
    )
    c = Container(old, tmp_path / "ctr/usr/local/nvidia")
    containers.append(c)
    assert c.mountinfo_root() == f"/{old.name}"
    said.clear()
    assert stageprune.prune_stages(str(tmpfs), str(new), (str(specs),), said.append) == []
    assert (old / f"lib64/libcuda.so.{V}").is_file() and said[0].startswith(f"kept {old}:")
    c.stop()
    assert stageprune.prune_stages(str(tmpfs), str(new), (str(specs),), said.append) == [str(old)]
    # what is left: the new stage and the record of what it copied (gpuctk.cdi.stage)
    assert sorted(p.name for p in tmpfs.iterdir()) == [f".{new.name}.sources", new.name]


def test_only_the_plans_files_are_copied(tmp_path: Path, tmpfs: Path) -> None:
    """Across filesystems the stage is the plan: its files, and links, nothing else from the
    driver's folders."""
    driver = make_driver(tmp_path / "drv")
    (tmp_path / "drv/usr/bin/nvidia-installer").write_bytes(b"not in the plan")
    folder = Path(stage.stage_driver(driver, V, str(tmpfs)))
    copies, links = stage.plan(driver)
    files = {str(p.relative_to(folder)) for p in folder.rglob("*") if not p.is_dir()}
    own = {getattr(stage, "CACHE", "")}  # a file gpuctk writes in the stage (its ld cache)
    assert set(copies) | set(links) <= files <= set(copies) | set(links) | own
    assert all((folder / link).is_symlink() for link in links)


def test_locate_maps_a_path_to_its_filesystem() -> None:
    table = stagemounts.parse(
        "1 0 8:1 / / rw - ext4 /dev/sda1 rw\n"
        "2 1 0:40 / /var/lib/gpuctk rw - tmpfs none rw\n"
        "3 1 8:1 /srv/st\\040x /mnt/st\\040x rw - ext4 /dev/sda1 rw\n"
        "4 2 0:41 / /var/lib/gpuctk rw - tmpfs none rw\n"  # stacked on 2: the top one counts
        "garbage\n"
    )
    assert stagemounts.locate("/etc/cdi", table) == ("8:1", "/etc/cdi")
    assert stagemounts.locate("/var/lib/gpuctk/driver/s", table) == ("0:41", "/driver/s")
    assert stagemounts.locate("/var/lib/gpuctkx", table) == ("8:1", "/var/lib/gpuctkx")
    assert stagemounts.locate("/mnt/st x/s", table) == ("8:1", "/srv/st x/s")
    assert stagemounts.locate("relative", table) is None


def test_a_table_that_cannot_be_searched_whole_keeps_every_stage(tmp_path: Path) -> None:
    found, note = stagemounts.mounted([str(tmp_path)], cap=64)
    assert found == {str(tmp_path): 0} and "mountinfo" in note
    # and through the prune: the unnamed stage stays, and the line says why
    staging = tmp_path / "staging"
    (staging / f"{V}-{'a' * 16}").mkdir(parents=True)
    said: list[str] = []
    assert stageprune.prune_stages(str(staging), "", (), said.append, proc=str(tmp_path)) == []
    assert said == [f"kept every stage no spec names: cannot read {tmp_path}/self/mountinfo whole"]


def test_more_named_stages_than_kept_are_listed(tmp_path: Path) -> None:
    staging, specs = tmp_path / "staging", tmp_path / "cdi"
    specs.mkdir()
    names = [staging / f"{V}-{c * 16}" for c in "abcd"]
    for n in names:
        n.mkdir(parents=True)
    for n in names[1:]:
        (specs / f"{n.name}.json").write_text(f'{{"hostPath": "{n}"}}')
    said: list[str] = []
    assert stageprune.prune_stages(str(staging), str(names[0]), (str(specs),), said.append) == []
    assert len(said) == 1 and said[0].startswith(
        f"warning: 3 older stages kept in {staging} besides the current one (over 2; each pins "
        "a driver's files on disk): "
    )
    assert f"{names[1]} (named by {specs}/{names[1].name}.json)" in said[0]
