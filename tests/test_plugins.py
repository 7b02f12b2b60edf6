"""The plug-in seams (agentbatch/plugins.py): tools, dataset formats and models from files, modules and
installed packages' entry points, loaded by the real CLI and by its workers."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from cli_helpers import ROOT, RunDir, assert_clean_exit, run_cli, start_cli, write_dataset

from agentbatch import plugins
from agentbatch.model.scripted import ScriptedModel
from agentbatch.tools import registry

PLUGINS = Path(__file__).parent / "plugins"


@pytest.fixture
def isolated_registry():
    """The registry and the loader as they were: a plug-in this test loads must not stay for the next tests."""
    tools, named, modules = dict(registry.TOOLS._items), dict(plugins._named), set(sys.modules)
    registry._usable.clear()
    yield
    registry.TOOLS._items = tools
    registry._usable.clear()
    plugins._named.clear()
    plugins._named.update(named)
    for name in set(sys.modules) - modules:
        del sys.modules[name]


def test_a_tool_module_file_is_a_toolset_named_after_it(isolated_registry):
    (module,) = plugins.load([str(PLUGINS / "word_tools.py")])
    assert module.__name__ == "word_tools"
    assert registry.toolsets()["word_tools"] == ("shout",)
    shout = registry.load_tools()["shout"]
    assert shout.schema()["function"] == {
        "name": "shout",
        "description": "Upper-case a text, repeated.",
        "parameters": {
            "type": "object",
            "properties": {"text": {"type": "string", "description": "what to shout"}, "times": {"type": "integer"}},
            "required": ["text"],
        },
    }
    result, ok = registry.call_tool(shout, '{"text": "hi", "times": "2"}', _context())
    assert ok and json.loads(result) == {"output": "HI HI"}
    # The built-ins keep their table's order and come first.
    assert list(registry.toolsets())[:7] == ["web", "vision", "image_gen", "terminal", "file", "moa", "browser"]
    assert plugins.load([str(PLUGINS / "word_tools.py")]) == [module]  # loaded once


def _context():
    from helpers import make_ctx

    return make_ctx()


def test_a_tool_that_clashes_with_a_built_in_is_refused_naming_both(tmp_path):
    clash = tmp_path / "clash.py"
    clash.write_text("from agentbatch import tool\n\n@tool\ndef terminal(ctx, command: str) -> dict:\n    return {}\n")
    run = run_cli(_run_args(tmp_path, "--plugins=clash.py", "--model=scripted"), tmp_path)
    assert run.returncode == 2
    (line,) = run.stderr.strip().splitlines()
    assert "clash.py" in line and "'terminal'" in line and "built-in" in line and "Traceback" not in run.stderr
    assert not (tmp_path / "data" / "plug").exists()


def test_a_module_that_does_not_import_is_one_line_with_its_exception(tmp_path):
    (tmp_path / "broken.py").write_text("import json\n\nx = undefined_name\n")
    run = run_cli(_run_args(tmp_path, "--plugins=broken.py"), tmp_path)
    assert run.returncode == 2
    (line,) = run.stderr.strip().splitlines()
    assert line.startswith("error: plug-in file broken.py does not import: NameError:")
    assert "undefined_name" in line and "line 3" in line
    for missing in ("no_such_module_here", "nowhere/missing.py"):
        run = run_cli(_run_args(tmp_path, f"--plugins={missing}"), tmp_path)
        assert run.returncode == 2 and missing in run.stderr and len(run.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize("flag", ["--plugins", "--tools"])
@pytest.mark.parametrize(
    "body, says",
    [
        ('import sys\n\nsys.exit("x")\n', "SystemExit: x (stops.py, line 3)"),
        ("x = 1\nraise KeyboardInterrupt\n", "KeyboardInterrupt (stops.py, line 2)"),
        ("x = 1\ndef f(:\n    pass\n", "SyntaxError: invalid syntax (stops.py, line 2)"),
        (
            "import no_such_module_here\n",
            "ModuleNotFoundError: No module named 'no_such_module_here' (stops.py, line 1)",
        ),
    ],
)
def test_a_plugin_that_stops_its_own_import_is_one_line_naming_its_file_and_line(tmp_path, flag, body, says):
    (tmp_path / "stops.py").write_text(body)
    run = run_cli(_run_args(tmp_path, f"{flag}=stops.py"), tmp_path)
    assert run.returncode == 2, run.stderr
    (line,) = run.stderr.strip().splitlines()
    assert line == f"error: plug-in file stops.py does not import: {says}"
    assert not (tmp_path / "data" / "plug").exists()


def test_a_real_ctrl_c_while_a_plugin_imports_still_stops_the_run_as_documented(tmp_path):
    (tmp_path / "slow.py").write_text("import pathlib, time\n\npathlib.Path('importing').touch()\ntime.sleep(60)\n")
    proc = start_cli(_run_args(tmp_path, "--plugins=slow.py"), tmp_path)
    deadline = time.monotonic() + 30
    while not (tmp_path / "importing").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 130 and "interrupted" in err and "does not import" not in err, err


def _run_args(tmp_path, *extra: str) -> list[str]:
    write_dataset(tmp_path / "prompts.jsonl", ["say something"])
    return [
        "--dataset_file=prompts.jsonl",
        "--batch_size=2",
        "--run_name=plug",
        "--require_reasoning=false",
        "--sandbox=local",
        "--base_url=http://127.0.0.1:9/v1",
        *extra,
    ]


@pytest.mark.slow
def test_a_model_and_a_tool_from_files_run_through_the_cli_with_no_endpoint(tmp_path):
    write_dataset(tmp_path / "prompts.jsonl", [f"prompt {i}" for i in range(4)])
    args = [
        "--dataset_file=prompts.jsonl",
        "--batch_size=2",
        "--run_name=plug",
        "--sandbox=local",
        "--distribution=terminal_only",
        f"--plugins={PLUGINS / 'scripted_model.py'},{PLUGINS / 'word_tools.py'}",
        "--model=scripted",
        "--concurrency=4",
    ]
    # No --base_url and no key: the default endpoint is never called, nor needs a key.
    run = run_cli(args, tmp_path)
    assert_clean_exit(run)
    records = RunDir(tmp_path / "data" / "plug").trajectories()
    assert len(records) == 4
    for record in records:
        gpt = [t for t in record["conversations"] if t["from"] == "gpt"]
        assert gpt[0]["tool_calls"][0]["name"] == "terminal"
        assert gpt[-1]["value"].endswith("the terminal said: plugged in")
        assert record["metadata"]["model"] == "scripted"


@pytest.mark.slow
def test_an_installed_packages_entry_point_adds_a_dataset_format(tmp_path):
    site = tmp_path / "site"
    (site / "lines_format-1.0.dist-info").mkdir(parents=True)
    (site / "lines_format-1.0.dist-info" / "entry_points.txt").write_text(
        "[console_scripts]\nother = x:y\n\n[batch_runner.datasets]\nlines = lines_format\n"
    )
    (site / "lines_format.py").write_text(
        textwrap.dedent(
            """
            from agentbatch import Entry, dataset_format

            @dataset_format("lines")
            class Lines:
                def claims(self, path):
                    return path.endswith(".lines")

                def load(self, path, max_samples):
                    with open(path) as f:
                        prompts = [p.strip() for p in f if p.strip()]
                    return [Entry(i + 1, p) for i, p in enumerate(prompts)][:max_samples], []
            """
        )
    )
    (tmp_path / "prompts.lines").write_text("first prompt\nsecond prompt\n\nthird prompt\n")
    args = [
        "--dataset_file=prompts.lines",
        "--batch_size=2",
        "--run_name=lines",
        "--sandbox=local",
        "--distribution=terminal_only",
        f"--plugins={PLUGINS / 'scripted_model.py'}",
        "--model=scripted",
        "--max_samples=2",
    ]
    run = run_cli(args, tmp_path, env={"PYTHONPATH": os.pathsep.join([str(site), *sys.path])})
    assert_clean_exit(run)
    prompts = sorted(r["conversations"][0]["value"] for r in RunDir(tmp_path / "data" / "lines").trajectories())
    assert prompts == ["first prompt", "second prompt"]


def test_installing_or_removing_a_plugin_package_is_seen_at_the_next_start_through_the_cache(tmp_path):
    """Entry points are read with importlib.metadata and kept in the cache directory, keyed by the distributions on
    the import path and their entry_points.txt: one installed, edited or removed is seen at the next start."""
    site, cache = tmp_path / "site", tmp_path / "cache"
    site.mkdir()
    (site / "acme_tools.py").write_text("from agentbatch import tool\n\n@tool\ndef ping(ctx) -> dict:\n    return {}\n")
    (tmp_path / "d.json").write_text(json.dumps({"acme": {"acme_tools": 100}}))
    env = {"PYTHONPATH": os.pathsep.join([str(site), *sys.path]), "XDG_CACHE_HOME": str(cache)}

    def start() -> subprocess.CompletedProcess:
        return run_cli(["--list_distributions", "--distributions_file=d.json"], tmp_path, env=env)

    assert start().returncode == 2  # no package declares the toolset yet
    (cached,) = (cache / "batch-runner").glob("entry_points-*.json")
    dist_info = site / "acme_tools-1.0.dist-info"
    dist_info.mkdir()
    (dist_info / "entry_points.txt").write_text("[batch_runner.tools]\nacme = acme_tools\n")
    installed = start()
    assert installed.returncode == 0 and "acme_tools 100%" in installed.stdout, installed.stderr
    written = cached.stat().st_mtime_ns
    assert start().returncode == 0 and cached.stat().st_mtime_ns == written  # nothing changed: the cache answered
    (dist_info / "entry_points.txt").write_text("[console_scripts]\nacme = acme_tools:main\n")  # edited in place
    edited = start()
    assert edited.returncode == 2 and "'acme_tools', which this run does not have" in edited.stderr
    (dist_info / "entry_points.txt").write_text("[batch_runner.tools]\nacme = acme_tools\n")
    assert start().returncode == 0
    shutil.rmtree(dist_info)
    removed = start()
    assert removed.returncode == 2 and "'acme_tools', which this run does not have" in removed.stderr


def test_a_registry_read_before_the_plugins_are_loaded_says_so(tmp_path):
    code = "from agentbatch.tools import registry\nregistry.load_tools()\n"
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert "NotLoaded: the tools are read before the plug-ins are loaded: call agentbatch.plugins.load()" in proc.stderr


def test_the_scripted_model_drives_the_real_agent_loop(tmp_path):
    from helpers import make_ctx

    from agentbatch.agent_loop import run_agent
    from agentbatch.sandboxes.base import SandboxSpec

    model = ScriptedModel(
        [
            {"tool_calls": [{"name": "write_file", "arguments": {"path": "a.txt", "content": "hello"}}]},
            {"tool_calls": [{"name": "terminal", "arguments": '{"command": "cat a.txt"}'}]},
            {"content": "a.txt says hello", "reasoning": "read it back"},
        ]
    )
    ctx = make_ctx(spec=SandboxSpec(cwd=str(tmp_path)))
    try:
        tools = registry.offered_tools(["terminal", "file"], ctx.settings)
        result = run_agent("write and read", model, tools, ctx, max_turns=5)
    finally:
        ctx.close()
    assert result.completed and result.stop_reason == "answered" and result.api_calls == 3
    assert (tmp_path / "a.txt").read_text() == "hello"
    terminal_result = json.loads(result.messages[4]["content"])
    assert terminal_result["output"].strip() == "hello"
    assert [len(c["messages"]) for c in model.calls] == [1, 3, 5]
    assert {s["function"]["name"] for s in model.calls[0]["tools"]} >= {"terminal", "write_file"}


def test_a_format_from_outside_the_package_brings_its_hooks_limits_steps_and_model(tmp_path):
    """The interface Harbor plugs in through, used by a plug-in file (tests/plugins/probe_format.py): hooks before
    the agent and as the check, its own limits bounded by the flags, a sample that cannot run, steps in the runner,
    and a model registered for it with the flags it implies."""
    (tmp_path / "tasks.probe").write_text("alpha\nhurried\nbroken\n")
    args = ["--dataset_file=tasks.probe", "--batch_size=5", "--run_name=probe", "--sandbox=local"]
    args += [f"--plugins={PLUGINS / 'probe_format.py'}", "--model=probe-replay", "--timeout_multiplier=0.5"]
    run = run_cli(args, tmp_path)

    assert run.returncode == 3, run.stderr  # broken's sample failed, nothing else did
    stderr = run.stderr.splitlines()
    assert stderr[0] == "probe: 3 tasks, model probe-replay, before any sample"  # its prepare, before the session
    assert stderr[1] == "sandbox: the probe's own (a token in each sandbox)"
    out = RunDir(tmp_path / "data" / "probe")
    lines = {r["task"]["name"]: r for r in out.trajectories()}
    assert sorted(lines) == ["alpha", "hurried"]
    alpha = lines["alpha"]
    # The check read what before_agent wrote, within the task's own 40 s scaled by --timeout_multiplier.
    assert (alpha["passed"], alpha["reward"]) == (True, 1.0)
    assert alpha["check"]["output"] == "alpha|model=probe-replay|timeout=20"
    assert alpha["task"] == {
        "name": "alpha",
        "difficulty": None,
        "category": "probe",
        "tags": [],
        "image": None,
        "image_id": None,
    }
    # Implied by the model's registration: the terminal only, and no reasoning asked of it.
    assert alpha["stop_reason"] == "answered" and out.stats()["distribution"] == "terminal_only"
    assert (lines["hurried"]["stop_reason"], lines["hurried"]["passed"]) == ("time", True)  # its own prompt timeout
    [failed] = out.failed()
    assert (failed["task"]["name"], failed["error"]) == ("broken", "probe tasks named broken cannot run")
    assert run.stdout.rstrip().splitlines()[-1] == "probe verdict: 2 of 3 tasks passed"  # its at_end, last


def test_a_flag_given_wins_over_what_the_model_implies_and_its_format_is_its_own(tmp_path):
    (tmp_path / "tasks.probe").write_text("alpha\n")
    args = ["--dataset_file=tasks.probe", "--batch_size=5", "--run_name=given", "--sandbox=local"]
    args += [f"--plugins={PLUGINS / 'probe_format.py'}", "--model=probe-replay", "--require_reasoning=true"]
    run = run_cli(args, tmp_path)
    assert run.returncode == 0, run.stderr
    [line] = RunDir(tmp_path / "data" / "given").discarded()
    assert line["discard_reason"] == "no_reasoning"  # the flag given, not the implied false

    write_dataset(tmp_path / "rows.jsonl", ["hi"])
    args = ["--dataset_file=rows.jsonl", "--batch_size=5", "--run_name=rows", "--sandbox=local"]
    args += [f"--plugins={PLUGINS / 'probe_format.py'}", "--model=probe-replay"]
    refused = run_cli(args, tmp_path)
    assert refused.returncode == 2
    assert refused.stderr.strip().splitlines()[-1] == (
        "error: --model=probe-replay runs probe tasks only: --dataset_file must name a .probe file"
    )


@pytest.mark.docker
def test_a_plug_in_formats_build_is_made_once_by_the_docker_backend_before_any_sample(
    tmp_path, docker_images, docker_run_name
):
    """An entry's build (not Harbor's): its image made by the docker backend before the first sample, its lines
    prefixed with the format's name, its samples in that image, its line's task naming it; found the next run."""
    import docker

    (tmp_path / "ctx").mkdir()
    (tmp_path / "ctx" / "Dockerfile").write_text(f"FROM {docker_images[0]}\nRUN echo baked > /marker\n")
    (tmp_path / "ctx" / "unique.txt").write_text(f"{tmp_path}\n")  # a context of its own: its own tag
    (tmp_path / "tasks.probe").write_text("built:ctx\n")
    args = ["--dataset_file=tasks.probe", "--batch_size=5", "--model=probe-replay", "--output_dir=out"]
    args += [f"--plugins={PLUGINS / 'probe_format.py'}"]
    engine = docker.from_env()
    try:
        first = run_cli([*args, f"--run_name={docker_run_name}"], tmp_path)
        again = run_cli([*args, f"--run_name={docker_run_name}-again"], tmp_path)
    finally:  # the image the first run built is labelled with its run directory
        for image in engine.images.list(filters={"label": "batch_runner.run_dir"}):
            if image.labels["batch_runner.run_dir"].startswith(os.path.realpath(tmp_path)):
                engine.images.remove(image.id, force=True)
    assert first.returncode == 0, first.stderr
    stderr = first.stderr.splitlines()
    assert stderr[1] == "probe: building 1 image(s), 1 at a time"
    assert any(line.startswith("probe: [1/1] built:ctx: built (") for line in stderr)
    [line] = RunDir(tmp_path / "out" / docker_run_name).trajectories()
    assert line["check"]["output"].startswith("built:ctxbaked|")  # the token, then the image's own /marker
    assert line["task"]["image"].startswith("br-test-probe/built:") and line["task"]["image_id"].startswith("sha256:")
    assert again.returncode == 0, again.stderr
    assert not any("building" in x for x in again.stderr.splitlines())  # found, not built again
    [line_again] = RunDir(tmp_path / "out" / f"{docker_run_name}-again").trajectories()
    assert line_again["task"]["image"] == line["task"]["image"]


def test_every_kind_refuses_a_name_declared_twice_naming_both_and_takes_the_same_declaration_again():
    """One rule in agentbatch/registry.py for the four kinds (a dataset format used to compare class names only,
    so two modules' `Lines` classes silently replaced each other)."""
    from agentbatch import dataset_formats
    from agentbatch.model import registry as models
    from agentbatch.registry import RegistrationError

    def first_module():
        class Lines:
            def claims(self, path):
                return False

        @models.register_model("twice-model")
        def factory(settings):
            return ScriptedModel([])

        return Lines, factory

    def second_module():
        class Lines:
            def claims(self, path):
                return False

        def factory(settings):
            return ScriptedModel([])

        return Lines, factory

    lines, factory = first_module()
    other_lines, other_factory = second_module()
    other_lines.__module__ = other_factory.__module__ = "somebody_else"
    other_lines.__qualname__ = lines.__qualname__  # another module's class of the same name
    try:
        dataset_formats.dataset_format("twice-format")(lines)
        dataset_formats.dataset_format("twice-format")(lines)  # its module imported again: the same declaration
        models.register_model("twice-model")(factory)
        with pytest.raises(
            RegistrationError, match=r"dataset format 'twice-format' is registered twice: by .*somebody"
        ):
            dataset_formats.dataset_format("twice-format")(other_lines)
        with pytest.raises(
            RegistrationError, match=r"model 'twice-model' is registered twice: by .*factory and somebody"
        ):
            models.register_model("twice-model")(other_factory)
        assert type(dataset_formats.formats()["twice-format"]) is lines
        assert models.registered("twice-model").factory is factory
    finally:
        dataset_formats.FORMATS._items.pop("twice-format", None)
        models.MODELS._items.pop("twice-model", None)
