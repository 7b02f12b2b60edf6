"""--rescore (docs/replay.md): every sample of a finished run checked again against its row's checks as the dataset
has them now, with no model call.

Each trajectory and discard is matched to the row it answers (run_dir's reader reads every line): its row's
identity when nothing of the row changed (its check stands), else the row at its prompt_index with its prompt
text, else the one row with that text. An `answer` is compared with the line's recorded last message; `verify`
and a format's own check (a Harbor task's tests) run in a fresh sandbox holding the sample's kept final state
(--keep_final_state, sample_state.py), `parallel` at once. A line checked again keeps its earlier checks in
`checks`, the new one last, takes the new one's `reward`, `passed` and `check` (what statistics, exports and the
report read) and its row's current identity (what resume matches: the line answers the row as it is now).

Each file whose lines changed is replaced whole (RunFiles.replace_lines: run_dir/atomic.py), under the session
lock; a killed rescore has replaced some files and not others, and the next rescore checks only the lines whose
identity is not yet their row's: nothing is lost, and running it again finishes it.
"""

from __future__ import annotations

import itertools
import os
import sys
from collections import Counter
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field, replace

from agentbatch import sample_state, verification
from agentbatch.dataset import Entry
from agentbatch.errors import FatalError
from agentbatch.limits import SampleLimits
from agentbatch.model.base import ModelCallError, Reply
from agentbatch.model.usage import Usage
from agentbatch.run_dir.files import RunFiles
from agentbatch.run_dir.lock import session_lock
from agentbatch.run_dir.merge import merge
from agentbatch.run_dir.paths import STATISTICS
from agentbatch.run_dir.reader import Line
from agentbatch.run_statistics import Tally, format_summary
from agentbatch.sandboxes import registry as sandbox_backends
from agentbatch.sandboxes.base import SandboxError, SandboxSpec
from agentbatch.secrets_guard import Redactor
from agentbatch.task_hooks import HookContext
from agentbatch.terminal_text import safe
from agentbatch.tools.context import ToolContext
from agentbatch.verification import CheckResult
from agentbatch.work import RunConfig, now_iso
from trajectory import check_entry, first_human, to_openai_messages

EXIT_INTERRUPTED = 130
SHOWN_PROBLEMS = 5  # the replays that failed, named in the summary


@dataclass
class RescoreSettings:
    """What a rescore needs (launch.py builds it from the flags): the run, the dataset as it is now, its sandboxes."""

    run_dir: str
    entries: list[Entry]
    cfg: RunConfig  # its sandbox settings, check time limit, secrets and labels; no model is called
    session_id: str
    samples_per_prompt: int = 1  # at least: statistics count the samples the lines show
    parallel: int = 4  # checks at once
    at_end: Callable[[int], int] | None = None  # the exports and the report asked for, as a session's


@dataclass
class Job:
    """One line to check again: where it is, the row it answers now, what its check reads."""

    file: str  # the file's path
    number: int  # among the file's lines that are not blank, 1-based
    entry: Entry
    last_message: str
    state: str | None  # its kept final state's path, when its check needs a sandbox


@dataclass
class Counts:
    """What a rescore did, for its summary."""

    current: int = 0  # the row is as it was: its check stands
    checked: int = 0
    changed: Counter = field(default_factory=Counter)  # (was passed, is passed) of the lines checked
    no_row: int = 0
    no_state: int = 0
    problems: list[str] = field(default_factory=list)  # replays that failed: their lines keep their checks


def run(s: RescoreSettings) -> int:
    """Rescore the run holding its directory's lock; the exit code (0, 3 if a replay failed, 130 on Ctrl-C)."""
    files = RunFiles(s.run_dir, secrets=s.cfg.secrets)
    with session_lock(files.paths, s.session_id, now_iso()):
        reader = files.reader()
        if not reader.exists():
            raise FatalError(f"{files.dir} holds no run to rescore: give the --run_name of a finished run")
        files.use_tools(reader.tool_set)
        counts = Counts()
        jobs, samples = _plan(files, s.entries, counts)
        print(
            f"rescore: {len(jobs)} samples to check again, {counts.current} whose row is unchanged, "
            f"{counts.no_state} whose check needs a final state this run did not keep (--keep_final_state), "
            f"{counts.no_row} answering no row of the dataset -> {files.dir}",
            file=sys.stderr,
        )
        results, interrupted = _check_all(jobs, s, counts)
        _rewrite(files, jobs, results, counts)
        stats = _finish(files, s, max(samples, s.samples_per_prompt))
        print(format_summary(stats))
        print(_summary(counts))
        code = EXIT_INTERRUPTED if interrupted else 3 if counts.problems else 0
        if interrupted:
            print("rescore stopped by Ctrl-C; run it again to finish", file=sys.stderr)
        return s.at_end(code) if s.at_end is not None else code


def _plan(files: RunFiles, entries: list[Entry], counts: Counts) -> tuple[list[Job], int]:
    """The lines to check again, in file order; and the most samples a prompt has in the lines."""
    rows = _Rows(entries)
    jobs: list[Job] = []
    samples = 1
    reader = files.reader()
    for line in itertools.chain(reader.trajectories(), reader.discards()):
        r = line.record
        sample = r.get("sample_index")
        samples = max(samples, sample + 1 if type(sample) is int and sample >= 0 else 1)
        entry = rows.match(r)
        if entry is None:
            counts.no_row += 1
        elif r.get("identity") == entry.identity:
            counts.current += 1
        elif (job := _job(files, line, entry)) is None:
            counts.no_state += 1
        else:
            jobs.append(job)
    return jobs, samples


def _job(files: RunFiles, line: Line, entry: Entry) -> Job | None:
    """The line's job; None when its check needs a sandbox and the run kept no final state of it."""
    state = None
    if entry.hooks is not None or entry.verify:
        name = line.record.get("final_state")
        state = files.paths.final_state(name) if isinstance(name, str) and name else None
        if state is None or not os.path.isfile(state):
            return None
    messages = to_openai_messages(line.record.get("conversations") or [])
    return Job(files.paths.path(line.file), line.line, entry, verification.last_message(messages), state)


class _Rows:
    """The dataset's rows as lines find theirs: by identity, else at the line's prompt_index, else by prompt text."""

    def __init__(self, entries: list[Entry]):
        self.entries = entries
        self.by_identity = {e.identity: e for e in entries}
        self.by_prompt: dict[str, list[Entry]] = {}
        for e in entries:
            self.by_prompt.setdefault(e.prompt, []).append(e)

    def match(self, record: dict) -> Entry | None:
        found = self.by_identity.get(record.get("identity"))
        if found is not None:
            return found
        prompt, index = first_human(record), record.get("prompt_index")
        if type(index) is int and 0 <= index < len(self.entries) and self._same(self.entries[index], prompt, record):
            return self.entries[index]
        alike = [e for e in self.by_prompt.get(prompt, ()) if self._same(e, prompt, record)]
        return alike[0] if len(alike) == 1 else None

    @staticmethod
    def _same(entry: Entry, prompt: str | None, record: dict) -> bool:
        """The row's prompt, and a task's name where the line has one (a Harbor task's)."""
        name = record.get("task", {}).get("name") if isinstance(record.get("task"), dict) else None
        own = (entry.metadata or {}).get("name")
        return entry.prompt == prompt and (name is None or own is None or name == own)


def _check_all(jobs: list[Job], s: RescoreSettings, counts: Counts) -> tuple[dict[tuple[str, int], dict], bool]:
    """Every job's new check, `parallel` at once; on Ctrl-C those running finish and no other starts."""
    results: dict[tuple[str, int], dict] = {}
    pending = iter(jobs)
    running: dict[Future, Job] = {}
    interrupted = False
    with ThreadPoolExecutor(max_workers=max(1, s.parallel), thread_name_prefix="rescore") as pool:
        try:
            while True:
                while not interrupted and len(running) < max(1, s.parallel) and (job := next(pending, None)):
                    running[pool.submit(check, job, s.cfg)] = job
                if not running:
                    break
                done, _ = wait(running, timeout=1.0, return_when=FIRST_COMPLETED)
                for future in done:
                    _take(running.pop(future), future, results, counts)
        except KeyboardInterrupt:
            interrupted = True
            for future in list(running):  # they end with their check: their sandboxes are removed by them
                _take(running.pop(future), future, results, counts, wait_for=True)
    return results, interrupted


def _take(job: Job, future: Future, results: dict, counts: Counts, wait_for: bool = False) -> None:
    try:
        result = future.result() if wait_for or future.done() else None
    except Exception as e:  # the sandbox could not be made or replayed (or a bug): this line keeps its checks
        name = (job.entry.metadata or {}).get("name") or job.entry.prompt[:60]
        what = str(e) if isinstance(e, SandboxError | OSError | TimeoutError) else f"internal error: {e!r}"
        counts.problems.append(safe(" ".join(f"{name}: {what}".split())))
        return
    if result is not None:
        results[job.file, job.number] = result.fields()


def check(job: Job, cfg: RunConfig) -> CheckResult:
    """One line's check as its row has it now: its answer against the recorded last message, its verify or its
    format's check in a fresh sandbox holding its kept final state (SandboxError if that cannot be made)."""
    e = job.entry
    timeout = e.limits.check_timeout if e.limits.check_timeout is not None else cfg.check_timeout
    if job.state is None:  # an answer alone, or no check at all now
        return verification.run_check(None, None, e.answers, job.last_message, timeout)
    kept = sample_state.manifest(job.state)
    spec = SandboxSpec(
        replace(cfg.sandbox, kind=kept.backend, image_kind=kept.backend),
        image=kept.image,
        cwd=kept.cwd,
        run_name=cfg.run_name,
        labels=dict(cfg.sandbox_labels),
        resources=e.resources,
    )
    sandbox_backends.get(spec.kind).prepare(spec)
    ctx = ToolContext(cfg.tools, spec, _NoModel(), Usage(), limits=SampleLimits(), redact=Redactor(cfg.secrets))
    try:
        hooked = HookContext(ctx, "", timeout)
        before = e.hooks.before_replay(hooked) if e.hooks is not None else None
        sample_state.restore(ctx.sandbox(), job.state, kept)
        result = e.hooks.check(hooked, before) if e.hooks is not None else None
        if result is None:
            result = verification.run_check(ctx, e.verify, e.answers, job.last_message, timeout)
        if ctx.sandbox_error is not None:
            raise ctx.sandbox_error
        return result
    finally:
        ctx.close()


class _NoModel:
    """A rescore's model: it has none, and its checks call none."""

    def chat(self, messages, tools=None, model=None, deadline=None) -> Reply:
        raise ModelCallError("a rescore makes no model call")

    def generate_image(self, request, deadline=None) -> Reply:
        raise ModelCallError("a rescore makes no model call")


def _rewrite(files: RunFiles, jobs: list[Job], results: dict[tuple[str, int], dict], counts: Counts) -> None:
    """Each file whose lines were checked again, replaced whole with them; the other lines as they were."""
    wanted = {(job.file, job.number): job for job in jobs if (job.file, job.number) in results}
    changed: dict[str, dict[int, dict]] = {}
    now = now_iso()
    reader = files.reader()
    for line in itertools.chain(reader.trajectories(), reader.discards()):
        key = (files.paths.path(line.file), line.line)
        job = wanted.get(key)
        if job is None:
            continue
        new = rescored(line.record, results[key], job.entry, now)
        changed.setdefault(key[0], {})[line.line] = new
        counts.changed[line.record.get("passed") is True, new["passed"] is True] += 1
    for path, lines in changed.items():
        counts.checked += files.replace_lines(path, lines)


def rescored(record: dict, fields: dict, entry: Entry, now: str) -> dict:
    """The line with its new check: the newest in reward, passed and check, every check in `checks` (the new one
    last), and its row's identity as the row is now."""
    earlier = record.get("checks")
    if not isinstance(earlier, list) or not earlier:  # a line from before `checks`: its own check is the first
        when = (record.get("metadata") or {}).get("timestamp") if isinstance(record.get("metadata"), dict) else None
        earlier = [check_entry(record, when if isinstance(when, str) else "")]
    new = {**record, **fields, "identity": entry.identity, "checks": [*earlier, check_entry(fields, now)]}
    if "checks" in record:
        return new
    # A line from before `checks`: it goes right after `check`, where every line has it (one order of keys).
    out: dict = {}
    for key, value in new.items():
        if key != "checks":
            out[key] = value
        if key == "check":
            out["checks"] = new["checks"]
    return out


def _finish(files: RunFiles, s: RescoreSettings, samples: int) -> dict:
    """trajectories.jsonl and statistics.json from the files as the rescore left them."""
    tally = Tally(files.tool_names)
    merged = merge(files, tally.add_trajectory)
    reader = files.reader()
    was = reader.read_json(STATISTICS)
    checkpoint = reader.checkpoint()
    run = {
        "run_name": checkpoint.get("run_name") or was.get("run_name") or s.cfg.run_name,
        "model": checkpoint.get("model") or was.get("model"),
        "distribution": checkpoint.get("distribution") or was.get("distribution"),
        "duration_seconds": was.get("duration_seconds") or checkpoint.get("duration_seconds") or 0.0,
        "updated_at": now_iso(),
    }
    doc = tally.document(reader, s.entries, samples, merged, run)
    files.write_json(STATISTICS, doc)
    return doc


def _summary(counts: Counts) -> str:
    c = counts.changed
    lines = [
        f"rescore: {counts.checked} samples checked again ({c[False, True]} now pass, {c[True, False]} no longer "
        f"pass, {c[True, True] + c[False, False]} as before); {counts.current} whose row is unchanged kept their "
        f"check; {counts.no_state} not checked again without a kept final state; {counts.no_row} answering no row"
    ]
    if counts.problems:
        lines.append(f"  {len(counts.problems)} could not be checked again (their lines keep their checks):")
        lines += [f"    {p}" for p in counts.problems[:SHOWN_PROBLEMS]]
    return "\n".join(lines)
