"""A task's artifacts without Docker (docs/harbor.md, "Artifacts"): where Harbor puts each entry, which files a
tar-style exclude leaves out, and the runner's writer of a sample's files: inside its folder only, the run's
secrets redacted, an earlier attempt's files replaced. The collection itself runs in test_harbor_separate and
test_harbor_compose."""

from __future__ import annotations

from agentbatch.harbor import artifacts
from agentbatch.harbor.task_fields import Artifact
from agentbatch.run_dir import artifacts as kept
from agentbatch.run_dir.paths import RunPaths
from agentbatch.secrets_guard import Redactor


def test_each_entry_lands_where_harbor_puts_it_the_convention_entry_first():
    entries = artifacts.entries([Artifact("/app/out.log"), Artifact("/var/log/x", destination="logs/x")])
    assert [e.source for e in entries] == ["/logs/artifacts", "/app/out.log", "/var/log/x"]
    assert [artifacts.host_path(e) for e in entries] == ["logs/artifacts", "app/out.log", "logs/x"]
    # A task that declares /logs/artifacts itself (with excludes, say) replaces the implicit entry.
    own = Artifact("/logs/artifacts/", exclude=("*.tmp",))
    assert artifacts.entries([own]) == [own]


def test_an_exclude_matches_as_tar_does():
    patterns = ("*.tmp", "node_modules", "cache/big.bin")
    assert artifacts._excluded("a/b/x.tmp", patterns)
    assert artifacts._excluded("node_modules/pkg/index.js", patterns)
    assert artifacts._excluded("deep/cache/big.bin", patterns)
    assert not artifacts._excluded("src/main.py", patterns)


def test_the_runner_writes_a_samples_files_inside_its_folder_redacted(tmp_path):
    paths = RunPaths(tmp_path)
    secret = "sk-test-0123456789abcdef"
    kept.write(paths, 3, 1, [("old.txt", b"first attempt")], Redactor([secret]))
    files = [
        ("logs/artifacts/out.txt", f"key={secret}\n".encode()),
        ("bin/blob", b"\xff\x00\xfe binary kept as it is"),
        ("../escape.txt", b"never written"),
        ("/abs/inside.txt", b"made relative"),
    ]
    kept.write(paths, 3, 1, files, Redactor([secret]))
    folder = tmp_path / "artifacts" / "3-1"
    assert (folder / "logs" / "artifacts" / "out.txt").read_text() == "key=[REDACTED]\n"
    assert (folder / "bin" / "blob").read_bytes() == b"\xff\x00\xfe binary kept as it is"
    assert (folder / "abs" / "inside.txt").read_bytes() == b"made relative"
    assert not (tmp_path / "artifacts" / "escape.txt").exists() and not (folder / "old.txt").exists()
    assert kept.listed(paths) == {(3, 1): ["abs/inside.txt", "bin/blob", "logs/artifacts/out.txt"]}
