"""What a run's lines answer: each finished line matched, by content, to the dataset row it came from.

A line carries its row's `identity` (dataset.task_identity: the whole task, so two rows with one prompt text
and different checks or images are two rows). Lines written before identities existed have none; they match
by their prompt text, as they always did (README, "Resume"). A row's sample s is answered by a line of its
identity and sample s, else by such an older line; a row that occurs k times needs k of them.
"""

from __future__ import annotations

import hashlib
import itertools
from collections import Counter
from typing import TYPE_CHECKING

from trajectory import first_human

if TYPE_CHECKING:
    from agentbatch.dataset import Entry
    from agentbatch.run_dir.reader import RunReader

# (identity, sample index), or (prompt key, sample index) for a line written before identities: a str or bytes
# first part, so the two kinds never meet in one Counter.
AnswerKey = tuple[str | bytes, int]


def prompt_key(prompt: str) -> bytes:
    """A fixed-size key for a prompt text, so resume memory does not grow with prompt length."""
    return hashlib.blake2b(prompt.encode("utf-8", "surrogatepass"), digest_size=16).digest()


def answer_key(line: dict) -> AnswerKey | None:
    """The row and sample a trajectory, discard or failure line answers; lines from before samples are sample 0."""
    sample = line.get("sample_index")
    sample = sample if type(sample) is int else 0
    identity = line.get("identity")
    if type(identity) is str and identity:
        return identity, sample
    return (prompt_key(prompt), sample) if isinstance(prompt := _prompt(line), str) else None


def _prompt(line: dict) -> object:
    """The prompt text a line answers: a failed attempt's `prompt`, a trajectory's first human turn. A failed line
    is any JSON object (record_shape): one holding `conversations` of another shape has none."""
    if "conversations" not in line:
        return line.get("prompt")
    turns = line["conversations"]
    if type(turns) is not list or not all(type(t) is dict for t in turns):
        return None
    return first_human(line)


def take(answers: Counter, entry: Entry, sample: int) -> bool:
    """Count off one line of `answers` answering this row's sample: one of its identity, else an older line of its
    prompt text; False when none is left."""
    key: AnswerKey = (entry.identity, sample)
    if answers[key] <= 0:
        key = (prompt_key(entry.prompt), sample)
        if answers[key] <= 0:
            return False
    answers[key] -= 1
    return True


def count(line: dict, into: Counter) -> None:
    """Count the line under the row and sample it answers."""
    if (key := answer_key(line)) is not None:
        into[key] += 1


def done_counts(reader: RunReader) -> Counter:
    """What the resume scan finds: row and sample → the lines answering it, the batch files' trajectories that
    count and the discards (a line the merge drops answers nothing: counting it would leave its row out of
    every output)."""
    done: Counter = Counter()
    for line in itertools.chain(reader.trajectories(), reader.discards()):
        count(line.record, done)
    return done


def remaining(entries: list[Entry], samples: int, done: Counter) -> list[tuple[int, Entry, int]]:
    """(index, entry, sample index) of the dataset's samples no line answers, in dataset order (`done` is used up)."""
    return [(i, e, s) for i, e in enumerate(entries) for s in range(samples) if not take(done, e, s)]


def last_words(entries: list[Entry], samples: int, kept: Counter, discarded: Counter, failed: Counter) -> dict:
    """The dataset's samples by their last word: done, discarded, failed, or not run yet (the counts are used up)."""
    out = Counter(total=len(entries) * samples)
    for e in entries:
        for s in range(samples):
            if take(kept, e, s):
                out["done"] += 1
            elif take(discarded, e, s):
                out["discarded"] += 1
            elif take(failed, e, s):
                out["failed"] += 1
            else:
                out["not_run"] += 1
    return {k: out[k] for k in ("total", "done", "discarded", "failed", "not_run")}
