"""NVML discovery through the real pynvml and the fake libnvidia-ml.so.1 (tests/fake_nvml)."""

from __future__ import annotations

import ctypes
import ctypes.util
import pickle
import subprocess
import sys
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path

import pytest
from fixtures.fake_nvml import (
    FakeNvmlEnv,
    build_fake_nvml,
    fake_nvml_environ,
    fake_profile_text,
    write_fake_profile,
)

from gpuctk.cdi.node.machine import Machine
from gpuctk.cdi.node.nvml import (
    LIBRARY_NAME,
    architecture_name,
    cuda_version_str,
    discover,
    normalize_bus_id,
)
from gpuctk.cdi.node.nvmlbindings import PynvmlAdapter
from gpuctk.cdi.node.profile import available_profiles, load_profile
from gpuctk.errors import EXIT_NVML, NvmlError
from gpuctk.records import replace

SCRIPT = """
import pickle, sys
from gpuctk.errors import GpuctkError
from gpuctk.cdi.node.nvml import discover
try:
    machine = discover(sys.argv[1] or None)
except GpuctkError as exc:
    print(exc, file=sys.stderr)
    sys.exit(exc.exit_code)
sys.stdout.write(pickle.dumps(machine).hex())
"""


def run_discover(env: Mapping[str, str], library: str = "") -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", SCRIPT, library],
        env=dict(env),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def discovered(proc: subprocess.CompletedProcess[str]) -> Machine:
    assert proc.returncode == 0, proc.stderr
    machine = pickle.loads(bytes.fromhex(proc.stdout))
    assert isinstance(machine, Machine)
    return machine


# ---- every shipped profile: NVML through the fake == the profile itself ------------------


@pytest.mark.parametrize("name", available_profiles())
def test_discovery_equals_profile(name: str, fake_nvml_env: FakeNvmlEnv) -> None:
    env = fake_nvml_env(name)
    assert discovered(run_discover(env, env["FAKE_NVML_LIBRARY"])) == load_profile(name)


def test_default_library_name_is_found_on_the_loader_path(fake_nvml_env: FakeNvmlEnv) -> None:
    # no path given: CDLL("libnvidia-ml.so.1") finds the fake through LD_LIBRARY_PATH
    assert discovered(run_discover(fake_nvml_env("l4"))) == load_profile("l4")


def test_no_library_at_all_says_what_to_do(tmp_path: Path) -> None:
    if ctypes.util.find_library("nvidia-ml"):
        pytest.skip("this machine has a real libnvidia-ml")
    env = {"PATH": "/usr/bin:/bin", "LD_LIBRARY_PATH": str(tmp_path)}
    proc = run_discover(env)
    assert proc.returncode == EXIT_NVML
    assert proc.stderr.strip() == (
        f"NVML library {LIBRARY_NAME} not found: is the NVIDIA driver installed? use "
        "--driver-root for a containerised driver, or --nvml-library PATH"
    )


def test_import_does_not_load_pynvml() -> None:
    code = "import sys, gpuctk.cdi.node.nvml; print('pynvml' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_discovery_does_not_import_ctypes_util_and_pynvml_still_finds_libraries(
    fake_nvml_env: FakeNvmlEnv,
) -> None:
    # pynvml imports ctypes.util (subprocess, shutil, tempfile, bz2, lzma: ~5 ms) and never
    # uses it: gpuctk.cdi.node.nvmlbindings serves that import with a stand-in.
    code = (
        "import sys; from gpuctk.cdi.node.nvml import discover; discover(sys.argv[1]);"
        "print(sorted({'ctypes.util', 'subprocess', 'tempfile'} & set(sys.modules)));"
        "import pynvml, ctypes.util; real = ctypes.util.find_library;"
        "print(pynvml.find_library('c') == real('c') is not None, type(real).__module__)"
    )
    env = fake_nvml_env("l4")
    out = subprocess.run(
        [sys.executable, "-c", code, env["FAKE_NVML_LIBRARY"]],
        env=dict(env), capture_output=True, text=True, check=True,
    )  # fmt: skip
    assert out.stdout.split("\n")[:2] == ["[]", "True builtins"]


# ---- in-process discovery (pynvml's global library handle reset around each test) -------

Discover = Callable[..., Machine]


@pytest.fixture
def nvml(
    fake_nvml_lib: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Discover]:
    import pynvml

    saved = pynvml.nvmlLib

    def run(
        profile: str | Machine,
        *,
        init_error: int | None = None,
        fail: Mapping[str, int] | None = None,
        library: str | None = None,
    ) -> Machine:
        path = write_fake_profile(profile, tmp_path / "profile.txt")
        env = fake_nvml_environ(fake_nvml_lib, path, init_error=init_error, fail=fail)
        for key in ("FAKE_NVML_PROFILE", "FAKE_NVML_INIT_ERROR", "FAKE_NVML_FAIL"):
            if key in env:
                monkeypatch.setenv(key, env[key])
            else:
                monkeypatch.delenv(key, raising=False)
        return discover(library or str(fake_nvml_lib))

    yield run
    with pynvml.libLoadLock:
        pynvml.nvmlLib = saved
        pynvml._nvmlGetFunctionPointer_cache.clear()


def nvml_error(run: Callable[[], object]) -> NvmlError:
    with pytest.raises(NvmlError) as info:
        run()
    assert info.value.exit_code == EXIT_NVML
    assert "\n" not in str(info.value)
    return info.value


def test_in_process_equals_profile(nvml: Discover) -> None:
    for name in ("a100-mig", "h100-8"):
        assert nvml(name) == load_profile(name)


def test_numa_not_supported_is_none(nvml: Discover) -> None:
    base = load_profile("h100-8")
    gpus = list(base.gpus)
    gpus[3] = replace(gpus[3], numa_node=None)
    machine = replace(base, gpus=tuple(gpus))
    assert "numa=-" in fake_profile_text(machine)
    got = nvml(machine)
    assert got.gpus[3].numa_node is None
    assert got.gpus[2].numa_node == 0
    assert got == machine


def test_numa_query_missing_from_old_driver_is_none(nvml: Discover) -> None:
    got = nvml("l4", fail={"nvmlDeviceGetNumaNodeId": 13})
    assert got.gpus[0].numa_node is None


def test_empty_mig_slots_are_skipped_and_indices_kept(nvml: Discover) -> None:
    base = load_profile("a100-mig")
    gpu = base.gpus[2]
    migs = tuple(replace(m, index=i) for m, i in zip(gpu.mig_devices, (0, 3, 6), strict=True))
    machine = replace(base, gpus=(*base.gpus[:2], replace(gpu, mig_devices=migs), base.gpus[3]))
    got = nvml(machine)
    assert [m.name for m in got.gpus[2].mig_devices] == ["2:0", "2:3", "2:6"]
    assert got == machine


def test_fake_serves_upper_case_bus_ids(
    fake_nvml_lib: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # real NVML answers "00000000:2A:00.0"; discovery must lower-case it to match the profile
    monkeypatch.setenv("FAKE_NVML_PROFILE", str(write_fake_profile("h100-8", tmp_path / "p")))
    adapter = PynvmlAdapter(str(fake_nvml_lib))
    adapter.init()
    try:
        assert adapter.pci_bus_id(adapter.device_handle(1)) == "00000000:2A:00.0"
    finally:
        adapter.shutdown()


def test_nvml_is_shut_down_after_success_and_failure(nvml: Discover, fake_nvml_lib: Path) -> None:
    lib = ctypes.CDLL(str(fake_nvml_lib))
    count = ctypes.c_uint()
    nvml("l4")
    assert lib.nvmlDeviceGetCount_v2(ctypes.byref(count)) == 1  # NVML_ERROR_UNINITIALIZED
    nvml_error(lambda: nvml("h100-8", fail={"nvmlDeviceGetUUID@2": 15}))
    assert lib.nvmlDeviceGetCount_v2(ctypes.byref(count)) == 1


# ---- errors: one line that says what to do ---------------------------------------------


def test_missing_library_path(nvml: Discover, tmp_path: Path) -> None:
    err = nvml_error(lambda: nvml("l4", library=str(tmp_path / "nope" / LIBRARY_NAME)))
    assert str(tmp_path / "nope") in str(err)
    assert "--nvml-library" in str(err) and "--driver-root" in str(err)


def test_library_that_is_not_nvml(nvml: Discover) -> None:
    err = nvml_error(lambda: nvml("l4", library="libc.so.6"))
    assert "not the NVML library" in str(err)


def test_driver_not_loaded(nvml: Discover) -> None:
    err = nvml_error(lambda: nvml("l4", init_error=9))
    assert "driver not loaded" in str(err)
    assert "modprobe nvidia" in str(err)


def test_profile_file_missing_fails_init(
    nvml: Discover, monkeypatch: pytest.MonkeyPatch, fake_nvml_lib: Path, tmp_path: Path
) -> None:
    monkeypatch.setenv("FAKE_NVML_PROFILE", str(tmp_path / "absent.txt"))
    err = nvml_error(lambda: discover(str(fake_nvml_lib)))
    assert "driver not loaded" in str(err)


def test_driver_library_version_mismatch(nvml: Discover) -> None:
    assert "reboot" in str(nvml_error(lambda: nvml("l4", init_error=18)))


def test_gpu_lost_names_the_gpu(nvml: Discover) -> None:
    err = str(nvml_error(lambda: nvml("h100-8", fail={"nvmlDeviceGetUUID@2": 15})))
    assert "GPU lost" in err and "(GPU 2)" in err and "dmesg" in err


def test_no_permission(nvml: Discover) -> None:
    err = str(nvml_error(lambda: nvml("l4", fail={"nvmlDeviceGetMinorNumber": 4})))
    assert "insufficient permissions" in err and "/dev/nvidia" in err


def test_old_driver_without_mig_calls(nvml: Discover) -> None:
    err = str(nvml_error(lambda: nvml("a100-mig", fail={"nvmlDeviceGetMaxMigDeviceCount": 13})))
    assert "too old" in err and "nvmlDeviceGetMaxMigDeviceCount" in err


def test_unknown_error_on_a_mig_device(nvml: Discover) -> None:
    err = str(nvml_error(lambda: nvml("a100-mig", fail={"nvmlDeviceGetAttributes_v2@3": 999})))
    assert "(GPU 3 MIG device 0)" in err and "nvidia-smi" in err


# ---- small pieces ----------------------------------------------------------------------


def test_cuda_version_text() -> None:
    assert cuda_version_str(12020) == "12.2"
    assert cuda_version_str(11080) == "11.8"
    assert cuda_version_str(12040) == "12.4"


def test_architecture_names() -> None:
    import pynvml

    assert architecture_name(pynvml.NVML_DEVICE_ARCH_HOPPER) == "hopper"
    assert architecture_name(pynvml.NVML_DEVICE_ARCH_ADA) == "ada"
    assert architecture_name(pynvml.NVML_DEVICE_ARCH_BLACKWELL) == "blackwell"
    assert architecture_name(pynvml.NVML_DEVICE_ARCH_UNKNOWN) == "unknown"


def test_bus_id_normalised() -> None:
    assert normalize_bus_id("00000000:2A:00.0") == "00000000:2a:00.0"
    assert normalize_bus_id("0000:2A:00.0") == "00000000:2a:00.0"


def test_fake_build_is_cached(tmp_path: Path) -> None:
    first = build_fake_nvml(tmp_path)
    stamp = first.stat().st_mtime_ns
    assert build_fake_nvml(tmp_path) == first
    assert first.stat().st_mtime_ns == stamp
    assert first.name == LIBRARY_NAME
