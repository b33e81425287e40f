"""Machine facts carried inside a generated spec, for NVIDIA_REQUIRE_* checks at container start.

The shim must not load NVML on the create path, yet `NVIDIA_REQUIRE_CUDA>=12.0` or
`arch=sm_90` need the driver's and the GPUs' facts. CDI annotations would carry them but would
raise the spec's cdiVersion to 0.6.0, which Debian 12's podman 4.3.1 rejects. So the generator
puts them in the `env` of the spec's one gpuctk hook entry: hook env is seen only by the hook
process, never by the container, and it costs no cdiVersion.

    GPUCTK_DRIVER_VERSION=535.309.01
    GPUCTK_CUDA_VERSION=12.2
    GPUCTK_GPUS=0/GPU-aaaa/9.0/hopper/MIG-x+MIG-y;1/GPU-bbbb/9.0/hopper/

One GPU per `;`: index, UUID, compute capability, architecture, then its MIG device UUIDs joined
by `+` (empty when MIG is off). This module is imported by the shim: stdlib only, no regex,
no dataclasses (whose import pulls in `inspect`) and no typing: plain slotted records.

The rest of what the generator and the hook (and the shim, which does the hook's work) agree
on about a spec's gpuctk-hook entries is here too: the packaged hook's path, the entry's PATH,
and the names of the in-root actions that `--disable-hook NAME` leaves out (the reference
toolkit's names).
"""

from __future__ import annotations

import os

HOOK_NAME = "gpuctk-hook"
COMPILED_HOOK = "gpuctk-cdi-hook"  # hook/cdihook.c, installed beside HOOK_NAME
HOOK_PROGRAMS = (HOOK_NAME, COMPILED_HOOK)  # the names of gpuctk's hook entries' paths
PACKAGED_HOOK = f"/usr/bin/{HOOK_NAME}"  # where the deb installs gpuctk-hook
HOOK_ENV_PATH = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
HOOK_VERB = "createContainer"  # the entry's OCI stage and the hook's verb
LINKS_ACTION = "create-symlinks"
LDCACHE_ACTION = "update-ldcache"
COMPAT_ACTION = "enable-cuda-compat"
GUARD_ACTION = "disable-device-node-modification"  # gpuctk.hook.verbs.nodeprotect; a verb too
HOOK_ACTIONS = (LINKS_ACTION, LDCACHE_ACTION, COMPAT_ACTION, GUARD_ACTION)

# the entry's options (each with a value, each repeatable but --ld-cache)
LINK_OPT = "--link"  # TARGET::LINK
LINK_FOR_OPT = "--link-for"  # CAPABILITY:TARGET::LINK: a link for a container asking for it
LINK_SEP = "::"  # between a link's TARGET and LINK (nvidia-ctk's create-symlinks form)
CAP_SEP = ":"  # after a --link-for's CAPABILITY
FOLDER_OPT = "--folder"  # a library folder for the ld cache
LD_CACHE_OPT = "--ld-cache"  # the stage's own ld cache (a host file)
DISABLE_OPT = "--disable-hook"  # one of HOOK_ACTIONS, left out
# gpuctk-hook's in-root verbs -> the options each takes, by name (all repeatable, all with a
# value), and its flags, which a verb's arguments may hold too: read by read_args in
# hook/cdihook.c alone (through the generated header; gpuctk.hook.compiled.read_args asks it)
_PATH_OPTS = ("mode", "path")  # chmod's
_OWN = "container-spec"  # a config.json's path, for a verb run by hand
HOOK_OPTIONS = {
    HOOK_VERB: tuple(o.removeprefix("--") for o in (
        LINK_OPT, LINK_FOR_OPT, FOLDER_OPT, *_PATH_OPTS, "ldconfig-path", _OWN, DISABLE_OPT,
        LD_CACHE_OPT,
    )),
    GUARD_ACTION: (_OWN,),
    LINKS_ACTION: (LINK_OPT.removeprefix("--"), _OWN),
    LDCACHE_ACTION: (FOLDER_OPT.removeprefix("--"), "ldconfig-path", _OWN),
    "chmod": (*_PATH_OPTS, _OWN),
}  # fmt: skip
HOOK_FLAGS = ("debug",)


def link_value(target: str, link: str, capability: str = "") -> str:
    """A --link value, TARGET::LINK; with `capability` a --link-for value,
    CAPABILITY:TARGET::LINK. The entry's link values are written here and read by
    split_link in hook/cdihook.c alone (the separators through the generated header;
    gpuctk.hook.compiled.read_args asks it)."""
    value = f"{target}{LINK_SEP}{link}"
    return f"{capability}{CAP_SEP}{value}" if capability else value


# a spec's env: the container folder of the driver's libcuda.so.1 (nvidia-ctk's name;
# gpuctk.cdi.generate.libcuda_dir)
LIBCUDA_DIR_ENV = "NVIDIA_CTK_LIBCUDA_DIR"

# in the entry's env: =FRONT_OFF hands every call of the compiled front to gpuctk-hook, and the
# trace variable (set) makes it say why it hands one over
HOOK_FRONT_ENV = "GPUCTK_HOOK_FRONT"
HOOK_FRONT_TRACE_ENV = "GPUCTK_HOOK_FRONT_TRACE"
FRONT_OFF = "off"

DRIVER_KEY = "GPUCTK_DRIVER_VERSION"
CUDA_KEY = "GPUCTK_CUDA_VERSION"
GPUS_KEY = "GPUCTK_GPUS"


class _Record:
    """A tiny immutable record: positional or keyword fields, equality, a readable repr."""

    __slots__: tuple[str, ...] = ()

    def __init__(self, *args: object, **kwargs: object) -> None:
        values = dict(zip(self.__slots__, args, strict=False)) | kwargs
        for name in self.__slots__:
            object.__setattr__(self, name, values[name])

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError(f"{type(self).__name__} is immutable")

    def __eq__(self, other: object) -> bool:
        return type(other) is type(self) and all(
            getattr(self, n) == getattr(other, n) for n in self.__slots__
        )

    def __hash__(self) -> int:
        return hash(tuple(getattr(self, n) for n in self.__slots__))

    def __repr__(self) -> str:
        fields = ", ".join(f"{n}={getattr(self, n)!r}" for n in self.__slots__)
        return f"{type(self).__name__}({fields})"


class GpuFacts(_Record):
    __slots__ = ("index", "uuid", "compute_capability", "architecture", "mig_uuids")  # noqa: RUF023 (positional order)
    index: int
    uuid: str
    compute_capability: str  # "9.0"
    architecture: str
    mig_uuids: tuple[str, ...]


class Facts(_Record):
    __slots__ = ("driver_version", "cuda_version", "gpus")  # noqa: RUF023 (positional order)
    driver_version: str
    cuda_version: str
    gpus: tuple[GpuFacts, ...]


def encode(facts: Facts) -> list[str]:
    """The env entries that carry `facts`."""
    gpus = ";".join(
        f"{g.index}/{g.uuid}/{g.compute_capability}/{g.architecture}/{'+'.join(g.mig_uuids)}"
        for g in facts.gpus
    )
    return [
        f"{DRIVER_KEY}={facts.driver_version}",
        f"{CUDA_KEY}={facts.cuda_version}",
        f"{GPUS_KEY}={gpus}",
    ]


def decode(env: list[str] | tuple[str, ...]) -> Facts | None:
    """Facts from a hook entry's env list; None when the entry carries none (not ours)."""
    values = {}
    for item in env:
        key, sep, value = item.partition("=")
        if sep and key in (DRIVER_KEY, CUDA_KEY, GPUS_KEY):
            values[key] = value
    if DRIVER_KEY not in values:
        return None
    gpus = []
    for part in values.get(GPUS_KEY, "").split(";"):
        if not part:
            continue
        fields = part.split("/")
        if len(fields) != 5 or not fields[0].isdigit():
            raise ValueError(f"malformed {GPUS_KEY} entry: {part!r}")
        mig = tuple(u for u in fields[4].split("+") if u)
        gpus.append(GpuFacts(int(fields[0]), fields[1], fields[2], fields[3], mig))
    return Facts(values[DRIVER_KEY], values.get(CUDA_KEY, ""), tuple(gpus))


def compiled_beside(path: str) -> str:
    """The executable COMPILED_HOOK in the folder of `path` (gpuctk-hook or another launcher),
    as named, else in that of its real file; "" where there is none. What a spec's entry names
    (gpuctk cdi generate), the guard's entry runs and doctor checks."""
    for mine in (path, os.path.realpath(path)):
        found = os.path.join(os.path.dirname(mine), COMPILED_HOOK)
        if os.path.isfile(found) and os.access(found, os.X_OK):
            return found
    return ""
