"""A deterministic run directory for pinning what the Parquet export writes: ~10 MB of lines over several row
groups, current lines and every odd shape an export meets (older lines, newer fields, lines Arrow cannot type,
lone surrogates, torn and non-object lines, unknown tools)."""

from __future__ import annotations

import copy
import json
from pathlib import Path

from trajectory import STOP_REASONS, build_record

MODELS = ("pin/model-a", "pin/model-b")
SCHEMAS = [
    {"type": "function", "function": {"name": n, "description": f"the {n} tool", "parameters": {"type": "object"}}}
    for n in ("terminal", "read_file", "web_search")
]


def _listing(i: int, size: int) -> str:
    """Tool output of about `size` characters, different for every line, with some non-ASCII text."""
    rows = [f"-rw-r--r-- 1 user {i % 13:>3} {(i * 7 + k) % 9973:>5} file_{k}_é_日本.py" for k in range(size // 40)]
    return "\n".join(rows)


def regular(i: int) -> dict:
    """A line as the runner writes it: 0-3 rounds of tool calls (parallel ones, failures), reasoning, usage."""
    messages: list[dict] = [{"role": "user", "content": f"Task {i}: look around and report (🙂 {i % 5})."}]
    rounds = i % 4
    for r in range(rounds):
        names = ["terminal", "read_file"] if i % 5 == 0 else [("terminal", "read_file", "web_search")[(i + r) % 3]]
        calls = [
            {"id": f"c{i}_{r}_{k}", "function": {"name": n, "arguments": json.dumps({"arg": f"{i}/{r}/{k}"})}}
            for k, n in enumerate(names)
        ]
        messages.append({"role": "assistant", "content": "", "reasoning": f"round {r} of {i}", "tool_calls": calls})
        for k, n in enumerate(names):
            ok = (i + r + k) % 7 != 0
            content = json.dumps({"output": _listing(i + r, 1000 + (i * 37) % 4000), "error": None if ok else "x"})
            messages.append({"role": "tool", "tool_call_id": f"c{i}_{r}_{k}", "name": n, "content": content, "ok": ok})
    completed = i % 6 != 0
    stop = "answered" if completed else list(STOP_REASONS)[1 + i % 4]
    if completed or i % 12:
        messages.append({"role": "assistant", "content": f"Done with {i}.", "reasoning": "" if i % 3 else "wrap up"})
    return build_record(
        prompt_index=i,
        messages=messages,
        batch_num=i // 50,
        timestamp=f"2026-01-{1 + i % 28:02d}T10:{i % 60:02d}:00",
        model=MODELS[(i // 7) % 2],
        completed=completed,
        partial=not completed and stop in ("length", "context", "invalid_tools"),
        stop_reason=stop,
        api_calls=rounds + 1,
        toolsets=["terminal", "file"] + (["web"] if i % 2 else []),
        usage={"prompt_tokens": 100 * i % 9000, "completion_tokens": i % 300, "total_tokens": 100 * i % 9000 + i % 300},
        tool_schemas=SCHEMAS,
    )


def newer(i: int) -> dict:
    """A line as a later version writes it: sample index, reward, verdict, verification, cost, logprobs."""
    line = regular(i)
    line["sample_index"] = 1 + i % 2
    line["reward"] = [0.0, 0.5, 1, 0.25][i % 4]
    line["passed"] = i % 4 in (2, 3)
    line["verification"] = {"command": "pytest -q", "exit_code": i % 2, "output": f"check {i} ✓", "big": 2**70}
    line["usage"]["cost"] = 0.0001 * (i % 17) + 1e-9
    for turn in line["conversations"]:
        if turn["from"] == "gpt":
            turn["logprobs"] = [{"token": "a", "logprob": -0.125 * (i % 5)}]
    return line


def older(i: int) -> dict:
    """Lines of older or foreign writers that Arrow still types: keys missing, reordered, renamed, added."""
    line = regular(i)
    kind = (i // 3 + i // 10) % 6
    if kind == 0:  # tool_stats of the used tools only, in the order of use (not the registry's)
        used = [t["name"] for t in line["conversations"] if t["from"] == "tool"]
        line["tool_stats"] = {n: line["tool_stats"][n] for n in reversed(dict.fromkeys(used))}
        del line["sample_index"], line["tool_error_counts"]
    elif kind == 1:  # cost under its other name, another usage field, no model
        line["usage"].update(cost_usd=0.002 * i, reasoning_tokens=i)
        del line["metadata"]["model"]
    elif kind == 2:  # extra fields on the line and on a turn, one of them null
        line["source"] = {"dataset": "pin", "row": i}
        line["note"] = None
        line["conversations"][0]["weight"] = 0
    elif kind == 3:  # no usage, no toolsets, stop reason null, an empty tool call list
        del line["usage"], line["toolsets_used"]
        line["stop_reason"] = None
        line["conversations"].append({"from": "gpt", "value": "again", "tool_calls": []})
    elif kind == 4:  # a tool error count for a tool no longer offered
        line["tool_error_counts"]["retired_tool"] = 2
        line["tool_stats"]["retired_tool"] = {"count": 3, "success": 1, "failure": 2}
    else:  # both keys of cost, reward as a whole number
        line["usage"].update(cost=0.5, cost_usd=9.0)
        line["reward"] = 1
    return line


def untyped(i: int) -> dict:
    """Lines Arrow's reader cannot type with the export's schema (each sends its whole row group row by row)."""
    line = newer(i) if i % 2 else regular(i)
    kind = (i // 20) % 5
    if kind == 0:
        line["conversations"][0]["value"] = [{"type": "text", "text": f"multimodal {i}"}]
    elif kind == 1:
        line["tools"] = SCHEMAS
    elif kind == 2:
        line["reward"] = True
        line["api_calls"] = 3.0
    elif kind == 3:
        line["conversations"][-1]["value"] = f"cut here \ud800 {i}"  # a lone surrogate, as an endpoint sent it
    else:
        del line["conversations"]
    return line


def _dump(line: dict, ascii_only: bool = False) -> str:
    return json.dumps(line, ensure_ascii=ascii_only) + "\n"


def write_pin_run(run_dir: Path) -> Path:
    """batch_0: current, newer and older lines (all typed); batch_1: untyped ones among them; batch_2: current
    lines, one written with ASCII escapes, ending torn; batch_10: blank, non-object and unknown-tool lines."""
    run_dir.mkdir(parents=True)
    with open(run_dir / "batch_0.jsonl", "w", encoding="utf-8") as f:
        for i in range(420):
            f.write(_dump((regular, newer, older)[i % 3](i)))
    with open(run_dir / "batch_1.jsonl", "w", encoding="utf-8") as f:
        for i in range(420, 700):
            f.write(
                _dump(untyped(i), ascii_only=True) if i % 40 in (3, 20) else _dump(newer(i) if i % 2 else regular(i))
            )
    with open(run_dir / "batch_2.jsonl", "w", encoding="utf-8") as f:
        for i in range(700, 1000):
            f.write(_dump(older(i) if i % 10 == 0 else regular(i), ascii_only=i == 777))
        f.write(_dump(regular(1000))[:300])  # a kill tore the last line
    unknown = copy.deepcopy(regular(1001))
    unknown["conversations"][1]["tool_calls"][0]["name"] = "no_such_tool"
    with open(run_dir / "batch_10.jsonl", "w", encoding="utf-8") as f:
        f.write("\n" + _dump(regular(1002)) + "   \n[1, 2]\n" + _dump(unknown) + _dump(newer(1003)))
    return run_dir
