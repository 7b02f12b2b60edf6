"""The embedded local model: the README's first command run verbatim, its errors, and no server outliving a run."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from agentbatch.model import local_server as local_model

REPO = Path(__file__).resolve().parent.parent
README_COMMAND = (
    "pip install -e '.[local]' && python batch_runner.py --dataset_file=data/example_prompts.jsonl "
    "--batch_size=4 --run_name=example --model=local --require_reasoning=false"
)
HAS_LLAMA = importlib.util.find_spec("llama_cpp") is not None
needs_llama = pytest.mark.skipif(
    not HAS_LLAMA, reason="llama-cpp-python[server] is not installed (pip install -e '.[local]')"
)


def _copy_repo(dest: Path) -> Path:
    """The checkout without git metadata, caches or earlier runs: the test owns every file it writes."""

    def ignore(folder: str, names: list[str]) -> set[str]:
        skipped = {
            n for n in names if n in (".git", "__pycache__", ".pytest_cache", ".ruff_cache") or n.endswith(".egg-info")
        }
        if Path(folder).resolve() == REPO / "data":
            skipped |= {n for n in names if (Path(folder) / n).is_dir()}
        return skipped

    shutil.copytree(REPO, dest, ignore=ignore)
    return dest


def _servers_of(repo: Path) -> list[int]:
    """Pids of local model servers started from this copy of the repo (its path is on their PYTHONPATH)."""
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
            environ = (entry / "environ").read_bytes().split(b"\0")
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        on_path = any(v.startswith(b"PYTHONPATH=") and str(repo).encode() in v for v in environ)
        if state != "Z" and b"agentbatch.model.local_server" in argv and on_path:
            pids.append(int(entry.name))
    return pids


def _wait_gone(repo: Path, seconds: float) -> list[int]:
    deadline = time.monotonic() + seconds
    while (left := _servers_of(repo)) and time.monotonic() < deadline:
        time.sleep(0.2)
    return left


def _venv_env(tmp_path: Path) -> dict:
    """A venv over the installed packages, so the command's `pip install -e` changes nothing outside tmp_path."""
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", str(venv)], check=True)
    env = dict(os.environ, VIRTUAL_ENV=str(venv), PATH=f"{venv / 'bin'}{os.pathsep}{os.environ['PATH']}")
    env.pop("PYTHONPATH", None)
    for var in ("OPENROUTER_API_KEY", "OPENAI_API_KEY"):
        env.pop(var, None)  # the local model needs no key: prove it
    return env


def _lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []


def _executed(tool_turn: dict) -> bool:
    """True when a tool result could only come from running it: a process exit code, or bytes written."""
    try:
        result = json.loads(tool_turn["value"])
    except ValueError:
        return False
    if tool_turn["name"] == "terminal":
        return isinstance(result.get("exit_code"), int)
    if tool_turn["name"] in ("write_file", "read_file", "patch", "search_files"):
        return not result.get("error")
    return False


@needs_llama
@pytest.mark.slow
def test_readme_first_command_writes_real_trajectories(tmp_path):
    repo = _copy_repo(tmp_path / "repo")
    env = _venv_env(tmp_path)
    started = time.monotonic()
    proc = subprocess.run(README_COMMAND, shell=True, cwd=repo, env=env, capture_output=True, text=True, timeout=3600)
    seconds = time.monotonic() - started
    assert proc.returncode in (0, 3), f"exit {proc.returncode}\n{proc.stderr[-3000:]}"
    run = repo / "data" / "example"
    prompts = [
        json.loads(line)["prompt"] for line in (repo / "data" / "example_prompts.jsonl").read_text().splitlines()
    ]
    assert len(prompts) >= 10
    records = _lines(run / "trajectories.jsonl")
    failed = _lines(run / "failed.jsonl")
    assert not (run / "discarded.jsonl").exists(), "--require_reasoning=false must keep every sample"
    # Each prompt has exactly one last word: a trajectory, or a failure with its reason.
    answered = sorted(r["prompt_index"] for r in records)
    assert len(answered) == len(set(answered))
    for f in failed:
        assert f["error"] and f["prompt_index"] not in answered
    assert sorted(answered + [f["prompt_index"] for f in failed]) == list(range(len(prompts)))
    assert len(records) >= len(prompts) - 2, f"too many failures: {[f['error'] for f in failed]}"
    for r in records:
        assert r["conversations"][0] == {"from": "human", "value": prompts[r["prompt_index"]]}
        assert r["metadata"]["model"] == "local"
    tool_turns = [t for r in records for t in r["conversations"] if t["from"] == "tool"]
    assert any(_executed(t) for t in tool_turns), tool_turns
    # Every tool turn answers a call the model made in the turn before it.
    for r in records:
        calls = {c["id"] for t in r["conversations"] if t["from"] == "gpt" for c in t.get("tool_calls") or []}
        assert {t["tool_call_id"] for t in r["conversations"] if t["from"] == "tool"} <= calls

    stats = json.loads((run / "statistics.json").read_text())
    assert stats["prompts"]["done"] == len(records) and stats["prompts"]["failed"] == len(failed)
    assert stats["prompts"]["total"] == len(prompts) and stats["merge"]["kept"] == len(records)
    for name, s in stats["tools"].items():
        assert s["count"] == sum(r["tool_stats"][name]["count"] for r in records), name
        assert s["failure"] == sum(r["tool_stats"][name]["failure"] for r in records), name
    assert sum(s["count"] for s in stats["tools"].values()) == len(tool_turns)
    assert f"done {len(records)}" in proc.stdout
    assert _wait_gone(repo, 5) == [], "the local model server outlived the run"
    print(f"README command took {seconds:.0f} s")


# A tool whose arguments cannot be short: uncapped, llama-cpp-python's handler writes all 300 characters of it.
LONG_TOOL = {
    "type": "function",
    "function": {
        "name": "write_long",
        "description": "Write a long text.",
        "parameters": {
            "type": "object",
            "properties": {"text": {"type": "string", "minLength": 300}},
            "required": ["text"],
        },
    },
}


@needs_llama
@pytest.mark.slow
def test_every_call_of_the_local_model_ends_within_its_cap():
    """The handler's tool path passes max_tokens=None to llama.cpp ("to the end of the context"): one reply ran
    to 7,482 tokens while the other prompts waited behind it. Each call, through the adapter, stays in its cap."""
    import httpx

    asks = {
        "a tool call whose arguments are long": {"messages": [{"role": "user", "content": "Call write_long."}]},
        "a plain answer": {"messages": [{"role": "user", "content": "Name the three primary colors."}]},
    }
    with local_model.serve(None) as base_url:
        for name, ask in asks.items():
            for cap in (8, 24):
                body = {"model": "local", "tools": [LONG_TOOL], "max_tokens": cap, **ask}
                reply = httpx.post(f"{base_url}/chat/completions", json=body, timeout=600).json()
                assert reply["usage"]["completion_tokens"] <= cap, (name, cap, reply)
                calls = reply["choices"][0]["message"].get("tool_calls") or []
                # a token is 2-5 characters of JSON here: the arguments were cut well short of 300
                assert all(len(c["function"]["arguments"]) <= 6 * cap for c in calls), (name, cap, calls)


def test_a_request_budget_caps_every_completion_the_handler_runs():
    """TokenBudget, alone: what each completion may generate, and what is left for the next."""
    asked = []

    class Llama:
        verbose = False

        def create_completion(self, **kwargs):
            asked.append(kwargs["max_tokens"])
            return {"usage": {"completion_tokens": min(kwargs["max_tokens"], 7)}}

    budget = local_model.TokenBudget(Llama(), 10)
    for max_tokens in (None, 0, 100, 2, None):
        budget.create_completion(prompt="p", max_tokens=max_tokens)
    assert asked == [10, 3, 1, 1, 1] and budget.verbose is False


@needs_llama
def test_missing_gguf_is_one_line_error(tmp_path):
    (tmp_path / "ds.jsonl").write_text('{"prompt": "hi"}\n')
    proc = _run_cli(tmp_path, "--local_model_path=/nonexistent/model.gguf")
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        "error: --local_model_path /nonexistent/model.gguf does not exist: give the path of a GGUF model file"
    ]
    (tmp_path / "notes.txt").write_text("not a model")
    proc = _run_cli(tmp_path, f"--local_model_path={tmp_path / 'notes.txt'}")
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1
    assert "is not a GGUF file" in proc.stderr
    assert not (tmp_path / "out").exists()


def test_without_llama_cpp_says_how_to_install(tmp_path):
    (tmp_path / "ds.jsonl").write_text('{"prompt": "hi"}\n')
    # A None entry in sys.modules makes the module unimportable, as if it were not installed.
    code = "import sys; sys.modules['llama_cpp'] = None; import batch_runner; batch_runner.cli()"
    proc = subprocess.run(
        [sys.executable, "-c", code, *_flags(tmp_path)], cwd=REPO, capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: --model=local needs llama-cpp-python[server]")
    assert "pip install -e '.[local]'" in lines[0] and "Traceback" not in proc.stderr


@needs_llama
@pytest.mark.slow
@pytest.mark.parametrize("how", ["sigkill", "ctrl_c_twice"])
def test_no_server_outlives_a_killed_run(tmp_path, how):
    repo = _copy_repo(tmp_path / "repo")
    (tmp_path / "ds.jsonl").write_text(
        "".join(json.dumps({"prompt": f"Run echo {i} in the terminal."}) + "\n" for i in range(6))
    )
    proc = subprocess.Popen(
        [sys.executable, str(repo / "batch_runner.py"), *_flags(tmp_path)],
        cwd=tmp_path,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        for line in proc.stderr:
            if line.startswith("local model:"):
                break
        servers = _servers_of(repo)
        assert len(servers) == 1, servers
        if how == "sigkill":
            proc.kill()
        else:
            proc.send_signal(signal.SIGINT)
            time.sleep(0.5)
            proc.send_signal(signal.SIGINT)
        code = proc.wait(60)
        assert code == (-signal.SIGKILL if how == "sigkill" else 130)
        assert _wait_gone(repo, 15) == [], "the local model server outlived the run"
    finally:
        proc.kill()
        proc.wait()
        for pid in _servers_of(repo):
            os.kill(pid, signal.SIGKILL)


def _flags(tmp_path: Path) -> list[str]:
    return [
        f"--dataset_file={tmp_path / 'ds.jsonl'}",
        "--batch_size=4",
        "--run_name=t",
        "--model=local",
        "--require_reasoning=false",
        f"--output_dir={tmp_path / 'out'}",
    ]


def _run_cli(tmp_path: Path, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(REPO / "batch_runner.py"), *_flags(tmp_path), *extra],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )


# ----- the request adapter in front of llama-cpp-python's chatml-function-calling -----

TOOLS = [{"type": "function", "function": {"name": "terminal", "parameters": {"type": "object", "properties": {}}}}]


def test_adapter_first_turn_offers_tools_with_a_system_prompt():
    body = local_model.adapt_request({"messages": [{"role": "user", "content": "ls"}], "tools": TOOLS})
    assert body["tool_choice"] == "auto"
    assert body["messages"][0] == {"role": "system", "content": local_model.SYSTEM_PROMPT}
    assert body["messages"][1] == {"role": "user", "content": "ls"}


def test_adapter_after_a_tool_result_lets_the_model_answer():
    call = {"id": "c1", "type": "function", "function": {"name": "terminal", "arguments": '{"command": "ls"}'}}
    body = local_model.adapt_request(
        {
            "messages": [
                {"role": "system", "content": "mine"},
                {"role": "user", "content": "ls"},
                {"role": "assistant", "content": None, "tool_calls": [call]},
                {"role": "tool", "tool_call_id": "c1", "name": "terminal", "content": '{"output": "a.txt"}'},
            ],
            "tools": TOOLS,
        }
    )
    assert body["tool_choice"] == "none"
    assert body["messages"][0] == {"role": "system", "content": "mine"}
    assert body["messages"][2] == {"role": "assistant", "content": "", "tool_calls": [call]}
    assert body["messages"][3] == {
        "role": "user",
        "content": '<tool_response name="terminal">\n{"output": "a.txt"}\n</tool_response>',
    }


def test_adapter_keeps_an_explicit_tool_choice_and_plain_chats():
    body = local_model.adapt_request(
        {"messages": [{"role": "user", "content": "hi"}], "tools": TOOLS, "tool_choice": "none"}
    )
    assert body["tool_choice"] == "none"
    plain = {"messages": [{"role": "user", "content": "hi"}]}
    assert local_model.adapt_request(plain) == dict(plain, max_tokens=local_model.MAX_TOKENS)
    capped = dict(plain, max_tokens=20)
    assert local_model.adapt_request(capped) == capped
