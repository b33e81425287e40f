#!/usr/bin/env bash
# The one test command (README's second set-up command, and what .ci/run calls).
# Installs everything the tests need on a fresh Debian 12 machine (run as root):
#   - apt: runc, crun, podman, containerd, gcc (for the fake libnvidia-ml.so.1), iproute2,
#     the shell linter (shellcheck), clang with libFuzzer (the C fuzz harnesses),
#     python3 + python3-venv (the deb's venv is built on Debian's python3)
#   - Debian's non-free component, so that the NVIDIA 535 driver packages can be downloaded
#     for the driver-root fixture (tests/fixtures/driver_root.py)
#   - a virtual environment in .venv with gpuctk (editable) and the test tools
# then runs ruff, shellcheck, mypy (strict) and pytest (unit + integration).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD

log() { printf '\n==> %s\n' "$*"; }

need_apt=()
for cmd in runc crun podman containerd ctr gcc ip mkfs.ext4 shellcheck; do
    command -v "$cmd" >/dev/null 2>&1 || need_apt+=("$cmd")
done
# the deb and `gpuctk install` tests build their venv with Debian's own python3 (the package
# depends on it), whatever Python runs the tests
/usr/bin/python3 -c 'import ensurepip, venv' >/dev/null 2>&1 || need_apt+=(python3-venv)
# the C fuzz harnesses (tests/security/test_fuzz_harnesses.py): Debian's clang and the
# libFuzzer and sanitizer runtimes, which ship apart from it (libclang-rt-dev)
fuzz_probe='int LLVMFuzzerTestOneInput(const char *d, unsigned long n) { (void)d; (void)n; return 0; }'
if ! printf '%s\n' "$fuzz_probe" | clang -x c -fsanitize=fuzzer,address,undefined -o /dev/null - \
    >/dev/null 2>&1; then
    need_apt+=(clang libclang-rt-dev)
fi
src=/etc/apt/sources.list.d/debian.sources
nonfree_missing=0
if [ -f "$src" ] && ! grep -q 'non-free' "$src"; then nonfree_missing=1; fi
if [ "${#need_apt[@]}" -gt 0 ] || [ "$nonfree_missing" = 1 ]; then
    if [ "$(id -u)" != 0 ]; then
        echo "tests/run.sh: missing ${need_apt[*]} and not root: install them or rerun as root" >&2
        exit 1
    fi
    if [ "$nonfree_missing" = 1 ]; then
        log "enabling Debian's non-free component (NVIDIA driver packages for fixtures)"
        sed -i 's/^Components: main$/Components: main contrib non-free non-free-firmware/' "$src"
    fi
    log "apt-get install (runtimes and build tools)"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends \
        runc crun podman containerd gcc libc6-dev iproute2 e2fsprogs \
        uidmap fuse-overlayfs slirp4netns conmon catatonit python3 python3-venv shellcheck \
        clang libclang-rt-dev >/dev/null
fi

PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
    log "creating .venv"
    "$PY" -m venv .venv
fi
log "installing gpuctk and test tools into .venv"
# an editable install leaves out setup.py's gpuctk-cdi-hook (setuptools installs no data for
# it): the one recipe (hook/cbuild.py) builds it beside gpuctk-hook, as a regular install puts
# it, into a temp file renamed into place; no compiler, or a compile error, stops here
.venv/bin/python -m pip install -q --disable-pip-version-check -e '.[test]'
log "building gpuctk-cdi-hook into .venv/bin"
.venv/bin/python -m gpuctk.hook.cbuild .venv/bin/gpuctk-cdi-hook

log "ruff"
.venv/bin/ruff check .
.venv/bin/ruff format --check .

log "shellcheck"
# the runtime's sh front as gpuctk.install.launchers writes it, and every shell script in the tree
front=$(mktemp -d)
.venv/bin/python -m gpuctk.install.launchers "$front" >/dev/null
shellcheck -s sh "$front/gpuctk-runtime"
rm -rf "$front"
shellcheck .ci/run tests/run.sh tests/fixtures/stray_nvidiactl.sh packaging/deb/postinst \
    packaging/deb/postrm packaging/deb/prerm

log "mypy (strict)"
# mypy cannot follow setuptools' folder mapping (cdi/ -> gpuctk/cdi, ...), so it checks the
# package through a tree of links laid out as installed. The map is pyproject.toml's package-dir,
# listed parents first: the root package's files are linked one by one (its subpackages go
# beside them), every other package's folder as a whole.
tree=build/mypy-tree
rm -rf "$tree"
layout=$(.venv/bin/python tests/fixtures/layout.py)
while read -r package folder; do
    dest=$tree/${package//.//}
    if [ "$package" = "${package%%.*}" ]; then
        mkdir -p "$dest"
        for f in "$folder"/*.py "$folder"/py.typed; do ln -s "$ROOT/$f" "$dest/"; done
    else
        ln -s "$ROOT/$folder" "$dest"
    fi
done <<<"$layout"
(cd "$tree" && "$ROOT/.venv/bin/mypy" --config-file "$ROOT/pyproject.toml" -p gpuctk)

log "pytest"
# In CI the Debian driver root must be built: fail, do not skip, if it cannot be. So must the
# sanitized build of gpuctk-cdi-hook (tests/fixtures/cfront): the C tests' hostile cases run
# through it as well as through the product's build. So must the C fuzz harnesses (clang).
export GPUCTK_REQUIRE_DRIVER_ROOT=1 GPUCTK_REQUIRE_IMAGES=1 GPUCTK_REQUIRE_SANITIZERS=1
export GPUCTK_REQUIRE_FUZZ=1
exec .venv/bin/pytest "$@"
