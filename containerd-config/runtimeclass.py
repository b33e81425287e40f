"""`gpuctk runtime runtimeclass`: the Kubernetes RuntimeClass that selects the gpuctk handler."""

from __future__ import annotations

import json
import re
from collections.abc import Sequence

from gpuctk.errors import UsageError

GPU_NODE_LABEL = ("nvidia.com/gpu.present", "true")

_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_LABEL_KEY = re.compile(
    r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
    r"[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$"
)
_LABEL_VALUE = re.compile(r"^([A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?)?$")


def parse_selector(items: Sequence[str]) -> list[tuple[str, str]]:
    """`KEY=VALUE` flags as label pairs, checked against Kubernetes' label syntax."""
    out: list[tuple[str, str]] = []
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not _LABEL_KEY.match(key) or not _LABEL_VALUE.match(value):
            raise UsageError(f"--node-selector {item!r}: expected a label KEY=VALUE")
        out.append((key, value))
    return out


def manifest(name: str, handler: str, selector: Sequence[tuple[str, str]] = ()) -> str:
    """A node.k8s.io/v1 RuntimeClass as YAML text (strings JSON-quoted, valid YAML)."""
    if not _SUBDOMAIN.match(name) or len(name) > 253:
        raise UsageError(f"--name {name!r} is not a valid Kubernetes object name")
    if not _LABEL.match(handler) or len(handler) > 63:
        raise UsageError(f"--handler {handler!r} must be a DNS label (lower-case, digits, '-')")
    lines = [
        "apiVersion: node.k8s.io/v1",
        "kind: RuntimeClass",
        "metadata:",
        f"  name: {json.dumps(name)}",
        f"handler: {json.dumps(handler)}",
    ]
    if selector:
        lines += ["scheduling:", "  nodeSelector:"]
        lines += [f"    {json.dumps(key)}: {json.dumps(value)}" for key, value in selector]
    return "\n".join(lines) + "\n"
