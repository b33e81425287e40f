"""TOML helpers and main-config edits: merge rules, deterministic output, comments kept."""

from __future__ import annotations

import tomllib

import pytest

from gpuctk.containerd import imports, mainconfig, tomlfiles
from gpuctk.errors import ValidationError


def test_deep_merge_follows_containerd_2_rules() -> None:
    # containerd's TestMergingPluginsWithTwoCriRuntime*: tables merge key by key, a later
    # scalar wins, an array is replaced (not appended).
    runc = {
        "runtimes": {"runc": {"runtime_type": "io.containerd.runc.v2", "pod_annotations": ["a"]}}
    }
    nvidia = {
        "default_runtime_name": "nvidia",
        "runtimes": {
            "nvidia": {"options": {"BinaryName": "/x"}},
            "runc": {"pod_annotations": ["d"]},
        },
    }
    merged = tomlfiles.deep_merge(runc, nvidia)
    assert merged == {
        "runtimes": {
            "runc": {"runtime_type": "io.containerd.runc.v2", "pod_annotations": ["d"]},
            "nvidia": {"options": {"BinaryName": "/x"}},
        },
        "default_runtime_name": "nvidia",
    }
    assert runc["runtimes"]["runc"]["pod_annotations"] == ["a"]  # inputs untouched


def test_dumps_tables_is_valid_deterministic_and_skips_empty_parents() -> None:
    data = {
        "version": 2,
        "plugins": {
            "io.containerd.grpc.v1.cri": {
                "containerd": {"runtimes": {"nvidia": {"options": {"BinaryName": 'a"b'}}}},
                "cdi_spec_dirs": ["/etc/cdi"],
                "empty": {},
            }
        },
    }
    text = tomlfiles.dumps_tables(data, ["header", ""])
    assert text == tomlfiles.dumps_tables(data, ["header", ""])
    assert text.startswith("# header\n#\n\nversion = 2\n")
    assert "[plugins]\n" not in text
    assert '[plugins."io.containerd.grpc.v1.cri".empty]' in text
    assert tomllib.loads(text) == data


def test_parse_error_names_file_and_line() -> None:
    with pytest.raises(ValidationError, match=r"/x/config.toml: not valid TOML: .*line 2"):
        tomlfiles.parse("version = 2\n[plugins\n", "/x/config.toml")


ORIGINAL = """\
# site containerd config
version = 2   # keep
root = "/var/lib/containerd"

# the CRI plugin
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "x"
"""


@pytest.mark.parametrize(
    "text",
    [
        ORIGINAL,
        ORIGINAL.replace("version = 2   # keep\n", ""),  # no version, no plugins: see below
        'imports = [\n  "/etc/containerd/other.toml",  # theirs\n]\nversion = 2\n',
        "version = 2",  # no final newline
        "",
    ],
)
def test_add_then_remove_import_restores_bytes(text: str) -> None:
    if "plugins" in text and "version" not in text:
        text = text.replace('[plugins."io.containerd.grpc.v1.cri"]\n  sandbox_image = "x"\n', "")
    edit = mainconfig.add_import(
        "/etc/containerd/config.toml", text, "/etc/containerd/conf.d/9.toml", 2
    )
    data = tomllib.loads(edit.text)
    assert data["imports"][-1] == "/etc/containerd/conf.d/9.toml"
    assert data["version"] == tomllib.loads(text).get("version", 2)
    if "# site containerd config" in text:
        assert edit.text.startswith("# site containerd config\n")  # nothing moved
    back = mainconfig.remove_import(
        "/etc/containerd/config.toml", edit.text, "/etc/containerd/conf.d/9.toml", edit.added
    )
    assert back == text


def test_import_inserted_after_version_line_not_inside_a_table() -> None:
    edit = mainconfig.add_import("/c/config.toml", ORIGINAL, "/c/d/9.toml", 2)
    assert edit.added == ("imports",)
    lines = edit.text.splitlines()
    assert lines[1] == "version = 2   # keep"
    assert lines[2] == 'imports = ["/c/d/9.toml"]'


def test_glob_import_already_covers_the_drop_in() -> None:
    text = 'version = 2\nimports = ["conf.d/*.toml"]\n'
    edit = mainconfig.add_import(
        "/etc/containerd/config.toml", text, "/etc/containerd/conf.d/99-gpuctk.toml", 2
    )
    assert edit.text == text and edit.added == ()


def test_created_main_config() -> None:
    edit = mainconfig.add_import("/c/config.toml", None, "/c/conf.d/99.toml", 3)
    assert edit.text == 'version = 3\nimports = ["/c/conf.d/99.toml"]\n'
    assert (
        mainconfig.remove_import("/c/config.toml", edit.text, "/c/conf.d/99.toml", edit.added) == ""
    )


def test_version_kept_when_user_added_plugins_since() -> None:
    edit = mainconfig.add_import("/c/config.toml", 'root = "/r"\n', "/c/d/9.toml", 2)
    assert edit.added == ("imports", "version")
    later = edit.text + '[plugins."io.containerd.grpc.v1.cri"]\n  sandbox_image = "y"\n'
    back = mainconfig.remove_import("/c/config.toml", later, "/c/d/9.toml", edit.added)
    assert tomllib.loads(back)["version"] == 2 and "imports" not in tomllib.loads(back)


def test_resolve_imports_like_containerd(tmp_path: object) -> None:
    from pathlib import Path

    root = Path(str(tmp_path))
    (root / "d").mkdir()
    for name in ("b.toml", "a.toml", ".hidden.toml", "c.txt"):
        (root / "d" / name).write_text("")
    got = imports.resolve(
        str(root / "config.toml"), ["d/*.toml", "./x.toml", str(root / "d/c.txt")]
    )
    assert got == [
        str(root / "d/.hidden.toml"),  # Go's Glob: `*` matches dot-files too
        str(root / "d/a.toml"),
        str(root / "d/b.toml"),
        str(root / "x.toml"),
        str(root / "d/c.txt"),
    ]


def test_only_whole_inserted_lines_are_taken_out() -> None:
    text = '# was: version = 2\n# notes\nroot = "/r"\n'
    edit = mainconfig.add_import("/c/config.toml", text, "/c/d/9.toml", 2)
    assert (
        edit.text
        == '# was: version = 2\n# notes\nversion = 2\nimports = ["/c/d/9.toml"]\nroot = "/r"\n'
    )
    assert mainconfig.remove_import("/c/config.toml", edit.text, "/c/d/9.toml", edit.added) == text
