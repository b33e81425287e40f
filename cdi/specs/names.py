"""CDI names: vendor, class, device, kind and fully qualified device names.

The rules mirror the reference Go library (tags.cncf.io/container-device-interface,
pkg/parser and api/validator/identifiers.go):

    kind              "<vendor>/<class>"                       e.g. nvidia.com/gpu
    qualified name    "<vendor>/<class>=<device>"              e.g. nvidia.com/gpu=0
    vendor, class     start with a letter, end with a letter or digit, and carry only
                      ASCII letters, digits, '_', '-' and '.' in between
    device            starts and ends with a letter or digit and carries only ASCII letters,
                      digits, '_', '-', '.' and ':' in between (a single letter or digit is fine)

The shim imports this module on the container-create path, so it uses no regex and no imports:
plain membership tests against frozensets. Checkers return a problem text or None; the parsers
raise ValueError, which callers turn into their own error (RequestError, ValidationError, ...).
"""

from __future__ import annotations

_LETTERS = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz")
_ALNUM = _LETTERS | frozenset("0123456789")
_VENDOR_CLASS_INNER = _ALNUM | frozenset("_-.")
_DEVICE_INNER = _VENDOR_CLASS_INNER | frozenset(":")


def is_alnum(c: str) -> bool:
    return c in _ALNUM


def _vendor_or_class_problem(what: str, name: str) -> str | None:
    if not name:
        return f"invalid {what}: empty name"
    if name[0] not in _LETTERS:
        return f"invalid {what} {name!r}: must start with a letter"
    for c in name[1:-1]:
        if c not in _VENDOR_CLASS_INNER:
            return f"invalid {what} {name!r}: character {c!r} is not allowed"
    if name[-1] not in _ALNUM:
        return f"invalid {what} {name!r}: must end with a letter or digit"
    return None


def vendor_name_problem(vendor: str) -> str | None:
    """Why `vendor` is not a valid CDI vendor name, or None when it is."""
    return _vendor_or_class_problem("vendor", vendor)


def class_name_problem(class_: str) -> str | None:
    """Why `class_` is not a valid CDI class name, or None when it is."""
    return _vendor_or_class_problem("class", class_)


def device_name_problem(name: str) -> str | None:
    """Why `name` is not a valid CDI device name, or None when it is."""
    if not name:
        return "invalid device name: empty name"
    if name[0] not in _ALNUM:
        return f"invalid device name {name!r}: must start with a letter or digit"
    for c in name[1:-1]:
        if c not in _DEVICE_INNER:
            return f"invalid device name {name!r}: character {c!r} is not allowed"
    if name[-1] not in _ALNUM:
        return f"invalid device name {name!r}: must end with a letter or digit"
    return None


def parse_qualifier(kind: str) -> tuple[str, str]:
    """Split "vendor/class" at the first '/'. On failure: ("", kind), like the reference."""
    vendor, sep, class_ = kind.partition("/")
    if not sep or not vendor or not class_:
        return "", kind
    return vendor, class_


def kind_problem(kind: str) -> str | None:
    """Why `kind` is not a valid "vendor/class" CDI kind, or None when it is."""
    vendor, class_ = parse_qualifier(kind)
    if not vendor:
        return f"invalid kind {kind!r}: must be <vendor>/<class>, e.g. nvidia.com/gpu"
    return vendor_name_problem(vendor) or class_name_problem(class_)


def parse_device(device: str) -> tuple[str, str, str]:
    """Split "vendor/class=name" leniently: ("", "", device) when it is not qualified."""
    if not device or device[0] == "/":
        return "", "", device
    qualifier, sep, name = device.partition("=")
    if not sep or not qualifier or not name:
        return "", "", device
    vendor, class_ = parse_qualifier(qualifier)
    if not vendor:
        return "", "", device
    return vendor, class_, name


def qualified_name_problem(device: str) -> str | None:
    """Why `device` is not a valid fully qualified CDI device name, or None when it is."""
    vendor, class_, name = parse_device(device)
    if not vendor:
        return f"unqualified device {device!r}: expected <vendor>/<class>=<name>"
    problem = vendor_name_problem(vendor) or class_name_problem(class_)
    problem = problem or device_name_problem(name)
    if problem:
        return f"invalid device {device!r}: {problem}"
    return None


def parse_qualified_name(device: str) -> tuple[str, str, str]:
    """("nvidia.com", "gpu", "0") from "nvidia.com/gpu=0"; ValueError when it is not valid."""
    problem = qualified_name_problem(device)
    if problem:
        raise ValueError(problem)
    return parse_device(device)


def is_qualified_name(device: str) -> bool:
    return qualified_name_problem(device) is None


def qualified_name(vendor: str, class_: str, name: str) -> str:
    return f"{vendor}/{class_}={name}"
