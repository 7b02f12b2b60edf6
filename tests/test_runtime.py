"""A Python caller builds the settings from keyword arguments and runs the CLI's steps through the Runtime: the run
directory is the CLI's, and leaving the Runtime stops everything it started (workers, the pacing directory)."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

from cli_helpers import ROOT, RUN_TIMEOUT, RunDir, cli_env, prompt_of_record, run_cli, thinking, write_dataset
from scripted_server import ScriptedServer

CALLER = textwrap.dedent(
    """
    import json, multiprocessing, os, sys
    sys.path.insert(0, {root!r})
    from agentbatch import launch, settings
    from agentbatch.runtime import Runtime

    s = settings.build(json.loads(sys.argv[1]))
    data = launch.load_dataset(s)
    with Runtime(s, images=data.images) as runtime:
        code = launch.make_session(s, data, runtime).run(runtime.executor())
        pacing = runtime.cfg.model.pacing_dir
        inside = (len(runtime.executor().workers), os.path.isdir(pacing))
    print(json.dumps({{"code": code, "inside": inside, "workers_after": len(multiprocessing.active_children()),
                      "pacing_after": os.path.isdir(pacing)}}))
    """
)


def test_a_python_caller_runs_through_the_runtime_as_the_cli_does(tmp_path):
    dataset = write_dataset(tmp_path / "d.jsonl", [f"question {i}" for i in range(6)])
    with ScriptedServer(default_script=[thinking("answer to {prompt}")]) as srv:
        values = {
            "dataset_file": str(dataset),
            "batch_size": 2,
            "output_dir": str(tmp_path / "out"),
            "base_url": srv.base_url,
            "api_key": "test-key",
            "model": "m",
            "sandbox": "local",
            "concurrency": 4,
            "seed": 1,
        }
        caller = tmp_path / "caller.py"
        caller.write_text(CALLER.format(root=str(ROOT)), encoding="utf-8")
        done = subprocess.run(
            [sys.executable, str(caller), json.dumps({**values, "run_name": "py"})],
            cwd=tmp_path,
            env=cli_env(),
            capture_output=True,
            text=True,
            timeout=RUN_TIMEOUT,
        )
        assert done.returncode == 0, done.stderr
        seen = json.loads(done.stdout.strip().splitlines()[-1])
        cli = run_cli([f"--{k}={v}" for k, v in {**values, "run_name": "cli"}.items()], tmp_path)
        assert cli.returncode == 0, cli.stderr
    assert seen["code"] == 0
    assert seen["inside"][0] >= 1 and seen["inside"][1]  # workers and the pacing directory while it is open
    assert (seen["workers_after"], seen["pacing_after"]) == (0, False)  # and nothing left once it is left
    py, by_cli = RunDir(tmp_path / "out" / "py"), RunDir(tmp_path / "out" / "cli")
    assert sorted(map(prompt_of_record, py.trajectories())) == sorted(map(prompt_of_record, by_cli.trajectories()))
    assert len(py.trajectories()) == 6
    assert py.stats()["prompts"] == by_cli.stats()["prompts"]
    assert py.batch_numbers() == by_cli.batch_numbers() == [0, 1, 2]


OWN_TOOLSETS = textwrap.dedent(
    """
    import json, sys
    sys.path.insert(0, {root!r})
    from agentbatch import settings
    from agentbatch.errors import FatalError
    from agentbatch.runtime import Runtime

    own = {{"task-mcp": (("task-mcp__echo",), "a task's MCP server")}}
    with Runtime(settings.build(json.loads(sys.argv[1]))) as runtime:
        runtime.add_toolsets(own)
        before = dict(runtime.cfg.tool_set.toolsets), dict(runtime.cfg.tool_set.sources)
        runtime.executor()
        try:
            runtime.add_toolsets(own)
            late = None
        except FatalError as e:
            late = str(e)
    print(json.dumps({{"toolsets": before[0], "sources": before[1], "late": late}}))
    """
)


def test_a_datasets_own_toolsets_join_the_run_before_its_workers_start_and_are_refused_after(tmp_path):
    """A format's ready step names toolsets of its entries' own (a Harbor task's MCP servers): the Runtime's cfg, which
    its workers get, holds them; once the workers have their cfg, adding more is one clear error."""
    values = {
        "dataset_file": str(write_dataset(tmp_path / "d.jsonl", ["q"])),
        "batch_size": 1,
        "run_name": "own",
        "output_dir": str(tmp_path / "out"),
        "base_url": "http://127.0.0.1:9/v1",
        "api_key": "test-key",
        "model": "m",
        "sandbox": "local",
        "concurrency": 1,
    }
    caller = tmp_path / "caller.py"
    caller.write_text(OWN_TOOLSETS.format(root=str(ROOT)), encoding="utf-8")
    done = subprocess.run(
        [sys.executable, str(caller), json.dumps(values)],
        cwd=tmp_path,
        env=cli_env(),
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT,
    )

    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert seen["toolsets"]["task-mcp"] == ["task-mcp__echo"]
    assert seen["sources"]["task-mcp"] == "a task's MCP server"
    assert "terminal" in seen["toolsets"]  # the run's own toolsets stay
    assert seen["late"] == (
        "the dataset's own toolsets (task-mcp) join a run before its workers start: this Runtime's have; "
        "use a new Runtime for this dataset"
    )
