"""Shared helpers: run the real batch runner CLI in a subprocess against a ScriptedServer, and read its run dir."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

RUNNER = str(ROOT / "batch_runner.py")
# Workers are spawned interpreters; a run of a few prompts takes seconds, a stuck one must not hang CI.
RUN_TIMEOUT = 180


def thinking(content: str = "final answer", **extra) -> dict:
    """A reply spec with reasoning, so the sample passes the no-reasoning filter."""
    return {"content": content, "reasoning": f"thinking about {content}", **extra}


def cli_env(extra: dict | None = None) -> dict:
    """The environment of a CLI run: no real API keys, so nothing can reach a hosted endpoint by accident."""
    env = {k: v for k, v in os.environ.items() if k not in ("OPENROUTER_API_KEY", "OPENAI_API_KEY", "TERMINAL_ENV")}
    env["PYTHONUNBUFFERED"] = "1"
    env.update(extra or {})
    return env


def server_flags(server) -> list[str]:
    return [f"--base_url={server.base_url}", "--api_key=test-key"]


def cli_command(args: list[str], server=None) -> list[str]:
    return [sys.executable, RUNNER, *args, *(server_flags(server) if server is not None else [])]


def run_cli(args: list[str], cwd, server=None, timeout: float = RUN_TIMEOUT, env: dict | None = None):
    """Run `python batch_runner.py ARGS` (plus the server's --base_url/--api_key) and wait for it."""
    return subprocess.run(
        cli_command(args, server), cwd=str(cwd), env=cli_env(env), capture_output=True, text=True, timeout=timeout
    )


def run_cli_wrapped(prelude: str, args: list[str], cwd, server=None) -> subprocess.CompletedProcess:
    """The real CLI in a process that first runs `prelude`: Python that wraps a function to note what it sees."""
    wrapper = Path(cwd) / "wrapped_cli.py"
    wrapper.write_text(
        f"import sys\nsys.path.insert(0, {str(ROOT)!r})\n{prelude}\nfrom batch_runner import cli\ncli()\n"
    )
    command = cli_command(args, server)
    return subprocess.run(
        [command[0], str(wrapper), *command[2:]],
        cwd=str(cwd),
        env=cli_env(),
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT,
    )


def start_cli(args: list[str], cwd, server=None, env: dict | None = None) -> subprocess.Popen:
    """Start the CLI in its own process group, so a test can kill it and every worker at once."""
    return subprocess.Popen(
        cli_command(args, server),
        cwd=str(cwd),
        env=cli_env(env),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )


def write_dataset(path, rows) -> Path:
    """A JSONL dataset; str rows become {"prompt": row}, dicts are written as they are."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        for row in rows:
            f.write(json.dumps({"prompt": row} if isinstance(row, str) else row, ensure_ascii=False) + "\n")
    return path


def read_jsonl(path) -> list[dict]:
    """Every complete JSON object line of a file (a missing file is empty)."""
    path = Path(path)
    if not path.exists():
        return []
    out = []
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.strip():
            try:
                value = json.loads(line)
            except (ValueError, RecursionError):
                continue
            if isinstance(value, dict):
                out.append(value)
    return out


def prompt_of_record(record: dict) -> str:
    return next(t["value"] for t in record["conversations"] if t["from"] == "human")


def first_turn_prompts(server, since: int = 0) -> Counter:
    """Prompt → how many times the server was asked to start it (requests with no assistant turn yet)."""
    counts: Counter = Counter()
    for body in server.requests()[since:]:
        messages = body.get("messages") or []
        if not any(m.get("role") == "assistant" for m in messages):
            counts[next(m["content"] for m in messages if m.get("role") == "user")] += 1
    return counts


class RunDir:
    """The output directory of one run."""

    def __init__(self, path):
        self.path = Path(path)

    def batch_numbers(self) -> list[int]:
        return sorted(int(p.stem.split("_")[1]) for p in self.path.glob("batch_*.jsonl"))

    def batch_records(self) -> list[dict]:
        return [r for n in self.batch_numbers() for r in read_jsonl(self.path / f"batch_{n}.jsonl")]

    def trajectories(self) -> list[dict]:
        return read_jsonl(self.path / "trajectories.jsonl")

    def discarded(self) -> list[dict]:
        return read_jsonl(self.path / "discarded.jsonl")

    def failed(self) -> list[dict]:
        return read_jsonl(self.path / "failed.jsonl")

    def json(self, name: str) -> dict:
        return json.loads((self.path / name).read_text(encoding="utf-8"))

    def stats(self) -> dict:
        return self.json("statistics.json")

    def snapshot(self) -> dict[str, bytes]:
        """File name → bytes of every batch file, to show later sessions never touch them."""
        return {p.name: p.read_bytes() for p in self.path.glob("batch_*.jsonl")}


def running_as(pid: int, comm: str) -> bool:
    """Whether `pid` is a live process (not a zombie) named `comm`: not gone, nor its pid used again by another."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            state = f.read().rpartition(")")[2].split()[0]
        with open(f"/proc/{pid}/comm") as f:
            name = f.read().strip()
    except FileNotFoundError:
        return False
    return state not in ("Z", "X") and name == comm


def assert_clean_exit(proc, code: int = 0) -> None:
    """The CLI exited with `code` and printed no traceback."""
    assert proc.returncode == code, f"exit {proc.returncode}\nstdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
    assert "Traceback" not in proc.stderr + proc.stdout, proc.stderr
