"""NVML through NVIDIA's official Python bindings (`pynvml` from nvidia-ml-py): `PynvmlAdapter`.

The production NvmlAdapter of gpuctk.cdi.node.nvml. It loads the library that gpuctk chose
(`--nvml-library`, one found by gpuctk.cdi.discover.load_nvml, else libnvidia-ml.so.1 through
the loader's own search), not whichever pynvml would find. Each method is one NVML call; a
failed call raises NvmlCallError with NVML's code and text, and what that means is decided in
gpuctk.cdi.node.nvml. pynvml is imported on the first call, without the `ctypes.util` it imports
and never uses.
"""

from __future__ import annotations

from typing import Any

from gpuctk.cdi.node.nvml import LIBRARY_NAME, LIBRARY_NOT_FOUND, MigAttributes, NvmlCallError


def _pynvml() -> Any:
    """The pynvml module, imported without `ctypes.util`.

    pynvml does `from ctypes.util import find_library` at import and never calls it; importing
    ctypes.util pulls in subprocess, shutil, tempfile, bz2, lzma and random (a twentieth of
    the generator's budget). A stand-in module whose `find_library` loads the real one on
    first use serves the import and is removed from sys.modules at once, so any other importer
    of ctypes.util gets the real module.
    """
    import sys

    module = sys.modules.get("pynvml")
    if module is not None:
        return module
    if "ctypes.util" in sys.modules:
        import pynvml

        return pynvml
    import types

    def find_library(name: str) -> str | None:
        sys.modules.pop("ctypes.util", None)
        from ctypes import util

        return util.find_library(name)

    stand_in = types.ModuleType(
        "ctypes.util", "gpuctk's stand-in, see gpuctk.cdi.node.nvmlbindings"
    )
    stand_in.find_library = find_library  # type: ignore[attr-defined]
    sys.modules["ctypes.util"] = stand_in
    try:
        import pynvml
    finally:
        if sys.modules.get("ctypes.util") is stand_in:
            del sys.modules["ctypes.util"]
    return pynvml


class PynvmlAdapter:
    """NvmlAdapter over pynvml, with the library loaded from a path of our choosing."""

    def __init__(self, library_path: str | None = None) -> None:
        self.library_path = library_path or LIBRARY_NAME

    def _call(self, function: str, *args: Any) -> Any:
        pynvml = _pynvml()
        try:
            return getattr(pynvml, function)(*args)
        except pynvml.NVMLError as exc:
            raise NvmlCallError(function, int(exc.value), _error_text(exc)) from None

    def init(self) -> None:
        import ctypes

        pynvml = _pynvml()
        try:
            lib = ctypes.CDLL(self.library_path)
        except OSError as exc:
            raise NvmlCallError("dlopen", LIBRARY_NOT_FOUND, str(exc)) from None
        with pynvml.libLoadLock:
            pynvml.nvmlLib = lib
            pynvml._nvmlGetFunctionPointer_cache.clear()  # pointers into a previous library
        self._call("nvmlInitWithFlags", 0)

    def shutdown(self) -> None:
        self._call("nvmlShutdown")

    def driver_version(self) -> str:
        return str(self._call("nvmlSystemGetDriverVersion"))

    def cuda_driver_version(self) -> int:
        return int(self._call("nvmlSystemGetCudaDriverVersion"))

    def device_count(self) -> int:
        return int(self._call("nvmlDeviceGetCount"))

    def device_handle(self, index: int) -> object:
        return self._call("nvmlDeviceGetHandleByIndex", index)

    def index(self, device: object) -> int:
        return int(self._call("nvmlDeviceGetIndex", device))

    def minor_number(self, device: object) -> int:
        return int(self._call("nvmlDeviceGetMinorNumber", device))

    def uuid(self, device: object) -> str:
        return str(self._call("nvmlDeviceGetUUID", device))

    def pci_bus_id(self, device: object) -> str:
        info = self._call("nvmlDeviceGetPciInfo", device)
        bus_id = info.busId or info.busIdLegacy
        return bus_id.decode() if isinstance(bus_id, bytes) else str(bus_id)

    def name(self, device: object) -> str:
        return str(self._call("nvmlDeviceGetName", device))

    def architecture(self, device: object) -> int:
        return int(self._call("nvmlDeviceGetArchitecture", device))

    def compute_capability(self, device: object) -> tuple[int, int]:
        major, minor = self._call("nvmlDeviceGetCudaComputeCapability", device)
        return int(major), int(minor)

    def memory_total(self, device: object) -> int:
        return int(self._call("nvmlDeviceGetMemoryInfo", device).total)

    def numa_node(self, device: object) -> int:
        return int(self._call("nvmlDeviceGetNumaNodeId", device))

    def mig_mode(self, device: object) -> int:
        current, _pending = self._call("nvmlDeviceGetMigMode", device)
        return int(current)

    def max_mig_device_count(self, device: object) -> int:
        return int(self._call("nvmlDeviceGetMaxMigDeviceCount", device))

    def mig_device_handle(self, device: object, index: int) -> object:
        return self._call("nvmlDeviceGetMigDeviceHandleByIndex", device, index)

    def gpu_instance_id(self, mig: object) -> int:
        return int(self._call("nvmlDeviceGetGpuInstanceId", mig))

    def compute_instance_id(self, mig: object) -> int:
        return int(self._call("nvmlDeviceGetComputeInstanceId", mig))

    def persistence_mode(self, device: object) -> int:
        return int(self._call("nvmlDeviceGetPersistenceMode", device))

    def mig_attributes(self, mig: object) -> MigAttributes:
        a = self._call("nvmlDeviceGetAttributes", mig)
        return MigAttributes(
            int(a.gpuInstanceSliceCount), int(a.computeInstanceSliceCount), int(a.memorySizeMB)
        )


def _error_text(exc: Exception) -> str:
    try:
        return str(exc)  # pynvml asks the library's nvmlErrorString for unknown codes
    except Exception:
        return ""
