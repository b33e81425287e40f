"""The key of a front plan, as the compiled create says it (`gpuctk-cdi-hook front-key`).

hook/shimfront.c `request_key` is the key's one home: the shim hands it config.json's text as
read and takes the plan's file name, the key's strings and the names of the config's lists the
plan's recipes are made for (gpuctk.hook.shim.frontplan says what the key holds).
"""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Sequence

KEY_VERB = "front-key"  # gpuctk-cdi-hook's verb that says a config's key (hook/shimfront.c)
KEY_PREFIXES = ("NVIDIA_", "CUDA_VERSION")  # the env entries a request's key holds
KEY_TIMEOUT = 10  # seconds for `gpuctk-cdi-hook front-key` (it reads one config.json)


class FrontKey:
    """A config's key as the compiled create reads it (`gpuctk-cdi-hook front-key`): the
    plan's file name in the front folder, the key's strings, three of them as numbers, the
    names of the config's lists the key holds (each env entry's, mount destination, device
    path: what the plan's recipes are made for), and whether the front folder of the state
    folder it was given is one it reads plans from (1) or not (0). Not a NamedTuple: importing
    `typing` costs every create (docs/benchmarks.md)."""

    __slots__ = ("devices", "env", "file", "folder", "gid", "key", "mounts", "privileged", "uid")

    def __init__(
        self,
        file: str,
        key: list[str],
        privileged: int,
        uid: int,
        gid: int,
        env: list[str],
        mounts: list[str],
        devices: list[str],
        folder: int,
    ) -> None:
        self.file, self.key, self.privileged, self.uid, self.gid = file, key, privileged, uid, gid
        self.env, self.mounts, self.devices, self.folder = env, mounts, devices, folder

    def __eq__(self, other: object) -> bool:
        return isinstance(other, FrontKey) and all(
            getattr(self, n) == getattr(other, n) for n in self.__slots__
        )

    __hash__ = None  # type: ignore[assignment]  # a list inside: not hashable

    def __repr__(self) -> str:
        return f"FrontKey({', '.join(f'{n}={getattr(self, n)!r}' for n in self.__slots__)})"


def key_of(
    compiled: str, config: bytes, cdi_prefixes: Sequence[str], state: str
) -> FrontKey | None:
    """The key by which the compiled create `compiled` looks up the front plan of the OCI
    config whose text is `config`, whose annotations with one of `cdi_prefixes` ask for
    devices, in the state folder `state` (hook/shimfront.c front_key: the key's one home, and
    the front folder's rule's); None where it would take none."""
    import subprocess

    from gpuctk.jsonfast import loads
    from gpuctk.statedir import STATE_DIR_ENV

    try:
        done = subprocess.run(
            [compiled, KEY_VERB, *cdi_prefixes],
            input=config, capture_output=True, env={STATE_DIR_ENV: state}, timeout=KEY_TIMEOUT,
            check=False,
        )  # fmt: skip
        doc = loads(done.stdout.decode("ascii")) if done.returncode == 0 else None
        key = FrontKey(**doc) if isinstance(doc, dict) else None
    except (OSError, subprocess.SubprocessError, ValueError, TypeError):  # UnicodeError too
        return None
    return key if key is not None and _key_shape(key) else None


def _strings(value: object) -> bool:
    return isinstance(value, list) and all(isinstance(k, str) for k in value)


def _key_shape(key: FrontKey) -> bool:
    name = key.file if isinstance(key.file, str) else ""
    return (
        len(name) == 21  # 16 hex digits, .json: a name in the front folder, nothing else
        and name.endswith(".json")
        and all(c in "0123456789abcdef" for c in name[:16])
        and all(_strings(v) for v in (key.key, key.env, key.mounts, key.devices))
        and key.privileged in (0, 1)
        and key.folder in (0, 1)
        and all(type(n) is int and n >= 0 for n in (key.uid, key.gid))
    )
