"""Discovery through NVML: the real machine as a Machine record.

Two layers. `NvmlAdapter` is the one place that touches NVML: a thin facade, one method per
NVML query, that raises `NvmlCallError(function, code)` and decides nothing. `read_machine`
holds the policy (what an unsupported query means, which MIG slots are empty) and turns NVML
failures into one-line `gpuctk.errors.NvmlError`s that say what to do. `PynvmlAdapter`
(gpuctk.cdi.node.nvmlbindings) is the production adapter over the official bindings (`pynvml`
from nvidia-ml-py); it is imported only when NVML is read, so that `import gpuctk.cdi.node.nvml`
stays cheap. The tests drive it with a fake libnvidia-ml.so.1.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any, Protocol, TypeVar

from gpuctk.cdi.node.machine import Gpu, Machine, MigDevice
from gpuctk.cdi.node.profile import mig_profile_name
from gpuctk.errors import NvmlError
from gpuctk.records import record, replace

LIBRARY_NAME = "libnvidia-ml.so.1"
T = TypeVar("T")

# NVML return codes (nvml.h) that discovery tells apart.
UNINITIALIZED = 1
NOT_SUPPORTED = 3
NO_PERMISSION = 4
NOT_FOUND = 6
DRIVER_NOT_LOADED = 9
LIBRARY_NOT_FOUND = 12
FUNCTION_NOT_FOUND = 13
CORRUPTED_INFOROM = 14
GPU_IS_LOST = 15
RESET_REQUIRED = 16
LIB_RM_VERSION_MISMATCH = 18

# nvmlDeviceArchitecture_t values (NVML_DEVICE_ARCH_*).
ARCHITECTURES: dict[int, str] = {
    2: "kepler", 3: "maxwell", 4: "pascal", 5: "volta", 6: "turing",
    7: "ampere", 8: "ada", 9: "hopper", 10: "blackwell"
}  # fmt: skip

_OPTIONAL = (NOT_SUPPORTED, FUNCTION_NOT_FOUND)  # the answer is "unknown", not a failure


class LibraryNotFound(NvmlError):
    """No NVML library by the default name: gpuctk.cdi.discover then looks elsewhere."""


class NvmlCallError(Exception):
    """An NVML call returned `code` (an NVML_ERROR_* value)."""

    def __init__(self, function: str, code: int, text: str = "") -> None:
        super().__init__(f"{function}: {text or 'NVML error'} ({code})")
        self.function = function
        self.code = code
        self.text = text


@record
class MigAttributes:
    """What nvmlDeviceGetAttributes says about a MIG device."""

    gi_slices: int
    ci_slices: int
    memory_mib: int


class NvmlAdapter(Protocol):
    """The NVML queries discovery needs. Handles are opaque; errors are NvmlCallError."""

    def init(self) -> None: ...
    def shutdown(self) -> None: ...
    def driver_version(self) -> str: ...
    def cuda_driver_version(self) -> int: ...  # 12020 for CUDA 12.2
    def device_count(self) -> int: ...
    def device_handle(self, index: int) -> object: ...
    def index(self, device: object) -> int: ...
    def minor_number(self, device: object) -> int: ...
    def uuid(self, device: object) -> str: ...
    def pci_bus_id(self, device: object) -> str: ...  # NVML's busId, as returned
    def name(self, device: object) -> str: ...
    def architecture(self, device: object) -> int: ...
    def compute_capability(self, device: object) -> tuple[int, int]: ...
    def memory_total(self, device: object) -> int: ...  # bytes
    def numa_node(self, device: object) -> int: ...
    def mig_mode(self, device: object) -> int: ...  # current mode: 1 enabled
    def max_mig_device_count(self, device: object) -> int: ...
    def mig_device_handle(self, device: object, index: int) -> object: ...
    def gpu_instance_id(self, mig: object) -> int: ...
    def compute_instance_id(self, mig: object) -> int: ...
    def mig_attributes(self, mig: object) -> MigAttributes: ...
    def persistence_mode(self, device: object) -> int: ...  # 1 enabled


def discover(library_path: str | None = None) -> Machine:
    """Read the machine through NVML, loading `library_path` (default libnvidia-ml.so.1)."""
    from gpuctk.cdi.node.nvmlbindings import PynvmlAdapter

    return discover_with(PynvmlAdapter(library_path), library_path or LIBRARY_NAME)


def discover_with(adapter: NvmlAdapter, library: str = LIBRARY_NAME) -> Machine:
    """Initialise NVML through `adapter`, read the machine, and always shut NVML down."""
    return _session(adapter, library, read_machine)


def survey(library_path: str | None = None) -> tuple[Machine, tuple[bool | None, ...]]:
    """`discover`, and each GPU's persistence mode (in GPU order; None: NVML cannot tell), in
    one NVML session: what `gpuctk doctor` reads. Persistence mode is the kernel driver's
    state, whoever turned it on (nvidia-persistenced, `nvidia-smi -pm 1`)."""
    from gpuctk.cdi.node.nvmlbindings import PynvmlAdapter

    return survey_with(PynvmlAdapter(library_path), library_path or LIBRARY_NAME)


def survey_with(
    adapter: NvmlAdapter, library: str = LIBRARY_NAME
) -> tuple[Machine, tuple[bool | None, ...]]:
    def read(a: NvmlAdapter) -> tuple[Machine, tuple[bool | None, ...]]:
        machine = read_machine(a)
        return machine, tuple(_persistence(a, position) for position in range(len(machine.gpus)))

    return _session(adapter, library, read)


def _persistence(adapter: NvmlAdapter, position: int) -> bool | None:
    try:
        return adapter.persistence_mode(adapter.device_handle(position)) == 1
    except NvmlCallError:
        return None  # unknown: the caller looks elsewhere


def _session(adapter: NvmlAdapter, library: str, read: Callable[[NvmlAdapter], T]) -> T:
    """Initialise NVML through `adapter`, `read`, and always shut NVML down."""
    try:
        adapter.init()
    except NvmlCallError as exc:
        raise nvml_error(exc, library=library) from None
    try:
        return read(adapter)
    finally:
        with contextlib.suppress(NvmlCallError):
            adapter.shutdown()  # a failure here changes nothing: the answer or the error stands


def read_machine(adapter: NvmlAdapter) -> Machine:
    """The Machine an initialised NVML describes (NvmlError on any failed query)."""
    try:
        driver = adapter.driver_version()
        cuda = adapter.cuda_driver_version()
        count = adapter.device_count()
    except NvmlCallError as exc:
        raise nvml_error(exc) from None
    gpus = tuple(_read_gpu(adapter, i) for i in range(count))
    return Machine(driver_version=driver, cuda_driver_version=cuda_version_str(cuda), gpus=gpus)


def cuda_version_str(version: int) -> str:
    """NVML's CUDA driver version integer as text: 12020 -> "12.2"."""
    return f"{version // 1000}.{version % 1000 // 10}"


def architecture_name(arch: int) -> str:
    return ARCHITECTURES.get(arch, "unknown")


def normalize_bus_id(bus_id: str) -> str:
    """NVML busId in its 8-digit-domain form, lower case: "0000:18:00.0" -> "00000000:18:00.0"."""
    domain, sep, rest = bus_id.strip().lower().partition(":")
    return f"{int(domain, 16):08x}:{rest}" if sep and rest.count(":") == 1 else bus_id.lower()


def _optional(query: Any, device: object) -> int | None:
    try:
        value = int(query(device))
    except NvmlCallError as exc:
        if exc.code in _OPTIONAL:
            return None
        raise
    return value


def _read_gpu(adapter: NvmlAdapter, position: int) -> Gpu:
    try:
        handle = adapter.device_handle(position)
        index = adapter.index(handle)
        numa = _optional(adapter.numa_node, handle)
        mig_mode = _optional(adapter.mig_mode, handle)
        gpu = Gpu(
            index=index,
            minor=adapter.minor_number(handle),
            uuid=adapter.uuid(handle),
            pci_bus_id=normalize_bus_id(adapter.pci_bus_id(handle)),
            name=adapter.name(handle),
            architecture=architecture_name(adapter.architecture(handle)),
            compute_capability=adapter.compute_capability(handle),
            memory_mib=adapter.memory_total(handle) // 2**20,
            numa_node=None if numa is None or numa < 0 else numa,
            mig_enabled=mig_mode == 1,
        )
    except NvmlCallError as exc:
        raise nvml_error(exc, where=f"GPU {position}") from None
    if not gpu.mig_enabled:
        return gpu
    migs = tuple(_read_migs(adapter, handle, index))
    return replace(gpu, mig_devices=migs)


def _read_migs(adapter: NvmlAdapter, handle: object, parent: int) -> list[MigDevice]:
    try:
        slots = adapter.max_mig_device_count(handle)
    except NvmlCallError as exc:
        raise nvml_error(exc, where=f"GPU {parent}") from None
    found = []
    for slot in range(slots):
        try:
            mig = adapter.mig_device_handle(handle, slot)
        except NvmlCallError as exc:
            if exc.code == NOT_FOUND:
                continue  # an empty slot: no MIG device there
            raise nvml_error(exc, where=f"GPU {parent} MIG slot {slot}") from None
        try:
            attrs = adapter.mig_attributes(mig)
            found.append(
                MigDevice(
                    parent_index=parent,
                    index=slot,
                    gi=adapter.gpu_instance_id(mig),
                    ci=adapter.compute_instance_id(mig),
                    uuid=adapter.uuid(mig),
                    profile=mig_profile_name(attrs.gi_slices, attrs.ci_slices, attrs.memory_mib),
                    memory_mib=attrs.memory_mib,
                )
            )
        except NvmlCallError as exc:
            raise nvml_error(exc, where=f"GPU {parent} MIG device {slot}") from None
    return found


def nvml_error(exc: NvmlCallError, *, where: str = "", library: str = LIBRARY_NAME) -> NvmlError:
    """One line for the user: what failed and what to do about it."""
    fn, code, at = exc.function, exc.code, f" ({where})" if where else ""
    if code == LIBRARY_NOT_FOUND and library == LIBRARY_NAME:
        return LibraryNotFound(
            f"NVML library {LIBRARY_NAME} not found: is the NVIDIA driver installed? use "
            "--driver-root for a containerised driver, or --nvml-library PATH"
        )
    if code == LIBRARY_NOT_FOUND:
        return NvmlError(
            f"NVML library {library} cannot be loaded ({exc.text or 'not found'}): "
            "check --nvml-library or --driver-root"
        )
    if code == FUNCTION_NOT_FOUND and fn in ("nvmlInit", "nvmlInitWithFlags"):
        return NvmlError(f"{library} has no {fn}: it is not the NVML library (libnvidia-ml.so.1)")
    messages = {
        DRIVER_NOT_LOADED: "NVIDIA driver not loaded (NVML init failed): load the kernel module "
        "(modprobe nvidia) and check dmesg; on a node without GPUs use --simulate PROFILE",
        NO_PERMISSION: f"insufficient permissions for NVML {fn}{at}: run as root or give this "
        "user access to /dev/nvidiactl and /dev/nvidia*",
        GPU_IS_LOST: f"GPU lost during NVML {fn}{at}: it fell off the bus; check dmesg for "
        "Xid errors and reset the GPU or reboot the node",
        RESET_REQUIRED: f"GPU needs a reset{at} (NVML {fn}): reset it (nvidia-smi -r) or reboot",
        CORRUPTED_INFOROM: f"GPU infoROM is corrupted{at} (NVML {fn}): contact the vendor",
        FUNCTION_NOT_FOUND: f"NVML library lacks {fn}: the NVIDIA driver is too old for gpuctk; "
        "upgrade to driver 450 or later",
        LIB_RM_VERSION_MISMATCH: "NVML library and NVIDIA kernel module versions differ "
        "(driver upgraded without a reboot?): reboot or reload the nvidia modules",
        NOT_SUPPORTED: f"NVML {fn} is not supported{at}: this GPU or driver cannot report it; "
        "upgrade the driver or leave this GPU out with --device-id",
        UNINITIALIZED: f"NVML {fn}{at} called before NVML was initialised (a gpuctk bug)",
    }
    text = messages.get(code)
    if text is None:
        text = (
            f"NVML {fn} failed{at}: {exc.text or 'unknown error'} (NVML error {code}); "
            "check the driver with nvidia-smi"
        )
    return NvmlError(text)
