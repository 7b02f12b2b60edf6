"""Bad input never kills a run: bad dataset lines are warned about by number, fatal problems are one line, a
full or read-only disk stops the run cleanly with everything written before intact, and --resume goes on."""

from __future__ import annotations

import json
import re
import subprocess
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from cli_helpers import ROOT, RunDir, assert_clean_exit, prompt_of_record, run_cli, write_dataset
from scripted_server import ScriptedServer

from agentbatch.dataset_jsonl import MAX_PROMPT_CHARS, load_entries

CORPUS = ROOT / "tests" / "fixtures" / "bad_datasets"
EXPECTED = json.loads((CORPUS / "expected.json").read_text(encoding="utf-8"))
WARNING = re.compile(r"^warning: (.+):(\d+): skipped: (.+)$")


def generated_cases(tmp: Path) -> dict[str, tuple[bytes, dict]]:
    """Cases too big for a fixture file: (content, expectation as in expected.json)."""
    ok = json.dumps({"prompt": "generated ok"}).encode()
    return {
        "huge_prompt.jsonl": (
            ok + b"\n" + json.dumps({"prompt": "x" * (MAX_PROMPT_CHARS + 1)}).encode() + b"\n",
            {"prompts": ["generated ok"], "warnings": {"2": "over the limit"}},
        ),
        "deep_nesting.jsonl": (
            b"[" * 100_000 + b"\n" + b'{"a":' * 50_000 + b"\n" + ok + b"\n",
            {"prompts": ["generated ok"], "warnings": {"1": "nested too deeply", "2": "nested too deeply"}},
        ),
    }


def all_cases(tmp: Path) -> dict[str, tuple[bytes, dict]]:
    cases = {name: ((CORPUS / name).read_bytes(), exp) for name, exp in EXPECTED.items()}
    cases.update(generated_cases(tmp))
    return cases


def test_the_corpus_is_big_enough():
    assert len(EXPECTED) >= 20
    assert sorted(EXPECTED) == sorted(p.name for p in CORPUS.glob("*.jsonl"))


@pytest.mark.parametrize("name", [*sorted(EXPECTED), "huge_prompt.jsonl", "deep_nesting.jsonl"])
def test_each_bad_line_is_warned_by_number_and_the_valid_ones_kept(tmp_path, name):
    content, expected = all_cases(tmp_path)[name]
    path = tmp_path / name
    path.write_bytes(content)
    entries, warnings = load_entries(str(path))
    assert [e.prompt for e in entries] == expected["prompts"]
    got = {}
    for w in warnings:
        m = re.match(rf"^{re.escape(str(path))}:(\d+): skipped: (.+)$", w)
        assert m, w
        got[m.group(1)] = m.group(2)
    assert sorted(got) == sorted(expected["warnings"]), warnings
    for line, reason in expected["warnings"].items():
        assert reason in got[line], (line, got[line])


def combined_dataset(tmp: Path) -> tuple[Path, list[str], dict[int, str]]:
    """Every case in one file (BOM first): its valid prompts, and the expected warnings by line number."""
    blob, prompts, warnings, offset = b"\xef\xbb\xbf", [], {}, 0
    for _name, (content, expected) in sorted(all_cases(tmp).items()):
        content = content.removeprefix(b"\xef\xbb\xbf")
        if not content.endswith(b"\n"):
            content += b"\n"  # a truncated last line stays a broken line in the middle
        blob += content
        prompts += expected["prompts"]
        warnings.update({int(line) + offset: reason for line, reason in expected["warnings"].items()})
        offset += content.count(b"\n")
    path = tmp / "everything.jsonl"
    path.write_bytes(blob)
    return path, prompts, warnings


@pytest.mark.slow
def test_a_run_over_the_whole_corpus_warns_per_line_and_runs_every_valid_prompt(tmp_path):
    data, prompts, expected = combined_dataset(tmp_path)
    with ScriptedServer(default_script=[{"content": "ok", "reasoning": "fine"}]) as srv:
        proc = run_cli(
            [
                f"--dataset_file={data}",
                "--batch_size=10",
                "--run_name=corpus",
                "--model=m",
                "--output_dir=out",
                "--distribution=minimal",
                "--num_workers=2",
                "--concurrency=8",
            ],
            tmp_path,
            server=srv,
        )
    assert_clean_exit(proc)
    warned = {}
    for line in proc.stderr.splitlines():
        if m := WARNING.match(line):
            assert m.group(1) == str(data)
            warned[int(m.group(2))] = m.group(3)
    assert sorted(warned) == sorted(expected)
    assert all(expected[n] in warned[n] for n in expected)
    run = RunDir(tmp_path / "out" / "corpus")
    assert Counter(prompt_of_record(r) for r in run.trajectories()) == Counter(prompts)
    assert run.stats()["prompts"]["total"] == len(prompts)


def test_a_lone_surrogate_from_the_endpoint_is_written_as_valid_json(tmp_path):
    """An endpoint's "\\ud800" escape decodes to half a character; the writer must not crash on it, and writes
    U+FFFD in its place (the escape itself would make the file unloadable in `datasets`)."""
    data = write_dataset(tmp_path / "ds.jsonl", ["surrogate please"])
    with ScriptedServer(default_script=[{"content": "half \ud800 char", "reasoning": "odd \udfff"}]) as srv:
        proc = run_cli(
            [f"--dataset_file={data}", "--batch_size=1", "--run_name=s", "--model=m", "--output_dir=out"],
            tmp_path,
            server=srv,
        )
    assert_clean_exit(proc)
    (record,) = RunDir(tmp_path / "out" / "s").trajectories()
    assert "half \ufffd char" in record["conversations"][-1]["value"]


# --- fatal problems: one line, exit 2, nothing created -----------------------------------------------------


def _fatal_cases(tmp: Path) -> dict[str, tuple[list[str], str]]:
    """name -> (flags, a phrase the one-line error must contain)."""
    ok = write_dataset(tmp / "ok.jsonl", ["fine prompt"])
    files = {
        "prefill_not_json.json": b"[{'role': 'user'}]",
        "prefill_not_array.json": b'{"role": "user", "content": "hi"}',
        "prefill_bad_role.json": b'[{"role": "wizard", "content": "hi"}]',
        "prefill_no_content.json": b'[{"role": "user"}]',
        "prefill_binary.json": b"\xff\xfe\x00garbage",
        "prefill_empty.json": b"",
        "empty.jsonl": b"",
        "all_bad.jsonl": b'{"prompt": 1}\n[]\n\n{"prompt": "  "}\nnot json\n',
    }
    for name, content in files.items():
        (tmp / name).write_bytes(content)
    (tmp / "a_file").write_text("not a directory")
    base = [f"--dataset_file={ok}", "--batch_size=1", "--run_name=r", f"--output_dir={tmp / 'out'}"]
    with_base = {
        "prefill missing": (["--prefill_messages_file=/nonexistent/prefill.json"], "prefill file"),
        "unknown distribution": (["--distribution=everything"], "unknown distribution"),
        "batch_size zero": (["--batch_size=0"], "--batch_size"),
        "batch_size text": (["--batch_size=ten"], "--batch_size"),
        "num_workers negative": (["--num_workers=-2"], "--num_workers"),
        "concurrency zero": (["--concurrency=0"], "--concurrency"),
        "max_turns float": (["--max_turns=2.5"], "--max_turns"),
        "request_timeout negative": (["--request_timeout=-1"], "--request_timeout"),
        "max_retries negative": (["--max_retries=-1"], "--max_retries"),
        "sandbox unknown": (["--sandbox=vm"], "--sandbox"),
        "reasoning_effort unknown": (["--reasoning_effort=enormous"], "--reasoning_effort"),
        "provider_sort unknown": (["--provider_sort=cheapest"], "--provider_sort"),
        "base_url not http": (["--base_url=ftp://example.invalid/v1"], "--base_url"),
        "run_name a path": (["--run_name=../escape"], "--run_name"),
        "seed not whole": (["--seed=1.5"], "--seed"),
        "resume not boolean": (["--resume=maybe"], "--resume"),
        "unknown flag": (["--bogus_flag=1"], "unknown flag --bogus_flag"),
        "output_dir under a file": ([f"--output_dir={tmp / 'a_file' / 'sub'}"], "cannot write"),
    }
    for name in files:
        if name.startswith("prefill"):
            with_base[name] = ([f"--prefill_messages_file={tmp / name}"], "prefill file")
    cases = {k: (base + flags, phrase) for k, (flags, phrase) in with_base.items()}
    no_dataset = ["--batch_size=1", "--run_name=r", f"--output_dir={tmp / 'out'}"]
    cases["dataset missing"] = ([f"--dataset_file={tmp / 'nope.jsonl'}", *no_dataset], "does not exist")
    cases["dataset empty"] = ([f"--dataset_file={tmp / 'empty.jsonl'}", *no_dataset], "no valid entries")
    cases["dataset all bad"] = ([f"--dataset_file={tmp / 'all_bad.jsonl'}", *no_dataset], "no valid entries")
    cases["dataset is a directory"] = (
        [f"--dataset_file={tmp}", *no_dataset],
        "is a directory but holds no Harbor task",
    )
    cases["dataset flag missing"] = (no_dataset, "--dataset_file is required")
    return cases


@pytest.fixture(scope="module")
def fatal_runs(tmp_path_factory):
    """Run every fatal case once, a few at a time (each is a separate CLI process)."""
    tmp = tmp_path_factory.mktemp("fatal")
    cases = _fatal_cases(tmp)
    srv = ScriptedServer()
    with srv, ThreadPoolExecutor(4) as pool:
        # A reachable endpoint, so a case that wrongly got past its check would run rather than hang.
        runs = {
            name: pool.submit(run_cli, [f"--base_url={srv.base_url}", "--model=m", *flags], tmp, None, 60)
            for name, (flags, _) in cases.items()
        }
        done = {name: f.result() for name, f in runs.items()}
    return tmp, cases, done


def _fatal_names() -> list[str]:
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        return sorted(_fatal_cases(Path(d)))


@pytest.mark.parametrize("case", _fatal_names())
def test_fatal_problems_print_one_line_and_do_nothing(fatal_runs, case):
    tmp, cases, done = fatal_runs
    proc, phrase = done[case], cases[case][1]
    assert proc.returncode == 2, f"exit {proc.returncode}: {proc.stderr}"
    lines = [line for line in proc.stderr.splitlines() if not line.startswith("warning: ")]
    assert len(lines) == 1 and lines[0].startswith("error: "), proc.stderr
    assert phrase in lines[0], lines[0]
    assert "Traceback" not in proc.stderr + proc.stdout
    assert not (tmp / "out" / "r").exists(), "a fatal problem must not leave a run directory behind"


# --- the disk fills up, or turns read-only, in the middle of a resumed run ----------------------------------

BIG_ANSWER = [{"content": "y" * 2000, "reasoning": "long answer"}]


def _mount(*args: str) -> None:
    done = subprocess.run(["mount", *args], capture_output=True, text=True)
    if done.returncode:
        pytest.skip(f"cannot mount here (needs root and CAP_SYS_ADMIN): {done.stderr.strip()}")


@pytest.fixture
def mounted(tmp_path):
    """A directory the test mounts things on; always unmounted afterwards."""
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    yield mnt
    while subprocess.run(["umount", str(mnt)], capture_output=True).returncode == 0:
        pass  # a bind mount may sit on top of a tmpfs


def _run_args(data: Path, out: Path, srv: ScriptedServer, *extra: str) -> list[str]:
    return [
        f"--dataset_file={data}",
        "--batch_size=100",
        "--run_name=disk",
        "--model=m",
        f"--output_dir={out}",
        f"--base_url={srv.base_url}",
        "--api_key=disk-test-key",
        "--distribution=minimal",
        "--num_workers=2",
        "--concurrency=8",
        *extra,
    ]


def _assert_stopped_cleanly(proc, reason: str) -> None:
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr + proc.stdout
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1, proc.stderr
    assert "cannot write to" in errors[0] and reason in errors[0], errors[0]


def _assert_whole_lines(run_dir: Path) -> None:
    for path in run_dir.glob("*.jsonl"):
        for line in path.read_bytes().splitlines():
            json.loads(line)  # no torn line anywhere
        assert path.read_bytes().endswith(b"\n") or not path.read_bytes()
    assert not list(run_dir.glob("*.tmp")), "a half-written temporary file was left behind"


def _finish_and_check(tmp_path: Path, data: Path, out: Path, srv, prompts: list[str]) -> None:
    done = run_cli(_run_args(data, out, srv, "--resume"), tmp_path)
    assert_clean_exit(done)
    run = RunDir(out / "disk")
    assert Counter(prompt_of_record(r) for r in run.trajectories()) == Counter(prompts)
    assert run.stats()["prompts"]["done"] == len(prompts)


@pytest.mark.slow
def test_a_full_disk_stops_the_run_in_one_line_keeping_every_earlier_line(tmp_path, mounted):
    _mount("-t", "tmpfs", "-o", "size=128k", "tmpfs", str(mounted))
    prompts = [f"disk filler {i}" for i in range(40)]
    data = write_dataset(tmp_path / "ds.jsonl", prompts)
    run_dir = mounted / "disk"
    with ScriptedServer(default_script=BIG_ANSWER) as srv:
        assert_clean_exit(run_cli(_run_args(data, mounted, srv, "--max_samples=4"), tmp_path))
        before = {p.name: p.read_bytes() for p in run_dir.glob("batch_*.jsonl")}

        full = run_cli(_run_args(data, mounted, srv, "--resume"), tmp_path)
        _assert_stopped_cleanly(full, "No space left on device")
        assert "--resume" in full.stderr
        for name, content in before.items():
            assert (run_dir / name).read_bytes() == content, f"{name} changed"
        _assert_whole_lines(run_dir)
        assert len(RunDir(run_dir).batch_records()) > 4, "the disk should fill after some new prompts"

        _mount("-o", "remount,size=16m", str(mounted))
        _finish_and_check(tmp_path, data, mounted, srv, prompts)


@pytest.mark.slow
def test_a_read_only_run_directory_stops_the_run_in_one_line_and_changes_nothing(tmp_path, mounted):
    prompts = [f"read only {i}" for i in range(12)]
    data = write_dataset(tmp_path / "ds.jsonl", prompts)
    run_dir = mounted / "disk"
    with ScriptedServer(default_script=BIG_ANSWER) as srv:
        assert_clean_exit(run_cli(_run_args(data, mounted, srv, "--max_samples=3"), tmp_path))
        before = {p.name: p.read_bytes() for p in run_dir.iterdir()}
        _mount("--bind", str(run_dir), str(run_dir))
        _mount("-o", "remount,bind,ro", str(run_dir))

        proc = run_cli(_run_args(data, mounted, srv, "--resume"), tmp_path)
        _assert_stopped_cleanly(proc, "Read-only file system")
        assert {p.name: p.read_bytes() for p in run_dir.iterdir()} == before

        subprocess.run(["umount", str(run_dir)], check=True)
        _finish_and_check(tmp_path, data, mounted, srv, prompts)
