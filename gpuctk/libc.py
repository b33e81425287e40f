"""C library calls for the container-create path, through `_ctypes` without the `ctypes` package.

`import ctypes` is costly at every Python start (it builds every C type, imports `struct`,
`types` and its endianness helpers); the shim and the hook need a few functions: `syscall` (for
openat2), and in the hook `mount`, `umount2`, `unshare`, `prctl`, `capget`,
`capset`. This module builds exactly those from the `_ctypes` extension the
package itself wraps (dlopen of the running program, a CFuncPtr subclass with the cdecl and
use-errno flags, a C `long`, `int` and `char[]` type), a fraction of that. Where `_ctypes`
lacks any of that, it falls back to `ctypes` itself: the same result, only slower to load.

    function("mount", restype="i")      -> callable; errno after a call: get_errno()
    long_arg(n)                          a C long argument (for variadic calls such as syscall)
    buffer(data)                         a mutable char[] (a struct the kernel reads or fills)

Arguments: Python ints are passed as C int, bytes as `const char *` (the buffer itself), long_arg(n)
as C long: the rules of ctypes without argtypes.
"""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any

_TYPES: dict[str, Any] = {}
_FUNCTIONS: dict[tuple[str, str], Callable[..., int]] = {}
_handle: Any = None


def _simple(code: str) -> Any:
    """The C simple type for a struct-module code ("l": long, "i": int, "c": char)."""
    if code not in _TYPES:
        import _ctypes

        _TYPES[code] = type(f"c_{code}", (_ctypes._SimpleCData,), {"_type_": code})
    return _TYPES[code]


def _fast_function(name: str, restype: str) -> Callable[..., int]:
    import _ctypes

    global _handle
    if _handle is None:

        class _Library:  # what CFuncPtr((name, library)) reads: the dlopen handle
            _handle = _ctypes.dlopen(None, 0x0002)  # type: ignore[arg-type]  # the running program (RTLD_NOW)

        _handle = _Library()

    cls = type(
        f"_{name}",
        (_ctypes.CFuncPtr,),
        {
            "_flags_": _ctypes.FUNCFLAG_CDECL | _ctypes.FUNCFLAG_USE_ERRNO,
            "_restype_": _simple(restype),
        },
    )
    func: Callable[..., int] = cls((name, _handle))
    return func


def _slow_function(name: str, restype: str) -> Callable[..., int]:  # pragma: no cover
    import ctypes

    func = getattr(ctypes.CDLL(None, use_errno=True), name)
    func.restype = {"l": ctypes.c_long, "i": ctypes.c_int}[restype]
    result: Callable[..., int] = func
    return result


def function(name: str, restype: str = "i") -> Callable[..., int]:
    """The libc function `name` returning C `restype` ("i" int, "l" long); AttributeError when
    libc has no such function."""
    key = (name, restype)
    if key not in _FUNCTIONS:
        try:
            _FUNCTIONS[key] = _fast_function(name, restype)
        except (ImportError, TypeError):  # pragma: no cover - a CPython without these internals
            _FUNCTIONS[key] = _slow_function(name, restype)
    return _FUNCTIONS[key]


def long_arg(value: int) -> Any:
    """`value` as a C long argument."""
    try:
        return _simple("l")(value)
    except (ImportError, TypeError):  # pragma: no cover
        import ctypes

        return ctypes.c_long(value)


def buffer(data: bytes) -> Any:
    """A mutable C `char[len(data)]` holding `data`, passed to a function as a pointer to its
    first byte (for structures the kernel fills or reads); `.raw` gives its bytes back."""
    try:
        import _ctypes

        array = type(
            f"c_char_Array_{len(data)}",
            (_ctypes.Array,),
            {"_type_": _simple("c"), "_length_": len(data)},
        )
        buf = array()
    except (ImportError, TypeError):  # pragma: no cover
        import ctypes

        buf = (ctypes.c_char * len(data))()
    buf.raw = data
    return buf


def get_errno() -> int:
    """errno as the last call through `function` left it."""
    try:
        from _ctypes import get_errno as errno_now
    except ImportError:  # pragma: no cover
        from ctypes import get_errno as errno_now
    value: int = errno_now()
    return value
