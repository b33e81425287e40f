"""gpuctk_vocab.h: the words gpuctk-cdi-hook (hook/cdihook.c, with hook/ldcache.c and
hook/shimfront.c) shares with the Python, written from the Python constants that define them.

The capability names and their order, the hook entry's verb, options and action names, the
environment variables, the files it reads and writes in a container root, its limits, the shim
front's plan format and folders: each is one constant in its home module (the second column of
WORDS), and the C names it only through the header this module writes, which hook/cbuild.py
generates into each build's own folder (never the source tree) and passes with -I. Standard
library only, importable from a source tree before the package is installed.

    python -m gpuctk.hook.cvocab FOLDER     # write FOLDER/gpuctk_vocab.h (to read it)
"""

from __future__ import annotations

import importlib
import os
import posixpath
import sys
import tempfile
from pathlib import Path

HEADER = "gpuctk_vocab.h"
GENERATOR = "hook/cvocab.py"

_CAPS = "gpuctk.cdi.node.capabilities"
_FACTS = "gpuctk.cdi.node.facts"
_FRONT = "gpuctk.hook.shim.frontplan"
_GUARD = "gpuctk.hook.verbs.nodeprotect"
_ARGS = "gpuctk.hook.shim.runcargs"
_MEMO = "gpuctk.hook.shim.memo"

# (C name, the Python constant as module.NAME, what of its value the C takes: "" the value,
# "dir" / "name" a path's folder / last name, "sorted" a set in order, "mask" the capabilities'
# bits in capabilities.ALL's order, "ascii" bytes as text, "rows" a table of words, each key and
# its words as one string "KEY WORD...")
WORDS: tuple[tuple[str, str, str], ...] = (
    # the container's capabilities: bit i of a mask is GPUCTK_CAPS[i]
    ("GPUCTK_CAPS", f"{_CAPS}.ALL", ""),
    ("GPUCTK_CAPS_DEFAULT", f"{_CAPS}.DEFAULT", "mask"),
    ("GPUCTK_CAPS_EVERY", f"{_CAPS}.EVERY", ""),
    ("GPUCTK_CAPS_BLANKS", f"{_CAPS}.BLANKS", ""),
    ("GPUCTK_CAPS_ENV", "gpuctk.hook.requests.drivercaps.ENV", ""),
    # the spec's hook entry: its program, verbs, options, actions and env
    ("GPUCTK_HOOK_NAME", f"{_FACTS}.HOOK_NAME", ""),
    ("GPUCTK_HOOK_VERB", f"{_FACTS}.HOOK_VERB", ""),
    ("GPUCTK_LINKS_ACTION", f"{_FACTS}.LINKS_ACTION", ""),
    ("GPUCTK_LDCACHE_ACTION", f"{_FACTS}.LDCACHE_ACTION", ""),
    ("GPUCTK_COMPAT_ACTION", f"{_FACTS}.COMPAT_ACTION", ""),
    ("GPUCTK_GUARD_ACTION", f"{_FACTS}.GUARD_ACTION", ""),
    ("GPUCTK_LINK_OPT", f"{_FACTS}.LINK_OPT", ""),
    ("GPUCTK_LINK_FOR_OPT", f"{_FACTS}.LINK_FOR_OPT", ""),
    ("GPUCTK_LINK_SEP", f"{_FACTS}.LINK_SEP", ""),
    ("GPUCTK_CAP_SEP", f"{_FACTS}.CAP_SEP", ""),
    ("GPUCTK_FOLDER_OPT", f"{_FACTS}.FOLDER_OPT", ""),
    ("GPUCTK_LD_CACHE_OPT", f"{_FACTS}.LD_CACHE_OPT", ""),
    ("GPUCTK_DISABLE_OPT", f"{_FACTS}.DISABLE_OPT", ""),
    ("GPUCTK_HOOK_OPTIONS", f"{_FACTS}.HOOK_OPTIONS", "rows"),
    ("GPUCTK_HOOK_FLAGS", f"{_FACTS}.HOOK_FLAGS", ""),
    ("GPUCTK_READ_ARGS_VERB", "gpuctk.hook.compiled.READ_ARGS_VERB", ""),
    ("GPUCTK_DRIVER_VERSION_ENV", f"{_FACTS}.DRIVER_KEY", ""),
    ("GPUCTK_HOOK_FRONT_ENV", f"{_FACTS}.HOOK_FRONT_ENV", ""),
    ("GPUCTK_HOOK_FRONT_TRACE_ENV", f"{_FACTS}.HOOK_FRONT_TRACE_ENV", ""),
    ("GPUCTK_FRONT_OFF", f"{_FACTS}.FRONT_OFF", ""),
    # the OCI state and config fields it reads
    ("GPUCTK_STATE_BUNDLE", "gpuctk.hook.oci_state.BUNDLE_FIELD", ""),
    ("GPUCTK_CONFIG_ROOT", "gpuctk.hook.oci_state.ROOT_FIELD", ""),
    # the container root's files
    ("GPUCTK_MAX_CACHE", "gpuctk.hook.verbs.ldmerge.MAX_CACHE", ""),
    ("GPUCTK_LD_CACHE", "gpuctk.hook.verbs.ldmerge.LD_CACHE", ""),
    ("GPUCTK_LD_CACHE_DIR", "gpuctk.hook.verbs.ldmerge.LD_CACHE", "dir"),
    ("GPUCTK_LD_CACHE_NAME", "gpuctk.hook.verbs.ldmerge.LD_CACHE", "name"),
    ("GPUCTK_LD_SO_CONF", "gpuctk.hook.verbs.inroot.LD_SO_CONF", ""),
    ("GPUCTK_LD_CONF_DIR", "gpuctk.hook.verbs.inroot.LD_CONF_DIR", ""),
    ("GPUCTK_LD_CONF_NAME", "gpuctk.hook.verbs.inroot.LD_CONF_FILE", "name"),
    ("GPUCTK_MERGE_VERB", "gpuctk.hook.verbs.ldmerge.MERGE_VERB", ""),
    ("GPUCTK_CAPS_VERB", "gpuctk.hook.compiled.CAPS_VERB", ""),
    ("GPUCTK_CONFIG_FD_OPT", "gpuctk.hook.compiled.CONFIG_FD_OPT", ""),
    ("GPUCTK_ROOT_SEEN_VERB", "gpuctk.hook.compiled.ROOT_SEEN_VERB", ""),
    ("GPUCTK_LINKS_VERB", "gpuctk.hook.compiled.LINKS_VERB", ""),
    ("GPUCTK_DIR_FD_OPT", "gpuctk.hook.compiled.DIR_FD_OPT", ""),
    ("GPUCTK_IMAGE_FD_OPT", "gpuctk.hook.verbs.ldmerge.IMAGE_FD_OPT", ""),
    ("GPUCTK_ENTRIES_FD_OPT", "gpuctk.hook.verbs.ldmerge.ENTRIES_FD_OPT", ""),
    ("GPUCTK_NOT_MERGED", "gpuctk.hook.verbs.ldmerge.NOT_MERGED", ""),
    ("GPUCTK_COMPAT_CONF", "gpuctk.hook.verbs.cudacompat.COMPAT_CONF", ""),
    ("GPUCTK_COMPAT_DIR", "gpuctk.hook.verbs.cudacompat.COMPAT_DIR", ""),
    ("GPUCTK_COMPAT_LIBCUDA", "gpuctk.hook.verbs.cudacompat.LIBCUDA", ""),
    # the device node guard
    ("GPUCTK_PARAMS", f"{_GUARD}.PARAMS", ""),
    ("GPUCTK_MAX_PARAMS", f"{_GUARD}.MAX_BYTES", ""),
    ("GPUCTK_PARAMS_KEY", f"{_GUARD}.KEY", "ascii"),
    ("GPUCTK_SCRATCH", f"{_GUARD}.SCRATCH", ""),
    ("GPUCTK_SCRATCH_PREFIX", f"{_GUARD}.SCRATCH_PREFIX", ""),
    ("GPUCTK_ROOT_FD_OPT", f"{_GUARD}.ROOT_FD_OPT", ""),
    ("GPUCTK_TMPFS_MAGIC", f"{_GUARD}.TMPFS_MAGIC", ""),
    ("GPUCTK_LAUNCHER_MARK", "gpuctk.install.launchers.LAUNCHER_MARK", ""),
    # gpuctk-runtime's compiled create
    ("GPUCTK_RUNTIME_FRONT", "gpuctk.install.launchers.RUNTIME_FRONT", ""),
    ("GPUCTK_CREATE_VERB", f"{_ARGS}.CREATE", ""),
    ("GPUCTK_INJECT_VERBS", f"{_ARGS}.INJECT_VERBS", "sorted"),
    ("GPUCTK_BUNDLE_FLAG", f"{_ARGS}.BUNDLE", ""),
    ("GPUCTK_BUNDLE_SHORT", f"{_ARGS}.BUNDLE_SHORT", ""),
    ("GPUCTK_LOG_FLAG", f"{_ARGS}.LOG", ""),
    ("GPUCTK_LOG_FORMAT_FLAG", f"{_ARGS}.LOG_FORMAT", ""),
    ("GPUCTK_GLOBAL_VALUE_FLAGS", f"{_ARGS}.GLOBAL_VALUE_FLAGS", "sorted"),
    ("GPUCTK_GLOBAL_BOOL_FLAGS", f"{_ARGS}.FRONT_GLOBAL_BOOL_FLAGS", "sorted"),
    ("GPUCTK_VERB_VALUE_FLAGS", f"{_ARGS}.FRONT_VERB_VALUE_FLAGS", "sorted"),
    ("GPUCTK_VERB_BOOL_FLAGS", f"{_ARGS}.FRONT_VERB_BOOL_FLAGS", "sorted"),
    ("GPUCTK_ALL_VERB_VALUE_FLAGS", f"{_ARGS}.VERB_VALUE_FLAGS", "sorted"),
    ("GPUCTK_CONFIG_FLAGS", f"{_ARGS}.CONFIG_FLAGS", "sorted"),
    ("GPUCTK_DEBUG_FLAG", f"{_ARGS}.DEBUG", ""),
    ("GPUCTK_CONFIG_NAME", f"{_ARGS}.CONFIG_NAME", ""),
    ("GPUCTK_TEXT_FORMAT", f"{_ARGS}.TEXT", ""),
    ("GPUCTK_RUNC_ARGS_VERB", "gpuctk.hook.compiled.RUNC_ARGS_VERB", ""),
    ("GPUCTK_FRONT_KEY", "gpuctk.hook.shim.frontkey.KEY_VERB", ""),
    ("GPUCTK_STAMP_MARK", "gpuctk.log.STAMP_MARK", ""),
    ("GPUCTK_STAMP_FORMAT", "gpuctk.log.STAMP_FORMAT", ""),
    ("GPUCTK_ID_MARK", "gpuctk.log.ID_MARK", ""),
    ("GPUCTK_STDERR_PATHS", "gpuctk.log.STDERR_PATHS", ""),
    ("GPUCTK_SHIM_FRONT_ENV", f"{_FRONT}.SHIM_FRONT_ENV", ""),
    ("GPUCTK_SHIM_FRONT_TRACE_ENV", f"{_FRONT}.SHIM_FRONT_TRACE_ENV", ""),
    ("GPUCTK_SPEC_CACHE_ENV", "gpuctk.cdi.specs.speccache.CACHE_ENV", ""),
    ("GPUCTK_SPEC_CACHE_OFF", "gpuctk.cdi.specs.speccache.CACHE_OFF", ""),
    ("GPUCTK_MEMO_NAME", f"{_MEMO}.MEMO_NAME", ""),
    ("GPUCTK_MEMO_TAG", f"{_MEMO}.MEMO_TAG", ""),
    ("GPUCTK_MEMO_PRESENT", f"{_MEMO}.PRESENT", ""),
    ("GPUCTK_MEMO_ABSENT", f"{_MEMO}.ABSENT", ""),
    ("GPUCTK_MEMO_SEARCH", f"{_MEMO}.SEARCH", ""),
    ("GPUCTK_MAX_MEMO", f"{_MEMO}.MAX_BYTES", ""),
    ("GPUCTK_FRONT_RUNTIME_ENV", "gpuctk.hook.shim.runtime_main.FRONT_RUNTIME_ENV", ""),
    ("GPUCTK_CONFIG_ENV", "gpuctk.hook.config.ENV_VAR", ""),
    ("GPUCTK_DEFAULT_CONFIG", "gpuctk.hook.config.DEFAULT_PATH", ""),
    ("GPUCTK_STATE_DIR_ENV", "gpuctk.statedir.STATE_DIR_ENV", ""),
    ("GPUCTK_DEFAULT_STATE_DIR", "gpuctk.statedir.DEFAULT_STATE_DIR", ""),
    ("GPUCTK_FRONT_FOLDER", f"{_FRONT}.FOLDER_NAME", ""),
    ("GPUCTK_PLAN_FORMAT", f"{_FRONT}.FORMAT", ""),
    ("GPUCTK_FRONT_PREFIXES", f"{_FRONT}.PREFIXES_NAME", ""),
    ("GPUCTK_PREFIXES_FORMAT", f"{_FRONT}.PREFIXES_FORMAT", ""),
    ("GPUCTK_PLAN_CONFIG", f"{_FRONT}.CONFIG_FIELD", ""),
    ("GPUCTK_PLAN_RUNTIME", f"{_FRONT}.RUNTIME_FIELD", ""),
    ("GPUCTK_MAX_PLAN", f"{_FRONT}.MAX_BYTES", ""),
    ("GPUCTK_KEY_PREFIXES", "gpuctk.hook.shim.frontkey.KEY_PREFIXES", ""),
    ("GPUCTK_MAX_CONFIG", "gpuctk.hook.bundle.MAX_CONFIG", ""),
    ("GPUCTK_HOOK_STAGES", "gpuctk.cdi.specs.apply.HOOK_STAGES", "sorted"),
    ("GPUCTK_DEVICE_LIST_MOUNTS", "gpuctk.hook.requests.devices.MOUNTS_ROOT", "name"),
    ("GPUCTK_KUBE_MARKERS", "gpuctk.hook.requests.devices.KUBERNETES_MARKERS", ""),
    ("GPUCTK_MANAGER", "gpuctk.hook.requests.devices.MANAGER", ""),
)

Value = str | int | tuple[str, ...]


def constant(source: str) -> object:
    """The value of `source` (module.NAME), read from its module now."""
    module, _, name = source.rpartition(".")
    return getattr(importlib.import_module(module), name)


def value(source: str, take: str) -> Value:
    """What the C gets of `source` (see WORDS)."""
    v = constant(source)
    if take == "dir" and isinstance(v, str):
        return posixpath.dirname(v)
    if take == "name" and isinstance(v, str):
        return posixpath.basename(v)
    if take == "sorted" and isinstance(v, frozenset | set):
        return tuple(sorted(str(x) for x in v))
    if take == "rows" and isinstance(v, dict):
        return tuple(" ".join((k, *words)) for k, words in v.items())
    if take == "ascii" and isinstance(v, bytes):
        return v.decode("ascii")
    if take == "mask" and isinstance(v, tuple):
        every = constant(f"{_CAPS}.ALL")
        assert isinstance(every, tuple)
        return sum(1 << every.index(cap) for cap in v)
    if take == "" and isinstance(v, int | str) and not isinstance(v, bool):
        return v
    if take == "" and isinstance(v, tuple) and all(isinstance(x, str) for x in v):
        return v
    raise TypeError(f"{source}: a {type(v).__name__} the C cannot take as {take!r}")


def values() -> dict[str, Value]:
    """Each C name of WORDS -> its value now."""
    return {name: value(source, take) for name, source, take in WORDS}


_ESCAPES = {"\n": "\\n", "\t": "\\t", "\r": "\\r", "\x0b": "\\v", "\x0c": "\\f"}


def c_string(text: str) -> str:
    """`text` as a C string literal (printable ASCII and ASCII white space only)."""
    if not all(" " <= c <= "~" or c in _ESCAPES for c in text):
        raise ValueError(f"{text!r}: the C vocabulary is printable ASCII")
    escaped = text.replace("\\", "\\\\").replace('"', '\\"').replace("?", "\\?")
    for c, e in _ESCAPES.items():
        escaped = escaped.replace(c, e)
    return '"' + escaped + '"'


def _define(name: str, v: Value) -> str:
    if isinstance(v, tuple):
        items = ", ".join(c_string(x) for x in v)
        return (f"static const char *const {name}[] = {{ {items} }};\n"
                f"#define {name}_COUNT {len(v)}")  # fmt: skip
    return f"#define {name} {c_string(v) if isinstance(v, str) else v}"


def header() -> str:
    """The text of gpuctk_vocab.h."""
    now = values()
    parts = [
        f"/* {HEADER}: the words gpuctk-cdi-hook shares with gpuctk's Python, generated by",
        f" * {GENERATOR} from the Python constants named below; do not edit. */",
        "#ifndef GPUCTK_VOCAB_H",
        "#define GPUCTK_VOCAB_H",
    ]
    for name, source, _ in WORDS:
        parts += [f"/* generated by {GENERATOR} from {source}; do not edit */",
                  _define(name, now[name])]  # fmt: skip
    return "\n".join([*parts, "#endif", ""])


def write(folder: str | Path) -> Path:
    """`folder`/gpuctk_vocab.h, written whole (a temp file renamed into place)."""
    path = Path(folder) / HEADER
    fd, tmp = tempfile.mkstemp(prefix=f".{HEADER}.", dir=folder)
    try:
        with os.fdopen(fd, "w", encoding="ascii") as f:
            f.write(header())
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return path


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1 or args[0].startswith("-"):
        print(f"usage: python -m gpuctk.hook.cvocab FOLDER  (writes FOLDER/{HEADER})",
              file=sys.stderr)  # fmt: skip
        return 2
    print(write(args[0]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
