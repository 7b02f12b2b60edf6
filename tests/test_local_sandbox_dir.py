"""The local sandbox makes its directory only when a prompt needs one, and removes it with the prompt."""

from __future__ import annotations

import tempfile

import pytest

from agentbatch.sandboxes.local import LocalSandbox


def sandbox_dirs(root) -> list:
    """The samples' directories (not the process's names directory, which lives while a sandbox holds it)."""
    return sorted(p.name for p in root.iterdir() if p.name.startswith("br-sandbox-") and not p.name.endswith("-names"))


def test_an_absolute_path_is_refused_without_making_a_directory(tmp_path, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    (tmp_path / "data.txt").write_text("hello")
    sandbox = LocalSandbox()
    with pytest.raises(PermissionError, match="only inside the sample's own directory"):
        sandbox.read_file(str(tmp_path / "data.txt"))
    assert sandbox_dirs(tmp_path) == []
    sandbox.cleanup()
    assert sandbox_dirs(tmp_path) == []


def test_a_command_gets_its_own_directory_as_home_and_cwd_and_it_goes_with_cleanup(tmp_path, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    sandbox = LocalSandbox()
    result = sandbox.exec('pwd; echo "$HOME" "$TMPDIR"; touch made-here', timeout=30)
    [made] = sandbox_dirs(tmp_path)
    home = str(tmp_path / made)
    assert result.output.split() == [home, home, home] and (tmp_path / made / "made-here").exists()
    assert sandbox.read_file("made-here") == b""  # relative paths are the directory's
    sandbox.cleanup()
    assert sandbox_dirs(tmp_path) == []


def test_a_relative_write_makes_the_directory_first(tmp_path, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    sandbox = LocalSandbox()
    sandbox.write_file("notes/a.txt", b"x")
    [made] = sandbox_dirs(tmp_path)
    assert (tmp_path / made / "notes" / "a.txt").read_bytes() == b"x"
    sandbox.cleanup()
    assert sandbox_dirs(tmp_path) == []


def test_cleaning_up_twice_leaves_the_temp_directory_as_it_was(tmp_path, monkeypatch):
    """A second cleanup (or a reap racing a cleanup) once chmodded the temp directory itself to 0700."""
    import os
    import stat

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    os.chmod(tmp_path, 0o1777)
    sandbox = LocalSandbox()
    sandbox.exec("mkdir -p locked/inner && chmod 000 locked . && echo done", timeout=30)
    sandbox.cleanup()  # what the command locked, it removes: inside its own directory, modes are its to fix
    assert sandbox_dirs(tmp_path) == []
    sandbox.cleanup()
    assert stat.S_IMODE(os.stat(tmp_path).st_mode) == 0o1777
