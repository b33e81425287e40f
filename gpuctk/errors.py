"""One exception tree for the whole tool.

Every error a user can cause or fix carries a one-line, user-facing message and an exit code.
The CLI edge (gpuctk.cli.main, the shim and the hook entry points) turns it into one line on
stderr and that exit code; anything else is a bug and prints a traceback only with --debug.

Exit codes (README.md's "Exit codes" table says the same; tests/unit/test_cli_errors.py checks):
    0  success
    1  generic failure (the shim and the hook follow runc: 1 for every error but a usage error)
    2  usage: an unknown flag or command, a missing argument, a value the tool cannot use
    3  NVML: library missing, driver not loaded, a call failed
    4  input: driver root, dev root or another input unreadable or malformed
    5  output cannot be written
    6  no NVIDIA GPU found: nothing written (an engine would reject a spec with no devices)
    7  validation failed (`gpuctk cdi validate`, config files)
    8  a device request cannot be satisfied (unknown device, unmet `NVIDIA_REQUIRE_*`)

A usage error gets a second line, `Try 'gpuctk COMMAND --help'.` (gpuctk.cli.main).
"""

from __future__ import annotations

EXIT_OK = 0
EXIT_FAILURE = 1
EXIT_USAGE = 2
EXIT_NVML = 3
EXIT_INPUT = 4
EXIT_OUTPUT = 5
EXIT_NO_DEVICES = 6
EXIT_INVALID = 7
EXIT_REQUEST = 8


class GpuctkError(Exception):
    """Base of every expected error: a message for the user and an exit code."""

    exit_code: int = EXIT_FAILURE

    def __init__(self, message: str, *, exit_code: int | None = None) -> None:
        super().__init__(message)
        self.message = message
        if exit_code is not None:
            self.exit_code = exit_code

    def __str__(self) -> str:
        return self.message


class UsageError(GpuctkError):
    """A flag or argument has a value the tool cannot use."""

    exit_code = EXIT_USAGE


class NvmlError(GpuctkError):
    """NVML could not be loaded, initialised or queried."""

    exit_code = EXIT_NVML


class InputError(GpuctkError):
    """An input path (driver root, dev root, spec, config.json) is missing or unreadable."""

    exit_code = EXIT_INPUT


class TrustError(InputError):
    """A file or folder that someone other than root (or this user) could have written or
    swapped; the message names the component at fault and the fix (gpuctk.fs)."""


class OutputError(GpuctkError):
    """A file could not be written."""

    exit_code = EXIT_OUTPUT


class NoDevicesError(GpuctkError):
    """Discovery found no NVIDIA GPU."""

    exit_code = EXIT_NO_DEVICES


class ValidationError(GpuctkError):
    """A spec or configuration file is invalid; `problems` lists every finding."""

    exit_code = EXIT_INVALID

    def __init__(self, message: str, problems: list[str] | None = None) -> None:
        super().__init__(message)
        self.problems = list(problems or [])


class RequestError(GpuctkError):
    """A container asked for devices that cannot be given (unknown name, unmet requirement)."""

    exit_code = EXIT_REQUEST
