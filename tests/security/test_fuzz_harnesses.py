"""libFuzzer over every reader of hostile input in gpuctk-cdi-hook (tests/fuzz/fuzz_*.c).

Each harness includes the product's C whole (hook/cdihook.c with ldcache.c and shimfront.c,
unchanged) and is built with Debian's clang, `-g -O1 -fsanitize=fuzzer,address,undefined
-fno-sanitize-recover=all`, and gpuctk_vocab.h as hook/cvocab.py writes it; then run for a
bounded time (HARNESSES: seconds each; GPUCTK_FUZZ_SECONDS sets one figure for all) from its
seed corpus, tests/fuzz/corpus/<name>/ (for the ld cache: this host's /etc/ld.so.cache and
caches ldconfig and gpuctk write here, made at test time). Any report fails the run: a
sanitizer's, a harness's own check (an abort), an input slower than -timeout, memory past
-rss_limit_mb; libFuzzer then writes the input as crash-* (or timeout-*, oom-*) in the test's
temp folder and the failure shows its report.

A planted out-of-bounds read (a bounds check dropped by an exact text substitution in a copy
of the reader's source) must be reported by the same kind of run: the harnesses find what
they are there to find.

Without clang and libFuzzer's runtime (apt install clang libclang-rt-dev) these tests skip,
saying so; in CI (CI=true, or GPUCTK_REQUIRE_FUZZ=1, which tests/run.sh sets) they fail.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from gpuctk.cdi.node.ldcache import LdCacheEntry, build_ld_cache
from gpuctk.hook import cvocab

REPO = Path(__file__).resolve().parents[2]
HOOK = REPO / "hook"
FUZZ = REPO / "tests" / "fuzz"
FLAGS = ["-g", "-O1", "-fsanitize=fuzzer,address,undefined", "-fno-sanitize-recover=all"]
INSTALL = "apt install clang libclang-rt-dev"
# each harness and the seconds it runs in CI (about 80 in all)
HARNESSES = {
    "json": 15,  # cdihook.c: the OCI state's bundle, config.json's root.path and capabilities
    "ldcache": 20,  # ldcache.c: the image's /etc/ld.so.cache, merged with a stage's
    "shim_config": 14,  # shimfront.c: config.json as the runtime's front reads and edits it
    "front_plan": 14,  # shimfront.c: the front plan file
    "params": 5,  # cdihook.c: /proc/driver/nvidia/params under the container's /proc
    "compat_names": 4,  # cdihook.c: file names in the image's /usr/local/cuda/compat
    "args": 6,  # cdihook.c and shimfront.c: the hook's and runc's arguments
}
# (the reader's file, the text that bounds its read, the same text without the bound, the
# function that reads past its input, the harness that must report it)
PLANTS = {
    "json-string": (
        "cdihook.c",
        "while (j->p < j->end && *j->p != '\"')",
        "while (*j->p != '\"')",
        "string",
        "json",
    ),
    "ldcache-string": (
        "ldcache.c",
        "size_t room = f->len - at < max + 1 ? f->len - at : max + 1;",
        "size_t room = max + 1;",
        "ldc_string",
        "ldcache",
    ),
}
PLANT_SECONDS = 120
SEED_CORPUS = re.compile(r"INFO: seed corpus: files: (\d+)")
DONE = re.compile(r"Done (\d+) runs in (\d+) second")


def required() -> bool:
    return os.environ.get("GPUCTK_REQUIRE_FUZZ") == "1" or os.environ.get("CI") == "true"


def seconds(name: str) -> int:
    return int(os.environ.get("GPUCTK_FUZZ_SECONDS") or HARNESSES[name])


def _no_fuzzer(why: str) -> None:
    if required():
        pytest.fail(f"{why}: CI runs the C fuzz harnesses ({INSTALL})")
    pytest.skip(f"{why} ({INSTALL})")


@pytest.fixture(scope="module")
def clang(tmp_path_factory: pytest.TempPathFactory) -> str:
    """Debian's clang, checked to link a libFuzzer harness with both sanitizers."""
    cc = shutil.which("clang")
    if not cc:
        _no_fuzzer("no clang")
    assert cc
    folder = tmp_path_factory.mktemp("clang-probe")
    probe = folder / "probe.c"
    probe.write_text(
        "#include <stddef.h>\n#include <stdint.h>\n"
        "int LLVMFuzzerTestOneInput(const uint8_t *d, size_t n) { (void)d; (void)n; return 0; }\n"
    )
    done = subprocess.run([cc, *FLAGS, "-o", str(folder / "probe"), str(probe)],
                          capture_output=True, text=True, check=False)  # fmt: skip
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or [f"exit {done.returncode}"])[-1]
        _no_fuzzer(f"clang cannot link a libFuzzer harness ({last})")
    return cc


def build(cc: str, name: str, source: Path, out: Path) -> Path:
    """tests/fuzz/fuzz_<name>.c against the product's C in `source`, into `out`."""
    include = out.parent / f"{out.name}.vocab"
    include.mkdir()
    cvocab.write(include)
    argv = [cc, *FLAGS, f"-I{source}", f"-I{include}", "-o", str(out),
            str(FUZZ / f"fuzz_{name}.c")]  # fmt: skip
    done = subprocess.run(argv, capture_output=True, text=True, check=False)
    assert done.returncode == 0, f"fuzz_{name}.c did not build:\n{done.stderr[-4000:]}"
    return out


@pytest.fixture(scope="module")
def harnesses(clang: str, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Every harness, built from the checkout's hook/*.c (two at a time)."""
    folder = tmp_path_factory.mktemp("fuzz-build")
    with ThreadPoolExecutor(max_workers=2) as pool:
        built = {n: pool.submit(build, clang, n, HOOK, folder / f"fuzz_{n}") for n in HARNESSES}
        return {n: f.result() for n, f in built.items()}


def ldcache_seeds(folder: Path) -> None:
    """Real caches: this host's (ldconfig made it), ones ldconfig writes over two of its
    libraries in the new and the old+new format, and one gpuctk.cdi.node.ldcache writes."""
    if Path("/etc/ld.so.cache").is_file():
        shutil.copyfile("/etc/ld.so.cache", folder / "host.cache")
    stage = [
        LdCacheEntry("libcuda.so.1", "/usr/local/nvidia/lib64/libcuda.so.1", 0x0303),
        LdCacheEntry("libcuda.so.1", "/usr/local/nvidia/lib/libcuda.so.1", 0x0003),
    ]
    (folder / "stage.cache").write_bytes(build_ld_cache(stage))
    host = Path("/usr/lib/x86_64-linux-gnu")
    libs = [host / n for n in ("libdl.so.2", "libutil.so.1") if (host / n).is_file()]
    ldconfig = shutil.which("ldconfig")
    for fmt in ("new", "compat"):
        root = folder.parent / f"root-{fmt}"
        (root / "opt/libs").mkdir(parents=True)
        (root / "etc").mkdir()
        (root / "etc/ld.so.conf").write_text("/opt/libs\n")
        for lib in libs:
            shutil.copyfile(lib, root / "opt/libs" / lib.name)
        if ldconfig and libs:
            subprocess.run([ldconfig, "-X", "-c", fmt, "-r", str(root)], check=True)
            shutil.copyfile(root / "etc/ld.so.cache", folder / f"ldconfig-{fmt}.cache")


def seed_corpus(name: str, tmp: Path) -> Path:
    """The harness's seeds: tests/fuzz/corpus/<name>/, and for the ld cache the real caches."""
    seeds = tmp / "seeds"
    seeds.mkdir()
    committed = FUZZ / "corpus" / name
    for path in sorted(committed.iterdir()) if committed.is_dir() else []:
        shutil.copyfile(path, seeds / path.name)
    if name == "ldcache":
        ldcache_seeds(seeds)
    assert any(seeds.iterdir()), f"no seeds for fuzz_{name}"
    return seeds


def fuzz(exe: Path, seeds: Path, tmp: Path, limit: int) -> subprocess.CompletedProcess[str]:
    """One bounded libFuzzer run: new inputs into tmp/work, never into the seeds; artifacts
    (crash-*, timeout-*, oom-*) into tmp; the shim harnesses' folders under tmp."""
    work = tmp / "work"
    work.mkdir(exist_ok=True)
    argv = [
        str(exe),
        f"-max_total_time={limit}",
        "-rss_limit_mb=2048",
        "-timeout=10",
        "-detect_leaks=0",  # a hand-over execs in the product: fuzz.h frees what it leaves
        f"-artifact_prefix={tmp}/",
        str(work),
        str(seeds),
    ]
    env = {**os.environ, "TMPDIR": str(tmp), "UBSAN_OPTIONS": "print_stacktrace=1"}
    return subprocess.run(argv, cwd=tmp, env=env, capture_output=True, text=True,
                          timeout=limit + 300, check=False)  # fmt: skip


def artifacts(tmp: Path) -> list[str]:
    return sorted(p.name for kind in ("crash", "timeout", "oom", "leak")
                  for p in tmp.glob(f"{kind}-*"))  # fmt: skip


@pytest.fixture
def tmp(tmp_path: Path) -> Iterator[Path]:
    tmp_path.chmod(0o700)  # the shim harnesses' state folder must be this user's alone
    yield tmp_path


@pytest.mark.parametrize("name", sorted(HARNESSES))
def test_harness_runs_without_a_report(name: str, harnesses: dict[str, Path], tmp: Path) -> None:
    seeds = seed_corpus(name, tmp)
    done = fuzz(harnesses[name], seeds, tmp, seconds(name))
    found = artifacts(tmp)
    assert done.returncode == 0 and not found, (
        f"fuzz_{name} reported {found or done.returncode}:\n{done.stderr[-6000:]}"
    )
    loaded = SEED_CORPUS.search(done.stderr)
    assert loaded and int(loaded.group(1)) >= len(list(seeds.iterdir())), done.stderr[-2000:]
    runs = DONE.search(done.stderr)
    assert runs and int(runs.group(1)) > 0, done.stderr[-2000:]


@pytest.mark.parametrize("plant", sorted(PLANTS))
def test_a_planted_out_of_bounds_read_is_reported(plant: str, clang: str, tmp: Path) -> None:
    file, bounded, unbounded, function, name = PLANTS[plant]
    source = tmp / "hook"
    source.mkdir()
    for path in HOOK.glob("*.c"):
        shutil.copyfile(path, source / path.name)
    text = (source / file).read_text()
    assert text.count(bounded) == 1, (
        f"hook/{file} does not hold `{bounded}` exactly once: plant {plant!r} anew"
    )
    (source / file).write_text(text.replace(bounded, unbounded))
    exe = build(clang, name, source, tmp / f"fuzz_{name}-planted")
    done = fuzz(exe, seed_corpus(name, tmp), tmp, PLANT_SECONDS)
    report = done.stderr[-6000:]
    assert done.returncode != 0 and artifacts(tmp), f"the planted bug went unreported:\n{report}"
    assert "ERROR: AddressSanitizer: heap-buffer-overflow" in done.stderr, report
    assert re.search(rf"#\d+ 0x[0-9a-f]+ in {function} {re.escape(str(source / file))}:",
                     done.stderr), report  # fmt: skip
