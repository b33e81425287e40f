"""`gpuctk cdi transform root`: move a CDI spec's paths from one root to another.

As the reference toolkit's `nvidia-ctk cdi transform root`. Relative to the host (the
default) it rewrites the host side: each mount's hostPath, each device node's hostPath (its
path where it has none), each hook's path (not a startContainer hook's, which runs in the
container) and the arguments of the hooks that run on the host (not createContainer or
startContainer), both halves of a `TARGET::LINK` argument included (and the path after a
`--link-for`'s `CAPABILITY:` or in an `--opt=PATH`). Relative to the
container it rewrites the container side: containerPath, device node path, a startContainer
hook's path, the arguments of createContainer and startContainer hooks, and the folder
NVIDIA_CTK_LIBCUDA_DIR names (the one env entry that is a container path). A path is
rewritten only when it is the root or lies under it, component by component.
"""

from __future__ import annotations

import json
import posixpath
import sys
from typing import Any

import click

from gpuctk.cdi.node.facts import LIBCUDA_DIR_ENV, LINK_SEP
from gpuctk.clitypes import NORMAL_PATH
from gpuctk.errors import InputError, UsageError

IN_CONTAINER = ("createContainer", "startContainer")


def move(path: str, root: str, target: str) -> str:
    """`path` with the folder `root` replaced by `target`; unchanged when not under `root`."""
    prefix = root if root.endswith("/") else root + "/"
    if not (path + "/").startswith(prefix):
        return path
    return posixpath.normpath(posixpath.join(target, (path + "/")[len(prefix) :]))


def _move_piece(piece: str, root: str, target: str) -> str:
    """A piece of a hook argument (the argument, or each half of a link's TARGET::LINK) with
    its path moved: the piece, or what follows a --link-for's `CAPABILITY:` or an `--opt=`."""
    head, slash, rest = piece.partition("/")
    if not slash or (head and head[-1] not in ":="):
        return piece
    return head + move(slash + rest, root, target)


def _args(args: list[Any], root: str, target: str) -> list[Any]:
    out = []
    for arg in args:
        if isinstance(arg, str):
            arg = LINK_SEP.join(_move_piece(p, root, target) for p in arg.split(LINK_SEP))
        out.append(arg)
    return out


def _edits(edits: dict[str, Any], root: str, target: str, host: bool) -> None:
    for node in edits.get("deviceNodes") or ():
        if host:
            old = node.get("hostPath") or node["path"]
            new = move(old, root, target)
            if new != old:
                node["hostPath"] = new
                if new == node["path"]:
                    del node["hostPath"]
        else:
            node["path"] = move(node["path"], root, target)
    for mount in edits.get("mounts") or ():
        key = "hostPath" if host else "containerPath"
        mount[key] = move(mount[key], root, target)
    if not host and edits.get("env"):  # the one env entry that names a container folder
        edits["env"] = [_env(e, root, target) for e in edits["env"]]
    for hook in edits.get("hooks") or ():
        name = hook.get("hookName")
        if (name != "startContainer") == host:
            hook["path"] = move(hook["path"], root, target)
        if (name not in IN_CONTAINER) == host and hook.get("args"):
            hook["args"] = _args(hook["args"], root, target)


def _env(entry: str, root: str, target: str) -> str:
    """NVIDIA_CTK_LIBCUDA_DIR=FOLDER moved as its mounts are; any other entry as it is."""
    key, sep, value = entry.partition("=")
    return f"{key}={move(value, root, target)}" if sep and key == LIBCUDA_DIR_ENV else entry


def transform_root(doc: dict[str, Any], root: str, target: str, relative_to: str = "host") -> None:
    """Rewrite the spec document `doc` in place (see the module docstring)."""
    if root == target:
        return
    host = relative_to == "host"
    _edits(doc.get("containerEdits") or {}, root, target, host)
    for device in doc.get("devices") or ():
        _edits(device.get("containerEdits") or {}, root, target, host)


def _read(source: str) -> tuple[dict[str, Any], bool]:
    """The spec document from a file or `-` (stdin), and whether it was JSON."""
    from gpuctk.cdi.specs.specfile import MAX_BYTES, decode_spec, read_bytes

    if source == "-":
        data = sys.stdin.buffer.read(MAX_BYTES + 1)
        if len(data) > MAX_BYTES:
            raise InputError(f"standard input: more than {MAX_BYTES} bytes: not a CDI spec")
        name = "<stdin>"
    else:
        data = read_bytes(source)
        name = source
    is_json = data.lstrip().startswith(b"{")
    return decode_spec(data, name, is_json=is_json), is_json


@click.group("transform")
def transform() -> None:
    """Rewrite the paths of a CDI spec."""


@transform.command("root")
@click.argument("source", default="-", metavar="[FILE|-]")
@click.option(
    "--from", "root", type=NORMAL_PATH, required=True, metavar="DIR", help="The root to replace."
)
@click.option(
    "--to", "target", type=NORMAL_PATH, required=True, metavar="DIR",
    help="The root to put instead.",
)  # fmt: skip
@click.option(
    "--relative-to",
    type=click.Choice(["host", "container"]),
    default="host",
    show_default=True,
    help="Which side's paths to rewrite.",
)
@click.option("--output", "-o", metavar="PATH", help="Write here (atomically). Default: stdout.")
@click.option(
    "--format",
    "fmt",
    type=click.Choice(["yaml", "json"]),
    help="Output format. Default: the input's.",
)
@click.option("--input", "input_", metavar="FILE", hidden=True, help="nvidia-ctk's FILE.")
def root_cmd(
    source: str,
    root: str,
    target: str,
    relative_to: str,
    output: str | None,
    fmt: str | None,
    input_: str | None,
) -> None:
    """Move a spec's host paths from one driver root to another.

    \b
    Reads FILE (or standard input), checks it, rewrites every path under --from to lie under
    --to instead, checks the result and writes it.
    Examples:
      gpuctk cdi transform root --from /run/nvidia/driver --to / spec.yaml
      gpuctk cdi generate | gpuctk cdi transform root --from / --to /host -o /etc/cdi/nv.yaml
    """
    from gpuctk.cdi.specs.validate import check_spec_dict

    if input_ is not None:  # nvidia-ctk's spelling of the FILE argument
        if source not in ("-", input_):
            raise UsageError(f"--input {input_} and FILE {source}: give one")
        source = input_
    doc, is_json = _read(source)
    name = "<stdin>" if source == "-" else source
    check_spec_dict(doc, name)
    transform_root(doc, root, target, relative_to)
    check_spec_dict(doc, f"{name} (transformed)")
    if (fmt or ("json" if is_json else "yaml")) == "json":
        data = (json.dumps(doc, indent=2) + "\n").encode()
    else:
        from gpuctk.cdi.specs import yamlout

        data = yamlout.dump(doc).encode()
    if output:
        from gpuctk.writes import atomic_write

        atomic_write(output, data, 0o644)
    else:
        sys.stdout.buffer.write(data)
        sys.stdout.flush()
