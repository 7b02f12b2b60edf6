"""A sandbox backend is one class and one registration: the registry, the run's choice and a sample's life.

A toy backend, registered here as a plug-in's module would register it, runs real samples through the
real prompt runner: --sandbox and TERMINAL_ENV accept it, its prepare_run gives the run's note, each
sample is prepared before any model call, created at its first tool call and cleaned up whatever
happened, told whether the sample was interrupted.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers import run_prompt_outcome
from scripted_server import ScriptedServer

from agentbatch import flag_checks
from agentbatch.errors import FatalError
from agentbatch.sandboxes import registry
from agentbatch.sandboxes.base import Backend, ExecResult, SandboxError, SandboxLost, SandboxSettings, SandboxSpec
from agentbatch.sandboxes.choice import choose
from agentbatch.sandboxes.local import LocalSandbox

TOY = "toy-for-tests"
life: list[tuple] = []  # what the toy backend was asked, in order


class ToySandbox(LocalSandbox):
    """A local sandbox whose `lose` command behaves as a vanished container does."""

    def exec(self, command: str, timeout: float) -> ExecResult:
        if command == "lose":
            raise SandboxLost("the toy sandbox went away")
        return super().exec(command, timeout)


@registry.backend(TOY)
class ToyBackend(Backend):
    def prepare_run(self, settings: SandboxSettings) -> str:
        life.append(("prepare_run", settings.kind))
        if not settings.network:
            raise SandboxError("the toy cannot cut the network")
        return "sandbox: toy (for tests)"

    def prepare(self, spec: SandboxSpec) -> None:
        life.append(("prepare", spec.cwd))
        if spec.cwd == "/nowhere":
            raise SandboxError("the toy has no /nowhere")

    def create(self, spec: SandboxSpec) -> ToySandbox:
        life.append(("create",))
        return ToySandbox()

    def cleanup(self, sandbox: ToySandbox, interrupted: bool) -> None:
        life.append(("cleanup", interrupted))
        sandbox.cleanup()


@pytest.fixture(autouse=True)
def fresh_life():
    life.clear()
    yield


def terminal(command: str) -> dict:
    return {"tool_calls": [{"name": "terminal", "arguments": {"command": command}}]}


def test_the_flag_and_terminal_env_take_any_registered_backend_and_its_prepare_run_speaks():
    assert TOY in registry.names() and registry.names()[:3] == ("bwrap", "local", "docker")
    assert flag_checks.sandbox_kind("sandbox", f" {TOY.upper()} ") == TOY
    with pytest.raises(FatalError, match=f"--sandbox must be one of bwrap, local, docker, {TOY}, got 'modal'"):
        choose("modal", {}, SandboxSettings())
    for flag, environ in [(TOY, {}), (None, {"TERMINAL_ENV": TOY}), (TOY, {"TERMINAL_ENV": "docker"})]:
        settings, note = choose(flag, environ, SandboxSettings())
        assert (settings.kind, settings.image_kind, note) == (TOY, "docker", "sandbox: toy (for tests)")
    assert life == [("prepare_run", TOY)] * 3
    # What the backend cannot do stops the run with what else there is.
    with pytest.raises(FatalError) as stopped:
        choose(TOY, {}, SandboxSettings(network=False))
    assert str(stopped.value).startswith(f"--sandbox={TOY}: the toy cannot cut the network; use --sandbox=bwrap or")
    with pytest.raises(FatalError, match="TERMINAL_ENV must be bwrap, local, docker, .*got 'modal'"):
        choose(None, {"TERMINAL_ENV": "modal"}, SandboxSettings())


def test_a_sample_is_prepared_made_at_its_first_tool_call_and_cleaned_up():
    script = {"run it": [terminal("echo in the toy"), {"content": "done"}], "just answer": [{"content": "42"}]}
    with ScriptedServer(script=script) as server:
        outcome = run_prompt_outcome(server, "run it", ["terminal"], sandbox=SandboxSettings(kind=TOY))
        assert outcome.status == "done", outcome.error
        assert life == [("prepare", None), ("create",), ("cleanup", False)]
        life.clear()
        outcome = run_prompt_outcome(server, "just answer", ["terminal"], sandbox=SandboxSettings(kind=TOY))
        assert outcome.status == "done" and life == [("prepare", None)], life  # no tool call, no sandbox


def test_cleanup_is_told_when_the_sample_was_interrupted_and_prepare_comes_before_any_model_call():
    with ScriptedServer(script={"lose it": [terminal("lose"), {"content": "never"}]}) as server:
        outcome = run_prompt_outcome(server, "lose it", ["terminal"], sandbox=SandboxSettings(kind=TOY))
        assert outcome.status == "failed" and "went away" in outcome.error
        assert life == [("prepare", None), ("create",), ("cleanup", True)]
        life.clear()
        asked = len(server.requests())
        outcome = run_prompt_outcome(server, "lose it", ["terminal"], sandbox=SandboxSettings(kind=TOY), cwd="/nowhere")
        assert outcome.status == "failed" and "no /nowhere" in outcome.error
        assert life == [("prepare", "/nowhere")] and len(server.requests()) == asked  # not one token spent


def test_a_name_is_one_backend_and_a_backend_is_a_backend():
    with pytest.raises(ValueError, match="registered twice"):

        @registry.backend(TOY)
        class Another(Backend):
            def create(self, spec): ...

            def cleanup(self, sandbox, interrupted): ...

    with pytest.raises(TypeError, match="not a subclass"):
        registry.backend("not-a-backend")(object)
    assert registry.get(TOY) is registry.get(TOY)  # one instance per process


def test_a_backend_from_a_plugin_file_runs_samples_through_the_cli(tmp_path, private_tmp):
    """--plugins names the module, --sandbox its backend: the note is its own, every worker makes its sandboxes."""
    import json

    from cli_helpers import ROOT, RunDir, assert_clean_exit, run_cli, write_dataset

    write_dataset(tmp_path / "prompts.jsonl", ["where am I", "and I"])
    script = [terminal("echo $SANDBOX_KIND"), {"content": "done"}]
    args = ["--dataset_file=prompts.jsonl", "--batch_size=2", "--run_name=plugged", "--require_reasoning=false"]
    args += ["--distribution=terminal_only", "--concurrency=2", "--num_workers=2"]
    args += [f"--plugins={ROOT / 'tests' / 'plugins' / 'marked_sandbox.py'}", "--sandbox=marked"]
    with ScriptedServer(default_script=script) as server:
        # Its own TMPDIR: a run's start reaps every dead worker's local sandboxes there (another test's, say so).
        run = run_cli(args, tmp_path, server, env={"TMPDIR": str(private_tmp)})
    assert_clean_exit(run)
    assert run.stderr.splitlines()[0] == "sandbox: marked (a plug-in's)", run.stderr
    records = RunDir(tmp_path / "data" / "plugged").trajectories()
    outputs = [json.loads(t["value"])["output"] for r in records for t in r["conversations"] if t["from"] == "tool"]
    assert outputs == ["marked\n", "marked\n"]


def test_a_backend_that_makes_no_images_refuses_a_build_and_keeps_an_image():
    from agentbatch.sandboxes.base import ImageBuild

    build = ImageBuild("/nowhere", "br-test/none", "0" * 64, "a task")
    made = registry.get(TOY).prepare_all([SandboxSpec(build=build), SandboxSpec(image="some:image")], 4, print)
    assert [(m.image, m.error) for m in made] == [(None, f"the {TOY} backend builds no images"), ("some:image", None)]


def test_no_docker_engine_stops_a_run_with_images_at_start_with_one_line(tmp_path):
    """docker's prepare_run checks the engine: rows with an image and no engine stop before anything starts."""
    from cli_helpers import run_cli, write_dataset

    write_dataset(tmp_path / "rows.jsonl", [{"prompt": "hi", "image": "br-test-busybox:1"}])
    args = ["--dataset_file=rows.jsonl", "--batch_size=1", "--run_name=r", "--sandbox=local", "--model=scripted"]
    args.append("--plugins=" + str(Path(__file__).parent / "plugins" / "scripted_model.py"))
    done = run_cli(args, tmp_path, env={"DOCKER_HOST": f"unix://{tmp_path}/no-engine.sock"})
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        "error: rows with an image: no Docker engine answers (DockerException); start dockerd or set DOCKER_HOST"
    ]
    assert not (tmp_path / "data" / "r").exists()
