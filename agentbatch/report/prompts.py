"""Prompts across the runs of a report: one table in which a prompt of one run is the same row as that prompt in
another (matched by its text, and by which occurrence of that text it is when a dataset repeats one), and per
prompt what each run made of it, for the side-by-side view."""

from __future__ import annotations

from collections import defaultdict

from agentbatch.report.pack import KIND_CODES, PREVIEW, STATUS_CODES, Index

_PASSED, _FAILED = STATUS_CODES["passed"], STATUS_CODES["failed"]


def unify(index: Index) -> dict:
    """Number the prompts of every run in one table, rewrite the index's prompt column to it; the table."""
    by_text: dict[tuple[int, str], set] = defaultdict(set)
    for run, pindex, text in index.prompt_rows:
        by_text[run, text].add(pindex)
    occurrence: dict[tuple[int, int | None, str], int] = {}
    for (run, text), indexes in by_text.items():
        for rank, pindex in enumerate(sorted(indexes, key=lambda i: (i is None, i or 0))):
            occurrence[run, pindex, text] = rank
    # In the order of the first run that has each prompt, by its index there (the dataset's order).
    order = sorted(range(len(index.prompt_rows)), key=lambda i: _place(index.prompt_rows[i]))
    ids: dict[tuple[str, int], int] = {}
    local_to_global: list[int] = [0] * len(index.prompt_rows)
    texts: list[str] = []
    lengths: list[int] = []
    for local in order:
        run, pindex, text = index.prompt_rows[local]
        key = (text, occurrence[run, pindex, text])
        gid = ids.get(key)
        if gid is None:
            gid = ids[key] = len(texts)
            texts.append(text[:PREVIEW])
            lengths.append(len(text))
        local_to_global[local] = gid
    column = index.columns["prompt"]
    index.columns["prompt"] = [local_to_global[p] for p in column]
    return {"text": texts, "length": lengths}


def _place(row: tuple[int, int | None, str]) -> tuple:
    run, pindex, text = row
    return (run, pindex is None, pindex or 0, text)


def side_by_side(index: Index, runs: int, prompts: int) -> dict:
    """Per prompt and run: samples answered, samples checked, samples passed, failed attempts."""
    shape = {k: [[0] * prompts for _ in range(runs)] for k in ("samples", "checked", "passed", "failed_attempts")}
    col = index.columns
    for run, kind, prompt, status in zip(col["run"], col["kind"], col["prompt"], col["status"], strict=True):
        if kind == KIND_CODES["failed"]:
            shape["failed_attempts"][run][prompt] += 1
            continue
        shape["samples"][run][prompt] += 1
        if status in (_PASSED, _FAILED):
            shape["checked"][run][prompt] += 1
            shape["passed"][run][prompt] += status == _PASSED
    return shape


def dataset_note(names: list[str], checkpoints: list[dict], shape: dict) -> dict:
    """Whether the runs are of one dataset, and how many prompts each has and all share."""
    seen = [
        {p for p, (s, f) in enumerate(zip(shape["samples"][r], shape["failed_attempts"][r], strict=True)) if s or f}
        for r in range(len(names))
    ]
    common = set.intersection(*seen) if seen else set()
    datasets = [(c.get("dataset_file"), c.get("total_prompts")) for c in checkpoints]
    # One dataset: the same prompts, or (runs not finished yet) the same dataset file of the same size.
    same = len({frozenset(s) for s in seen}) == 1 or (all(d[0] for d in datasets) and len(set(datasets)) == 1)
    return {
        "same_dataset": same,
        "datasets": [
            {"run": n, "dataset_file": d[0], "total_prompts": d[1]} for n, d in zip(names, datasets, strict=True)
        ],
        "prompts_per_run": [len(s) for s in seen],
        "prompts_in_all": len(common),
        "prompts_in_any": len(set.union(*seen)) if seen else 0,
    }
