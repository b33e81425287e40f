"""The device node guard (hook/verbs/nodeprotect.py, hook/verbs/nodeguard.py) and `--disable-hook`
(cdi/generate.py, hook/shim/shimroot.py, hook/verbs/actions.py): what is written, what is left
out."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from gpuctk.cdi.generate import HOOK_ACTIONS, Options, build_spec, check_options
from gpuctk.cdi.node import facts
from gpuctk.cdi.node.driverfiles import DriverFile, DriverFiles
from gpuctk.cdi.node.profile import load_profile
from gpuctk.cdi.simulate import simulated_nodes
from gpuctk.errors import UsageError
from gpuctk.hook import config
from gpuctk.hook.shim import shimroot
from gpuctk.hook.verbs import actions, hook_main, nodeguard, nodeprotect

NAME = "disable-device-node-modification"
LIB = DriverFile(
    host_path="/drv/usr/lib/x86_64-linux-gnu/libcuda.so.535.309.01",
    container_path="/usr/lib/x86_64-linux-gnu/libcuda.so.535.309.01",
    kind="library",
    capability="compute",
    soname="libcuda.so.1",
)
FILES = DriverFiles(
    libraries=(LIB,),
    symlinks=(("libcuda.so.535.309.01", "/usr/lib/x86_64-linux-gnu/libcuda.so.1"),),
    ld_folders=("/usr/lib/x86_64-linux-gnu",),
)
HOOK = {
    "hookName": "createContainer",
    "path": "/usr/bin/gpuctk-hook",
    "args": ["gpuctk-hook", "createContainer", "--folder", "/usr/lib"],
    "env": ["PATH=/bin"],
}
PARAMS = b"Foo: 1\nModifyDeviceFiles: 1\nDeviceFileUID: 0\n"


def guard(edits: dict[str, Any], protect: str = "hook", taken: bool = True) -> dict[str, Any]:
    ours = [h for h in [HOOK] if h in (edits.get("hooks") or []) or taken]
    if taken:
        edits = {**edits, "hooks": [h for h in edits.get("hooks") or [] if h != HOOK]}
    return dict(nodeguard.guard(edits, ours, protect, lambda _: None, taken=taken))  # type: ignore[arg-type]


def test_taken_over_hook_becomes_the_guard_where_no_driver_is_loaded() -> None:
    got = guard({"hooks": [HOOK]})
    assert got["hooks"] == [{**HOOK, "args": ["gpuctk-hook", NAME]}]


def test_the_guard_is_added_whatever_the_hosts_params_say(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The entry reads the container's params at each start: the host's file at create decides
    nothing, so the Python create and a plan made once add the same entry."""
    params = tmp_path / "params"
    monkeypatch.setattr(nodeprotect, "PARAMS", str(params))
    for says in (b"0", b"1"):
        params.write_bytes(b"ModifyDeviceFiles: " + says + b"\n")
        assert guard({"hooks": [HOOK]})["hooks"] == [{**HOOK, "args": ["gpuctk-hook", NAME]}]


def test_the_python_create_and_the_plan_add_the_same_entry(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A spec with no hook entry: the shim's take_over and the compiled create's plan
    (frontplan.guarded) give config.json the same guard entry; none where the setting is off;
    a folder spec's own entry guards, so neither adds one."""
    from gpuctk.hook.shim import frontplan

    front = tmp_path / facts.COMPILED_HOOK
    hook = tmp_path / "gpuctk-hook"
    for f in (front, hook):
        f.write_text("#!/bin/sh\n")
        f.chmod(0o755)
    monkeypatch.setattr(sys, "argv", [str(tmp_path / "gpuctk-runtime")])
    bare: Any = {"env": ["NVIDIA_VISIBLE_DEVICES=void"]}
    args = [facts.COMPILED_HOOK, "createContainer", "--folder", "/usr/local/nvidia/lib64"]
    staged: Any = {"hooks": [{**HOOK, "path": str(front), "args": args}]}
    for conf, want in (("", 1), ("disable-device-node-modification = false\n", 0)):
        settings = config.parse(conf, "t.toml")
        protect = "hook" if settings.disable_device_node_modification else "off"
        for edits in (bare, staged):
            shim = shimroot.take_over({}, str(tmp_path), edits, lambda _: None, {}, protect=protect)
            plan = frontplan.guarded(edits, settings, str(front))
            assert shim == plan
            added = [h for h in plan.get("hooks") or [] if h["args"][1:] == [NAME]]
            assert added == ([nodeguard.entry(str(front), list(nodeguard.HOOK_ENV))] if
                             want and edits is bare else [])  # fmt: skip
        assert shimroot.gpuctk_hooks(staged) == staged["hooks"]


def test_a_hook_that_runs_guards_itself() -> None:
    assert guard({"hooks": [HOOK]}, taken=False)["hooks"] == [HOOK]


def test_the_setting_off_tells_a_running_hook_and_adds_nothing() -> None:
    (hook,) = guard({"hooks": [HOOK]}, protect="off", taken=False)["hooks"]
    assert hook["args"][-2:] == ["--disable-hook", NAME]
    assert guard({"hooks": [HOOK]}, protect="off")["hooks"] == []


def test_a_spec_that_disables_it_gets_no_guard() -> None:
    hook = {**HOOK, "args": [*HOOK["args"], "--disable-hook", NAME]}
    got = nodeguard.guard({"hooks": []}, [hook], "hook", lambda _: None, taken=True)
    assert got["hooks"] == []


def test_a_spec_without_hook_gets_the_installed_one(monkeypatch: pytest.MonkeyPatch) -> None:
    hook = Path(sys.executable).with_name("gpuctk-hook")
    monkeypatch.setattr(sys, "argv", [str(hook.with_name("gpuctk-runtime"))])
    got = nodeguard.guard({"mounts": []}, [], "hook", lambda _: None)
    path = nodeguard.front(str(hook))  # gpuctk-cdi-hook where it is installed beside
    assert got["hooks"] == [
        {
            "hookName": "createContainer",
            "path": path,
            "args": [Path(path).name, NAME],
            "env": list(nodeguard.HOOK_ENV),
        }
    ]


def test_the_guard_entry_names_the_compiled_front_beside_gpuctk_hook(tmp_path: Path) -> None:
    hook = tmp_path / "gpuctk-hook"
    hook.write_text("#!/bin/sh\n")
    assert nodeguard.front(str(hook)) == str(hook)  # no front: gpuctk-hook itself
    front = tmp_path / facts.COMPILED_HOOK
    front.write_bytes(b"\x7fELF")
    front.chmod(0o644)
    assert nodeguard.front(str(hook)) == str(hook)  # not executable: not used
    front.chmod(0o755)
    assert nodeguard.front(str(hook)) == str(front)


def test_config_json_gets_the_guard_where_no_driver_is_loaded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The shim's steps for a spec without a gpuctk hook (library modes mounts, folder):
    prepare, take_over, apply: config.json's createContainer hooks hold the guard."""
    from gpuctk.cdi.specs import apply

    hook = str(Path(sys.executable).with_name("gpuctk-hook"))
    monkeypatch.setattr(sys, "argv", [str(Path(hook).with_name("gpuctk-runtime"))])
    edits: Any = {"env": ["NVIDIA_VISIBLE_DEVICES=void"]}
    doc: dict[str, Any] = {"root": {"path": str(tmp_path)}, "process": {"env": []}}
    got = shimroot.take_over(doc, str(tmp_path), edits, lambda _: None, shimroot.prepare(edits))
    apply.apply(doc, got)
    (entry,) = doc["hooks"]["createContainer"]
    path = nodeguard.front(hook)
    assert entry["path"] == path and entry["args"] == [Path(path).name, NAME] and entry["env"]


def test_the_config_key() -> None:
    assert config.Settings().disable_device_node_modification is True
    settings = config.parse("disable-device-node-modification = false\n", "t.toml")
    assert settings.disable_device_node_modification is False
    with pytest.raises(Exception, match="must be true or false"):
        config.parse('disable-device-node-modification = "no"\n', "t.toml")


def hook_args(*disabled: str) -> list[str]:
    machine = load_profile("l4")
    opts = Options(disabled_hooks=disabled)
    spec = build_spec(machine, FILES, opts, simulated_nodes(machine)).to_dict()
    hooks = spec["containerEdits"].get("hooks") or []
    return list(hooks[0]["args"]) if hooks else []


def test_generate_writes_what_is_disabled() -> None:
    base = hook_args()
    assert "--link" in base and "--folder" in base and "--disable-hook" not in base
    args = hook_args("create-symlinks", NAME)
    assert "--link" not in args and "--folder" in args
    assert args[-4:] == ["--disable-hook", "create-symlinks", "--disable-hook", NAME]
    args = hook_args("update-ldcache", "enable-cuda-compat")
    assert "--folder" not in args and "--link" in args
    assert args[-4:] == ["--disable-hook", "update-ldcache", "--disable-hook", "enable-cuda-compat"]
    assert hook_args("all") == []


def test_generate_refuses_unknown_names_and_names_outside_hook_mode() -> None:
    with pytest.raises(UsageError, match="known: create-symlinks, update-ldcache"):
        check_options(Options(disabled_hooks=("bogus",)))
    with pytest.raises(UsageError, match="goes with --library-mode hook"):
        check_options(Options(library_mode="mounts", disabled_hooks=(NAME,)))
    check_options(Options(library_mode="mounts", disabled_hooks=("all",)))
    assert HOOK_ACTIONS == nodeguard.ACTIONS
    assert frozenset(HOOK_ACTIONS) == actions.KNOWN_ACTIONS


def test_the_shim_reads_the_disabled_names_from_the_hook_args() -> None:
    link = ["--link", "libcuda.so.535::/usr/lib/libcuda.so.1", "--folder", "/usr/lib"]
    args = ["gpuctk-hook", "createContainer", *link]
    off = ["--disable-hook", "create-symlinks", "--disable-hook", "enable-cuda-compat"]
    prep = shimroot.prepare({"hooks": [{**HOOK, "args": [*args, *off]}]})  # type: ignore[list-item]
    assert prep["links"] == {} and prep["folders"] == ["/usr/lib"] and prep["compat"] is False
    prep = shimroot.prepare({"hooks": [{**HOOK, "args": args}]})  # type: ignore[list-item]
    assert prep["links"] and prep["compat"] is True
    odd = shimroot.prepare({"hooks": [{**HOOK, "args": [*args, "--disable-hook", "x"]}]})  # type: ignore[list-item]
    assert "fallback" in odd


def test_the_hook_takes_the_verb_and_the_option() -> None:
    values, _parts, ignored = hook_main.parse("createContainer", ["--disable-hook", NAME])
    assert values["disable-hook"] == [NAME] and not ignored
    values, _parts, ignored = hook_main.parse(NAME, [])
    assert not ignored


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("unshare"), reason="mounts need root")
@pytest.mark.parametrize("dev", ["tmpfs", "image", "read-only", "shared", "host"])
def test_protect_binds_a_read_only_copy_in_a_mount_namespace(tmp_path: Path, dev: str) -> None:
    """protect() for real, in a private mount namespace: the root's params file (a plain file
    on a tmpfs at the root's /proc here) shows 0, cannot be written, and no copy is left in
    /run or the root's /dev. The copy is made in the root's /dev where it is a tmpfs of its
    own (a runtime's: what a user namespace's root can write; one others may write too: the
    copy is bound from its descriptor), else (read-only, the host's /dev) on a tmpfs in /run.
    Without a mount at /proc (the image's own folder) it does nothing."""
    root = tmp_path / "root"
    (root / "proc/driver/nvidia").mkdir(parents=True)
    (root / "proc/driver/nvidia/params").write_bytes(PARAMS)
    (root / "dev").mkdir()
    proc = str(root / "proc")
    mount_dev = {  # a runtime's /dev; one gpuctk-hook cannot write; one others may; the host's
        "tmpfs": f"mount -t tmpfs -o mode=0755 gpuctk-test-dev {root / 'dev'}",
        "read-only": f"mount -t tmpfs -o mode=0755,ro gpuctk-test-dev {root / 'dev'}",
        "shared": f"mount -t tmpfs -o mode=1777 gpuctk-test-dev {root / 'dev'}",
        "host": f"mount --bind /dev {root / 'dev'}",
    }.get(dev, "true")
    code = textwrap.dedent(f"""
        import os, subprocess
        from gpuctk import rootfs
        from gpuctk.hook.verbs import nodeprotect
        subprocess.run({mount_dev!r}, shell=True, check=True)
        fd = rootfs.open_root({str(root)!r})
        print(nodeprotect.protect(fd).split(":")[0])
        subprocess.run(["mount", "-t", "tmpfs", "tmpfs", {proc!r}], check=True)
        os.makedirs({proc!r} + "/driver/nvidia")
        with open({proc!r} + "/driver/nvidia/params", "wb") as f:
            f.write({PARAMS!r})
        print(nodeprotect.protect(fd))
        print(open({str(root)!r} + "/proc/driver/nvidia/params").read(), end="")
        try:
            open({str(root)!r} + "/proc/driver/nvidia/params", "w")
        except OSError as exc:
            print("refused", exc.errno)
        print(nodeprotect.protect(fd))
        print(sorted(os.listdir({str(root / "dev")!r})))
        for line in open("/proc/self/mountinfo"):
            f = line.split()
            if f[4].endswith("/nvidia/params"):  # the copy's folder, its mount's source
                print(f[3].startswith("/.gpuctk-params-"), f[f.index("-") + 2])
    """)
    done = subprocess.run(
        ["unshare", "-m", "--propagation", "private", sys.executable, "-c", code],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == "no procfs at /proc in the root (not a container's)", lines
    lines = lines[1:]
    assert "ModifyDeviceFiles: 0" in lines[0]
    assert lines[1:4] == ["Foo: 1", "ModifyDeviceFiles: 0", "DeviceFileUID: 0"]
    assert lines[4].startswith("refused")  # EACCES or EROFS
    assert "does not let" in lines[5]  # a second run finds 0: nothing more
    assert ".gpuctk-params-" not in lines[6]  # nothing left in the root's /dev
    in_dev = dev in ("tmpfs", "shared")
    assert lines[7:] == ["True gpuctk-test-dev" if in_dev else "False tmpfs"], lines
    assert (root / "proc/driver/nvidia/params").read_bytes() == PARAMS  # the host's view
    assert not [p for p in os.listdir("/run") if p.startswith(".gpuctk-params-")]


def test_protect_does_nothing_without_the_file(tmp_path: Path) -> None:
    from gpuctk import rootfs

    fd = rootfs.open_root(str(tmp_path))
    try:
        assert "no /proc/driver/nvidia/params" in nodeprotect.protect(fd)
    finally:
        os.close(fd)


def test_a_runtime_run_through_a_link_finds_the_hook_beside_the_real_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """gpuctk-runtime named by a link elsewhere (a `runc` that is a link to it): the entry names
    the gpuctk-cdi-hook beside the real file; with none anywhere, a warning says the container
    is not guarded and what to do."""
    real = tmp_path / "venv"
    real.mkdir()
    for name in ("gpuctk-runtime", "gpuctk-hook", facts.COMPILED_HOOK):
        (real / name).write_text("#!/bin/sh\n")
        (real / name).chmod(0o755)
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "runc").symlink_to(real / "gpuctk-runtime")
    monkeypatch.setattr(sys, "argv", [str(tmp_path / "bin" / "runc")])
    monkeypatch.setattr(nodeguard, "PACKAGED_HOOK", str(tmp_path / "absent"))
    got = nodeguard.guard({}, [], "hook", lambda _: None)
    assert [h["path"] for h in got["hooks"]] == [str(real / facts.COMPILED_HOOK)]
    (real / "gpuctk-hook").unlink()
    said: list[str] = []
    assert nodeguard.guard({}, [], "hook", lambda _: None, warn=said.append) == {}
    assert len(said) == 1 and "not guarded" in said[0] and "fix:" in said[0]


def test_a_folder_spec_with_ldconfig_path_is_still_its_own_guard() -> None:
    """nvidia-ctk's --ldconfig-path on a folder spec's entry: still the spec's own entry (it
    guards), so neither the Python create nor a plan adds a second one."""
    entry = {**HOOK, "path": "/usr/bin/gpuctk-cdi-hook", "args": [
        "gpuctk-cdi-hook", "createContainer", "--folder", "/usr/local/nvidia/lib64",
        "--ldconfig-path", "/sbin/ldconfig"]}  # fmt: skip
    edits: Any = {"hooks": [entry]}
    assert shimroot.gpuctk_hooks(edits) == [entry]
    out = shimroot.take_over({}, "/nonexistent", edits, lambda _: None, {}, protect="hook")
    assert out["hooks"] == [entry]


def test_the_config_takes_proc_root_and_reads_nothing_of_it() -> None:
    """`proc-root` in a file is accepted (a file that sets it keeps its containers starting),
    read by nothing; a key that is not one is still an error."""
    settings = config.parse('proc-root = "/proc"\n', "t.toml")
    assert not hasattr(settings, "proc_root")
    with pytest.raises(Exception, match="proc-roots"):
        config.parse('proc-roots = "/proc"\n', "t.toml")


@pytest.mark.parametrize(
    "args", [[NAME, "--root-fd", "3"], ["merge-ld-cache", "--image-fd", "3", "--entries-fd", "4"]]
)
def test_a_form_of_the_c_handed_back_says_the_c_is_older(args: list[str]) -> None:
    """gpuctk-cdi-hook's own forms reach gpuctk-hook only from an older gpuctk-cdi-hook beside
    it (one that hands what it does not know to gpuctk-hook): one line that says so and what
    to do, exit 1, never a merge or guard quietly skipped."""
    hook = Path(sys.executable).with_name("gpuctk-hook")
    done = subprocess.run([str(hook), *args], capture_output=True, text=True, timeout=60,
                          stdin=subprocess.DEVNULL, check=False)  # fmt: skip
    assert done.returncode == 1, done.stderr
    assert done.stderr.count("\n") == 1 and "an older build" in done.stderr
    assert "reinstall gpuctk" in done.stderr


@pytest.mark.parametrize("answer", ["empty", "older", "hangs"])
def test_a_merge_that_gives_no_cache_back_leaves_it_to_ldconfig(
    monkeypatch: pytest.MonkeyPatch, answer: str
) -> None:
    """No cache back from gpuctk-cdi-hook (an older one that hands the merge to gpuctk-hook,
    which refuses it; an empty answer; one that hangs): a ValueError, which the callers take
    as "leave the cache to ldconfig", never an empty cache written over the image's and never
    a container stopped for it."""
    from gpuctk.errors import GpuctkError
    from gpuctk.hook import compiled
    from gpuctk.hook.verbs import ldmerge

    def answered(args: list[str], fds: tuple[int, ...], what: str) -> Any:
        if answer == "hangs":
            raise GpuctkError(f"{what}: gpuctk-cdi-hook did not finish in 60 s (killed)")
        older = b"gpuctk-hook: error: merge-ld-cache ...: an older build ...\n"
        return compiled.Done(1 if answer == "older" else 0, b"", older if answer else b"")

    monkeypatch.setattr(compiled, "run", answered)
    with pytest.raises(ValueError) as got:
        ldmerge.merged(b"x", [])
    assert "\n" not in str(got.value) and "gpuctk-hook: error" not in str(got.value)
    want = {"empty": "no cache came back", "older": "an older build", "hangs": "did not finish"}
    assert want[answer] in str(got.value)


def test_the_c_is_run_with_only_what_it_is_given_and_bounded_in_time(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """gpuctk-cdi-hook as gpuctk-hook runs it (gpuctk.hook.compiled.run): an empty
    environment, /dev/null on stdin, the descriptors it is given under their numbers and no
    other; one that does not finish is killed and named."""
    from gpuctk.errors import GpuctkError
    from gpuctk.hook import compiled

    probe = tmp_path / "probe"
    probe.write_text(
        "#!/bin/sh\nenv | wc -l\nls /proc/self/fd | sort -n | tr '\\n' ' '\necho\n"
        'cat; echo "$@" >&2\n'
    )
    probe.chmod(0o755)
    monkeypatch.setattr(compiled, "program", lambda: str(probe))
    kept = os.open(str(tmp_path), os.O_PATH | os.O_CLOEXEC)
    other = os.open(str(tmp_path), os.O_PATH)  # inheritable: the spawn closes it all the same
    try:
        done = compiled.run(["a", "b"], (kept,), "a probe")
        assert os.get_inheritable(kept) is False  # as it was
    finally:
        os.close(other)
        os.close(kept)
    lines = done.stdout.decode().splitlines()
    assert done.returncode == 0 and done.stderr == b"a b\n"
    assert int(lines[0]) <= 1  # sh's own PWD at most
    fds = lines[1].split()  # ls's own listing descriptor among them
    assert fds[:3] == ["0", "1", "2"] and str(kept) in fds and str(other) not in fds
    for hang in ("exec sleep 30", "exec >&- 2>&-; exec sleep 30"):  # its output open, closed
        probe.write_text(f"#!/bin/sh\n{hang}\n")
        with pytest.raises(GpuctkError, match=r"did not finish in 0\.5 s"):
            compiled.run([], (), "a probe", timeout=0.5)
    probe.write_text("#!/bin/sh\ngrep SigIgn /proc/self/status\n")  # SIGPIPE (13): default
    assert signal.getsignal(signal.SIGPIPE) == signal.SIG_IGN  # Python's own, for this process
    ignored = int(compiled.run([], (), "a probe").stdout.split()[1], 16)
    assert not ignored & (1 << (signal.SIGPIPE - 1)) and not ignored & (1 << (signal.SIGXFSZ - 1))
    probe.write_text("#!/bin/sh\nexit 3\n")  # its exit status where SIGCHLD is ignored
    before = signal.signal(signal.SIGCHLD, signal.SIG_IGN)
    try:
        assert compiled.run([], (), "a probe").returncode == 3
        assert signal.getsignal(signal.SIGCHLD) == signal.SIG_IGN
    finally:
        signal.signal(signal.SIGCHLD, before)


def test_the_merge_runs_with_the_standard_streams_closed(tmp_path: Path) -> None:
    """A caller run with 0, 1 and 2 closed: the memory files take other numbers than the
    ones the spawn puts /dev/null and its pipes at, and the merge comes back whole."""
    code = (
        "import os, sys\n"
        "from gpuctk.cdi.node.ldcache import LdCacheEntry, build_ld_cache, parse_ld_cache\n"
        "from gpuctk.hook.verbs import ldmerge\n"
        "old = build_ld_cache([LdCacheEntry('libc.so.6', '/lib/libc.so.6', 0x0303)])\n"
        "new = [LdCacheEntry('libcuda.so.1', '/usr/local/nvidia/lib64/libcuda.so.1', 0x0303)]\n"
        "out = os.open(sys.argv[1], os.O_WRONLY | os.O_CREAT)\n"
        "for fd in (0, 1, 2):\n    os.close(fd)\n"
        "got = [e.key for e in parse_ld_cache(ldmerge.merged(old, new))]\n"
        "os.write(out, repr(got).encode())\n"
    )
    result = tmp_path / "out"
    done = subprocess.run([sys.executable, "-c", code, str(result)], capture_output=True,
                          timeout=60, check=False)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert result.read_text() == "['libcuda.so.1', 'libc.so.6']"
