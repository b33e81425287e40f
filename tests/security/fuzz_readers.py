"""atheris fuzz harness for the ld.so.cache parser and the ELF readers (gpuctk.cdi): the SONAME
reader, and the note section reader with the CUDA forward compatibility note parser.

Both read files an image or a driver root may hand us; the documented failure is ValueError
(OSError for the file itself). Anything else that escapes is a crash: atheris stops, prints the
input and writes it as `crash-<sha1>` in the working folder.

    .venv/bin/python tests/security/fuzz_readers.py -atheris_runs=200000 [-max_total_time=60]
        [CORPUS_DIR ...]

The first input byte chooses the target (even: ld.so.cache, odd: ELF); the seed corpus built
by `seeds(dir)` holds the host's ld.so.cache and a few small ELF files, each with both bytes.
tests/security/test_fuzz.py runs it time-bounded in CI.
"""

from __future__ import annotations

import os
import sys

import atheris

with atheris.instrument_imports():
    from gpuctk.cdi.node import elf, ldcache
    from gpuctk.hook.verbs import cudacompat

SEED_FILES = (
    "/etc/ld.so.cache",
    "/usr/lib/x86_64-linux-gnu/libdl.so.2",
    "/usr/lib/x86_64-linux-gnu/libutil.so.1",
    "/usr/lib/x86_64-linux-gnu/libpthread.so.0",
)
MAX_SEED = 256 * 1024


def one_input(data: bytes) -> None:
    if not data:
        return
    body = data[1:]
    if data[0] % 2 == 0:
        try:
            entries = ldcache.parse_ld_cache(body)
        except ValueError:
            return
        for entry in entries:
            assert isinstance(entry.key, str) and isinstance(entry.value, str)
        return
    fd = os.memfd_create("fuzz-elf", os.MFD_CLOEXEC)
    try:
        os.write(fd, body)
        try:  # the CUDA forward compatibility note: section headers, then the note's JSON
            note = elf.read_note_section(fd, cudacompat.NOTE_SECTION, cudacompat.MAX_NOTE)
        except ValueError:
            note = None
        if note is not None:
            drivers = cudacompat.parse_note(*note)
            assert drivers is None or all(isinstance(d, int) for d in drivers)
        try:
            info = elf.read_elf_fd(fd)
        except ValueError:
            return
        assert info.elf_class in (32, 64)
        assert info.soname is None or isinstance(info.soname, str)
    finally:
        os.close(fd)


def seeds(directory: str) -> int:
    """Write the seed corpus into `directory`; returns how many files."""
    count = 0
    for path in SEED_FILES:
        try:
            with open(path, "rb") as f:
                data = f.read(MAX_SEED)
        except OSError:
            continue
        for selector in (b"\x00", b"\x01"):
            with open(os.path.join(directory, f"seed-{count}"), "wb") as out:
                out.write(selector + data)
            count += 1
    return count


def main() -> None:
    atheris.Setup(sys.argv, one_input)
    atheris.Fuzz()


if __name__ == "__main__":
    main()
