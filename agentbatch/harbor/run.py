"""The parent's part of a run of Harbor tasks, the format's steps in the runner (dataset_steps.py): the
task.toml warnings and the refusals this machine makes before any sample, the verifiers' images and the tasks'
MCP tools once the images are made, and at the session's end the warnings recorded and the oracle's verdict.

`prepare` says, once per run, each task.toml field that is ignored or not applied, fails at once the samples of
a task whose network policy cannot be enforced here, and gives an oracle run's containers the [solution] env
(the images are then made by the docker backend, as for any entry with a build). `ready` has a separate
verifier's image built from tests/ the same way, and lists each task's own MCP servers (task_mcp.py), whose
toolsets it names. `oracle_summary` is the end of an oracle run's summary: the reference solutions that pass,
and the tasks whose reference solution does not.
"""

from __future__ import annotations

import json
from collections import defaultdict
from dataclasses import replace

from agentbatch.dataset import Entry
from agentbatch.dataset_steps import RunContext
from agentbatch.harbor import network_policy, oracle
from agentbatch.harbor.sample import HarborHooks
from agentbatch.run_dir import atomic
from agentbatch.run_dir.paths import HARBOR_WARNINGS, RunPaths
from agentbatch.run_dir.reader import RunReader, read_json
from agentbatch.terminal_text import safe


def harbor_entries(entries: list[Entry]) -> list[Entry]:
    return [e for e in entries if isinstance(e.hooks, HarborHooks)]


def prepare(entries: list[Entry], run: RunContext) -> None:
    """Before any sample: one warning per task.toml field ignored or not applied, unless this run said it already;
    a task whose network policy cannot be enforced here refused; an oracle run's [solution] env."""
    for line in field_warnings(entries, shown_warnings(run.run_dir)):
        run.log(f"warning: {line}")
    for e in harbor_entries(entries):
        task = e.hooks.task
        refused = network_policy.refusal(task.config, task.compose is not None)
        if refused and not e.unavailable:
            e.unavailable = refused
        if run.model == oracle.NAME and task.config.solution_env and e.resources is not None:
            # Harbor scopes it to solve.sh; the tests get it taken away again (verifier._command).
            env = {**dict(e.resources.env), **task.config.solution_env}
            e.resources = replace(e.resources, env=tuple(env.items()))


def ready(entries: list[Entry], run: RunContext) -> dict[str, tuple[tuple[str, ...], str]]:
    """Once the entries' images are made: the separate verifiers' images from tests/, and the tasks' MCP tools
    (their toolsets, for the run's tool set); a task whose either cannot be had fails its samples at once."""
    todo = [e for e in harbor_entries(entries) if not e.unavailable and e.hooks.task.verifier_build is not None]
    if todo and run.make_images is not None:
        for e, made in zip(todo, run.make_images([e.hooks.task.verifier_build for e in todo]), strict=True):
            if made.error:
                e.unavailable = f"the separate verifier's image: {made.error}"
            else:
                e.hooks.verifier_image = made.image
    return task_tools(entries, run)


def task_tools(entries: list[Entry], run: RunContext) -> dict[str, tuple[tuple[str, ...], str]]:
    """Each task's MCP servers listed in an environment of its own (task_mcp.py); their toolsets by name."""
    todo = [e for e in harbor_entries(entries) if not e.unavailable and e.hooks.task.config.environment.mcp_servers]
    if not todo or run.sandbox is None:
        return {}
    try:
        from agentbatch.harbor import task_mcp
    except ImportError as err:
        for e in todo:
            e.unavailable = f"its MCP servers need the MCP SDK ({err}): pip install 'batch-runner[mcp]'"
        return {}
    run.log(f"listing the MCP servers of {len(todo)} task(s)")
    tools: dict[str, list[str]] = {}
    owners: dict[str, list[str]] = defaultdict(list)
    try:
        for e in todo:
            task = e.hooks.task
            try:
                listed = task_mcp.list_tools(task_mcp.spec_for(run.sandbox, e), task)
            except (task_mcp.SandboxError, task_mcp.ServerError) as err:
                e.unavailable = safe(f"its MCP servers cannot be listed: {err}")
                continue
            clash = task_mcp.clash(listed, run.taken)
            if clash:
                e.unavailable = safe(clash)
                continue
            e.hooks.mcp = listed
            for item in listed:
                names = tools.setdefault(item.server.name, [])
                names += [t.name for t in item.tools if t.name not in names]
                owners[item.server.name].append(task.name)
    finally:
        task_mcp.done_listing()
    return {
        name: (tuple(names), safe(f"MCP server of Harbor task(s) {', '.join(owners[name][:3])}"))
        for name, names in tools.items()
    }


def at_end(entries: list[Entry], run: RunContext) -> list[str]:
    """At the session's end (the run directory is its own by then): the warnings given recorded, and the oracle's
    verdict when the model is the oracle (the lines printed after the summary)."""
    _record_warnings(run.run_dir, entries)
    return oracle_summary(run.run_dir, entries) if run.model == oracle.NAME else []


def field_warnings(entries: list[Entry], shown: set[tuple[str, str]] = frozenset()) -> list[str]:
    """One line per task.toml field ignored or not applied, naming its tasks; a (warning, task) already shown
    to this run (`shown`, shown_warnings) is left out: each is said once per run, not once per session."""
    which: dict[str, list[str]] = defaultdict(list)
    for e in harbor_entries(entries):
        for what in e.hooks.task.warnings:
            if (what, e.hooks.task.name) not in shown:
                which[what].append(e.hooks.task.name)
    out = []
    for what, names in which.items():
        some = ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")
        out.append(safe(f"task.toml: {what} ({some})"))
    return out


def shown_warnings(run_dir: str) -> set[tuple[str, str]]:
    """The (warning, task) pairs an earlier session of this run showed (HARBOR_WARNINGS)."""
    record = read_json(RunPaths(run_dir).path(HARBOR_WARNINGS)) or {}
    pairs = record.get("shown") if isinstance(record.get("shown"), list) else []
    return {(p[0], p[1]) for p in pairs if isinstance(p, list) and len(p) == 2 and all(isinstance(x, str) for x in p)}


def _record_warnings(run_dir: str, entries: list[Entry]) -> None:
    """Every (warning, task) pair of this session's tasks, added to the run's record: the next session is quiet."""
    pairs = shown_warnings(run_dir) | {
        (w, e.hooks.task.name) for e in harbor_entries(entries) for w in e.hooks.task.warnings
    }
    if pairs:
        text = json.dumps({"shown": sorted(map(list, pairs))}, ensure_ascii=False, indent=1)
        try:
            atomic.write_text(RunPaths(run_dir).path(HARBOR_WARNINGS), text + "\n")
        except OSError:
            pass  # the warnings are said again next session: nothing else depends on it


def oracle_summary(run_dir: str, entries: list[Entry]) -> list[str]:
    """The oracle's pass rate over the dataset's tasks, then each task whose reference solution does not pass.

    Lines of an earlier version of a task (another identity: it was edited since) do not count.
    """
    tasks = {e.hooks.task.name: e.identity for e in harbor_entries(entries)}

    def of_this_dataset(line: dict) -> str | None:
        name, identity = _task_name(line), line.get("identity")
        if name not in tasks or (isinstance(identity, str) and identity and identity != tasks[name]):
            return None
        return name

    reader = RunReader(run_dir)  # the lines that count, as the merge kept them
    verdicts: dict[str, list[str]] = defaultdict(list)  # task name -> one word per sample ("passed", or why not)
    for line in (*reader.trajectories(), *reader.discards()):
        task = of_this_dataset(line.record)
        if task is not None:
            verdicts[task].append(_verdict(line.record))
    failed: dict[str, str] = {}
    for line in (x.record for x in reader.failures()):
        task = of_this_dataset(line)
        if task is not None and task not in verdicts:
            failed[task] = (str(line.get("error") or "failed").splitlines() or ["failed"])[0][:200]
    names = sorted(verdicts.keys() | failed.keys())
    if not names:
        return []
    bad = {n: failed.get(n) or ", ".join(v for v in verdicts[n] if v != "passed") for n in names}
    bad = {n: why for n, why in bad.items() if why}
    passing = len(names) - len(bad)
    lines = [
        f"  oracle: {passing} of {len(names)} tasks pass with their reference solution ({passing / len(names):.1%})"
    ]
    if bad:
        lines.append("  reference solution does not pass:")
        lines += [safe(f"    {name}: {why}") for name, why in bad.items()]
    return lines


def _task_name(line: dict) -> str | None:
    task = line.get("task")
    name = task.get("name") if isinstance(task, dict) else None
    return name if isinstance(name, str) else None


def _verdict(line: dict) -> str:
    """ "passed", or why not: the tests' verdict, after the solution's own failure when solve.sh failed."""
    why = _check_verdict(line)
    solution = _solution_failure(line) if why != "passed" else None
    return f"{solution}; the tests: {why}" if solution else why


def _check_verdict(line: dict) -> str:
    check = line.get("check") if isinstance(line.get("check"), dict) else {}
    status = check.get("status")
    if status == "passed":
        return "passed"
    if status == "failed":
        reward = line.get("reward")
        return f"not passed (reward {reward:g})" if isinstance(reward, int | float) else "not passed"
    if status == "timeout":
        return "the tests ran past the verifier's timeout"
    if status == "error":
        return "the tests gave no result: " + " ".join(str(check.get("output") or "").split())[-150:]
    return f"not checked ({line.get('stop_reason')})"


def _solution_failure(line: dict) -> str | None:
    """How the reference solution failed, from the oracle's one command in the line: its exit code and last line."""
    result = next((t for t in line.get("conversations") or () if isinstance(t, dict) and t.get("from") == "tool"), None)
    try:
        ran = json.loads(result["value"]) if result is not None else None
    except (TypeError, ValueError, RecursionError):
        return None
    if not isinstance(ran, dict):
        return None
    code, output = ran.get("exit_code"), ran.get("output")
    last = next((x.strip() for x in reversed(str(output or "").splitlines()) if x.strip()), "")
    tail = f": {last[-150:]}" if last else ""
    if ran.get("error"):
        return f"solve.sh did not finish ({ran['error']}){tail}"
    if isinstance(code, int) and not isinstance(code, bool) and code != 0:
        return f"solve.sh exited with {code}{tail}"
    return None
