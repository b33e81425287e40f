"""gpuctk-runtime's remembered plans (gpuctk.hook.shim.plans): a request resolved once in settled
specs is not resolved again, and never after the specs, the request or the cache's trust
changed. Through the real shim, as test_shim.py drives it, each test with its own state
folder; the specs are left to settle (SETTLE_NS) before the first create."""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
from test_shim import LIB, Env, base_config, make_spec, mounts

from gpuctk.cdi.specs import speccache
from gpuctk.hook.shim import plans as plans_mod

REUSED = "the request's plan remembered in"


class PlanEnv(Env):
    def __init__(self, tmp: Path) -> None:
        super().__init__(tmp)
        self.state = tmp / "state"
        self.debug_log = tmp / "debug.log"

    def environ(self) -> dict[str, str]:
        return {**super().environ(), "GPUCTK_STATE_DIR": str(self.state)}

    def run(self, *args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
        self.debug_log.write_text("")
        return super().run("--debug", "--log", str(self.debug_log), *args, cwd=cwd)

    def create_with(self, *env: str) -> dict[str, Any]:
        self.write_config(base_config(list(env)))
        proc = self.create()
        assert proc.returncode == 0, proc.stderr
        return self.seen()

    def reused(self) -> bool:
        return REUSED in self.debug_log.read_text()


def plan_files(penv: PlanEnv) -> list[Path]:
    folder = penv.state / "plans"
    return sorted(folder.iterdir()) if folder.exists() else []


def settle() -> None:
    time.sleep(speccache.SETTLE_NS / 1e9 + 0.1)


@pytest.fixture
def penv(tmp_path: Path) -> PlanEnv:
    return PlanEnv(tmp_path)


def test_second_create_takes_the_plan_with_the_same_result(penv: PlanEnv) -> None:
    settle()
    first = penv.create_with("NVIDIA_VISIBLE_DEVICES=0")
    assert not penv.reused()
    (plan,) = plan_files(penv)
    assert plan.stat().st_mode & 0o777 == 0o600
    assert (penv.state / "plans").stat().st_mode & 0o777 == 0o700
    second = penv.create_with("NVIDIA_VISIBLE_DEVICES=0")
    assert penv.reused()
    assert second == first
    assert "injected nvidia.com/gpu=0" in penv.log.read_text()


def test_each_request_has_its_own_plan(penv: PlanEnv) -> None:
    settle()
    cuda = f"{LIB}/libcuda.so.535.309.01"
    for _ in range(2):
        utility = penv.create_with("NVIDIA_VISIBLE_DEVICES=0", "NVIDIA_DRIVER_CAPABILITIES=utility")
        assert cuda not in mounts(utility)
        default = penv.create_with("NVIDIA_VISIBLE_DEVICES=0")
        assert cuda in mounts(default)
        one = penv.create_with("NVIDIA_VISIBLE_DEVICES=1")
        assert "/dev/nvidia1" in [d["path"] for d in one["linux"]["devices"]]
    assert penv.reused()


def test_a_rewritten_spec_is_read_again(penv: PlanEnv) -> None:
    settle()
    penv.create_with("NVIDIA_VISIBLE_DEVICES=0")
    assert "GPUCTK_TEST=2" not in penv.create_with("NVIDIA_VISIBLE_DEVICES=0")["process"]["env"]
    assert penv.reused()
    spec = make_spec()
    spec["containerEdits"]["env"].append("GPUCTK_TEST=2")
    path = penv.cdi / "nvidia.json"
    path.write_text(json.dumps(spec))  # in place: same inode, new mtime/ctime
    seen = penv.create_with("NVIDIA_VISIBLE_DEVICES=0")
    assert not penv.reused() and "GPUCTK_TEST=2" in seen["process"]["env"]


def test_a_new_spec_file_in_the_dir_is_read(penv: PlanEnv) -> None:
    settle()
    penv.create_with("NVIDIA_VISIBLE_DEVICES=0")
    penv.create_with("NVIDIA_VISIBLE_DEVICES=0")
    assert penv.reused()
    (penv.cdi / "zz-copy.json").write_text(json.dumps(make_spec()))  # the dir changed
    penv.write_config(base_config(["NVIDIA_VISIBLE_DEVICES=0"]))
    proc = penv.create()
    assert proc.returncode == 1 and "defined by more than one spec" in proc.stderr
    (penv.cdi / "zz-copy.json").unlink()
    penv.create_with("NVIDIA_VISIBLE_DEVICES=0")
    assert not penv.reused()


def test_unsettled_specs_are_not_remembered(penv: PlanEnv) -> None:
    for _ in range(2):  # specs written just now: each create resolves in full
        penv.create_with("NVIDIA_VISIBLE_DEVICES=0")
        assert not penv.reused()
    assert not plan_files(penv)


def test_failures_are_not_remembered(penv: PlanEnv) -> None:
    settle()
    for _ in range(2):
        penv.write_config(base_config(["NVIDIA_VISIBLE_DEVICES=7"]))
        proc = penv.create()
        assert proc.returncode == 1 and "nvidia.com/gpu=7" in proc.stderr
        assert not (penv.record / "argv").exists()
    assert not plan_files(penv)


def test_unmet_requirement_fails_every_time(penv: PlanEnv) -> None:
    settle()
    penv.create_with("NVIDIA_VISIBLE_DEVICES=0", "NVIDIA_REQUIRE_CUDA=cuda>=12.0")
    penv.create_with("NVIDIA_VISIBLE_DEVICES=0", "NVIDIA_REQUIRE_CUDA=cuda>=12.0")
    assert penv.reused()
    for _ in range(2):
        penv.write_config(
            base_config(["NVIDIA_VISIBLE_DEVICES=0", "NVIDIA_REQUIRE_CUDA=cuda>=13.0"])
        )
        proc = penv.create()
        assert proc.returncode == 1 and "cuda>=13.0" in proc.stderr


@pytest.mark.parametrize("change", ["group-writable", "world-writable", "foreign owner"])
def test_a_cache_others_could_write_is_ignored(penv: PlanEnv, change: str) -> None:
    settle()
    penv.create_with("NVIDIA_VISIBLE_DEVICES=0")
    (cache,) = plan_files(penv)
    if change == "foreign owner":
        os.chown(cache, os.geteuid() + 1000, -1)
    else:
        cache.chmod(0o620 if change == "group-writable" else 0o602)
    penv.create_with("NVIDIA_VISIBLE_DEVICES=0")
    assert not penv.reused()


def test_a_stale_plan_file_is_never_used(penv: PlanEnv, tmp_path: Path) -> None:
    """A plan names its world: a cache copied from other spec dirs is not used here."""
    settle()
    penv.create_with("NVIDIA_VISIBLE_DEVICES=0")
    other = PlanEnv(tmp_path / "other") if (tmp_path / "other").mkdir() is None else None
    assert other is not None
    (other.state / "plans").mkdir(mode=0o700, parents=True)
    other.state.chmod(0o700)
    (plan,) = plan_files(penv)
    (other.state / "plans" / plan.name).write_bytes(plan.read_bytes())
    (other.state / "plans" / plan.name).chmod(0o600)
    other.create_with("NVIDIA_VISIBLE_DEVICES=0")
    assert not other.reused()


def test_spec_cache_switch_turns_plans_off(tmp_path: Path) -> None:
    assert plans_mod.Plans.for_this_process(["/etc/cdi"], {"GPUCTK_SPEC_CACHE": "0"}) is None
    got = plans_mod.Plans.for_this_process(["/x"], {"GPUCTK_STATE_DIR": str(tmp_path)})
    assert got is not None and got.path == str(tmp_path / "plans")


def test_snapshot_is_none_until_settled(tmp_path: Path) -> None:
    specs = tmp_path / "cdi"
    specs.mkdir()
    (specs / "a.json").write_text("{}")
    state = tmp_path / "state"
    p = plans_mod.Plans(str(state), [str(specs), str(tmp_path / "missing")])
    assert p.snapshot() is None
    assert not p.offer(("k",), p.snapshot(), {"edits": {}, "notes": [], "prep": {}})
    settle()
    world = p.snapshot()
    assert world is not None and p.offer(("k",), world, {"edits": {}, "notes": [], "prep": {}})
    again = plans_mod.Plans(str(state), [str(specs), str(tmp_path / "missing")])
    assert again.get(("k",)) == {"edits": {}, "notes": [], "prep": {}}
    assert plans_mod.Plans(str(state), [str(specs)]).get(("k",)) is None  # other dirs
    os.chmod(specs, 0o755 if (specs.stat().st_mode & 0o777) != 0o755 else 0o750)
    assert plans_mod.Plans(str(state), [str(specs), str(tmp_path / "missing")]).get(("k",)) is None


@pytest.mark.parametrize(
    "env",
    [
        {},
        {"PATH": "/bin", "NVIDIA_DRIVER_CAPABILITIES": "utility"},
        {"CUDA_VERSION": "12.2.0"},
        {"NVIDIA_REQUIRE_CUDA": "cuda>=12.0", "NVIDIA_DISABLE_REQUIRE": "true"},
        {"NVIDIA_REQUIRE_ARCH": "sm_90 sm_80"},
    ],
)
def test_the_key_holds_what_require_would_check(env: dict[str, str]) -> None:
    from gpuctk.hook.requests.devices import Request
    from gpuctk.hook.requests.require import requirements

    req = Request(["nvidia.com/gpu=0"], source="env", kind="nvidia.com/gpu")
    key = plans_mod.key_of(req, env)
    assert key == (
        "nvidia.com/gpu", False, ("nvidia.com/gpu=0",), env.get("NVIDIA_DRIVER_CAPABILITIES"),
        tuple(requirements(env)),
    )  # fmt: skip


def test_a_spec_path_that_cannot_be_looked_at_means_no_world(tmp_path: Path) -> None:
    specs = tmp_path / "cdi"
    specs.mkdir()
    (specs / "a.json").write_text("{}")
    state = tmp_path / "state"
    settle()
    p = plans_mod.Plans(str(state), [str(specs)])
    world = p.snapshot()
    assert world is not None and p.offer(("k",), world, {"edits": {}, "notes": [], "prep": {}})
    (specs / "a.json").unlink()
    (specs / "a.json").symlink_to("a.json")  # stat: ELOOP, neither missing nor a file
    again = plans_mod.Plans(str(state), [str(specs)])
    assert again.get(("k",)) is None  # not an internal error on the create path
    assert again.snapshot() is None


def test_plans_past_the_bound_evict_the_oldest(tmp_path: Path) -> None:
    specs = tmp_path / "cdi"
    specs.mkdir()
    (specs / "a.json").write_text("{}")
    state = tmp_path / "state"
    settle()
    p = plans_mod.Plans(str(state), [str(specs)])
    world = p.snapshot()
    total = plans_mod.MAX_PLANS + 5
    for n in range(total):
        assert p.offer(("k", n), world, {"n": n})
        # distinct mtimes on a coarse clock
        os.utime(state / "plans" / plans_mod.file_name(("k", n)), ns=(n, n + 1))
    names = os.listdir(state / "plans")
    assert len(names) == plans_mod.MAX_PLANS
    kept = {n for n in range(total) if p.get(("k", n)) == {"n": n}}
    assert kept == set(range(total - plans_mod.MAX_PLANS, total))


def test_a_plan_file_holding_another_key_is_not_used(tmp_path: Path) -> None:
    """Two keys whose file names collide: the key inside the file tells them apart."""
    specs = tmp_path / "cdi"
    specs.mkdir()
    (specs / "a.json").write_text("{}")
    state = tmp_path / "state"
    settle()
    p = plans_mod.Plans(str(state), [str(specs)])
    assert p.offer(("a",), p.snapshot(), {"edits": {}})
    os.rename(
        state / "plans" / plans_mod.file_name(("a",)),
        state / "plans" / plans_mod.file_name(("b",)),
    )
    assert p.get(("b",)) is None and p.get(("a",)) is None
