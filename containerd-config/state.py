"""The record a gpuctk drop-in carries about what configure changed outside it.

The drop-in's header has one line `# gpuctk-state: {json}`: which top-level keys configure added
to the main config, whether it created the main config, and the other files it wrote (the base
spec of --mode hook), and the other tools' drop-ins that `--take-over` disabled (renamed to
`<file>.gpuctk-disabled`). unconfigure reads it to undo exactly that. A file without the line is not
gpuctk's, and neither command overwrites or removes it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from gpuctk.errors import OutputError

MARKER = "# gpuctk-state: "


@dataclass(frozen=True)
class State:
    added: tuple[str, ...] = ()
    created: bool = False
    files: tuple[str, ...] = field(default=())
    dirs: tuple[str, ...] = field(default=())
    disabled: tuple[str, ...] = field(default=())  # drop-ins --take-over renamed away

    def line(self) -> str:
        data = {
            "added": list(self.added),
            "created": self.created,
            "dirs": list(self.dirs),
            "files": list(self.files),
        }
        if self.disabled:  # only then: drop-ins written before stay byte for byte the same
            data["disabled"] = list(self.disabled)
        return MARKER[2:] + json.dumps(data, sort_keys=True)

    def merged(self, newer: State) -> State:
        """What is recorded after a re-run: earlier additions stay ours."""
        added = tuple(dict.fromkeys((*self.added, *newer.added)))
        dirs = tuple(dict.fromkeys((*self.dirs, *newer.dirs)))
        disabled = tuple(dict.fromkeys((*self.disabled, *newer.disabled)))
        return State(added, self.created or newer.created, newer.files, dirs, disabled)


def parse(text: str) -> State | None:
    """The state recorded in a file's text, or None when it has no gpuctk-state line."""
    for line in text.splitlines():
        if line.startswith(MARKER):
            try:
                data = json.loads(line[len(MARKER) :])
                return State(
                    tuple(str(k) for k in data.get("added", [])),
                    bool(data.get("created", False)),
                    tuple(str(f) for f in data.get("files", [])),
                    tuple(str(d) for d in data.get("dirs", [])),
                    tuple(str(d) for d in data.get("disabled", [])),
                )
            except (ValueError, AttributeError, TypeError):
                return None
    return None


def read_owned(path: str, what: str) -> tuple[str | None, State | None]:
    """The drop-in's text and state; refuse a file that exists and is not gpuctk's."""
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except (FileNotFoundError, NotADirectoryError):
        return None, None
    except IsADirectoryError:
        raise OutputError(f"cannot write {what} {path}: it is a directory") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise OutputError(f"cannot read {what} {path}: {exc}") from None
    found = parse(text)
    if found is None:
        raise OutputError(
            f"{path} exists and was not written by gpuctk (no `{MARKER.strip()}` line): "
            "refusing to overwrite or remove it; choose another --drop-in"
        )
    return text, found
