"""A plug-in dataset format from outside the package, for the tests: what Harbor does, in a few lines, through
the same interface (docs/datasets.md). A `.probe` file holds one task name a line:

- each entry has its own check timeout (40 s, scaled by --timeout_multiplier), hooks that write a token into the
  sandbox before the agent and read it back as the check, and a category in its metadata;
- a task named `hurried` has its own prompt timeout, too short for any model call;
- a task named `broken` cannot run (`unavailable`): its samples fail before any model call;
- a task named `built:<dir>` has its image built from the build context `<dir>` (a Dockerfile) by the backend;
- in the runner: a line before any sample (`prepare`), the format's sandbox note, and a verdict after the
  summary (`at_end`), which counts the lines of the run's trajectories.jsonl.

`--model=probe-replay` is registered for this format only, with the flags it implies.
"""

import hashlib
import json
import os

from agentbatch import (
    CheckResult,
    DatasetError,
    Entry,
    HookContext,
    ImageBuild,
    RunContext,
    ScriptedModel,
    TaskHooks,
    TaskLimits,
    dataset_format,
    register_model,
)

TOKEN_FILE = "probe-token"  # in the working directory: the local sandbox confines files to it


class ProbeHooks(TaskHooks):
    def __init__(self, name: str):
        self.name = name

    def before_agent(self, sample: HookContext) -> dict:
        sample.sandbox().write_file(TOKEN_FILE, self.name.encode())
        return {"token": self.name, "model": sample.model}

    def check(self, sample: HookContext, before: dict) -> CheckResult:
        done = sample.sandbox().exec(f"cat {TOKEN_FILE}; cat /marker 2>/dev/null || true", timeout=sample.check_timeout)
        passed = done.output.startswith(before["token"])
        output = f"{done.output.strip()}|model={before['model']}|timeout={sample.check_timeout:g}"
        return CheckResult("passed" if passed else "failed", float(passed), passed, done.exit_code, output)


def _context_hash(context: str) -> str:
    digest = hashlib.sha256()
    for name in sorted(os.listdir(context)):
        with open(os.path.join(context, name), "rb") as f:
            digest.update(name.encode() + b"\0" + f.read())
    return digest.hexdigest()


def _entry(n: int, name: str, folder: str) -> Entry:
    build = None
    if name.startswith("built:"):
        context = os.path.join(folder, name.split(":", 1)[1])
        build = ImageBuild(context, "br-test-probe/built", _context_hash(context), name, 120.0)
    return Entry(
        n,
        f"probe task {name}",
        identity=f"probe:{name}",
        metadata={"name": name, "difficulty": None, "category": "probe", "tags": []},
        build=build,
        limits=TaskLimits(1e-6 if name == "hurried" else None, 40.0),
        hooks=ProbeHooks(name),
        unavailable="probe tasks named broken cannot run" if name == "broken" else None,
    )


@dataset_format("probe")
class Probe:
    sandbox_note = "sandbox: the probe's own (a token in each sandbox)"

    def claims(self, path: str) -> bool:
        return path.endswith(".probe")

    def load(self, path: str, max_samples: int | None):
        try:
            with open(path, encoding="utf-8") as f:
                names = [line.strip() for line in f if line.strip()]
        except OSError as e:
            raise DatasetError(f"cannot read {path}: {e.strerror}") from None
        folder = os.path.dirname(os.path.abspath(path))
        return [_entry(n, name, folder) for n, name in enumerate(names, start=1)][:max_samples], []

    def prepare(self, entries: list[Entry], run: RunContext) -> None:
        run.log(f"probe: {len(entries)} tasks, model {run.model}, before any sample")

    def at_end(self, entries: list[Entry], run: RunContext) -> list[str]:
        with open(os.path.join(run.run_dir, "trajectories.jsonl"), encoding="utf-8") as f:
            lines = [json.loads(line) for line in f if line.strip()]
        return [f"probe verdict: {sum(bool(r['passed']) for r in lines)} of {len(entries)} tasks passed"]


def _replay(messages: list[dict]) -> dict:
    if not any(m.get("role") == "tool" for m in messages):
        return {"tool_calls": [{"name": "terminal", "arguments": {"command": "echo probing"}}]}
    return {"content": "probed"}  # no reasoning: --require_reasoning=false is implied


@register_model(
    "probe-replay",
    implies={"distribution": "terminal_only", "require_reasoning": False},
    dataset_formats=("probe",),
    refusal="--model=probe-replay runs probe tasks only: --dataset_file must name a .probe file",
)
def probe_replay(settings):
    return ScriptedModel([_replay])
