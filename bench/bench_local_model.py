"""(25) Weight repacking in the embedded model (--model=local): llama.cpp's extra buffer types on ÷ off.

llama.cpp can move a model's weights into "extra buffer types" at load (CPU_REPACK: rows interleaved for
AVX2/AVX-512/NEON kernels; AMX on Intel CPUs with AMX_INT8), if its build and the CPU have kernels for the
weights' type. `use_extra_bufts` in llama_model_params turns that on (llama.cpp's default) or off; the
server's `--no_repack` turns it off. Measured in one run, the two arms taking turns, each in a fresh process:

- tokens/s of prompt processing and of generation, with the server's own model settings (the context,
  batch and thread counts of llama-cpp-python's ModelSettings), timed around llama_decode, for the bundled
  SmolLM2 Q4_1 and a Q4_0 copy of it (a type CPU_REPACK has kernels for on AVX2);
- the README's first command, whole (packages installed), in a fresh copy of the checkout each time.

`--compare threads` compares the prompt (batch) threads instead: llama-cpp-python's default of every core
against 1.

    python bench/bench_local_model.py                 # both (~20 minutes on 2 quiet cores)
    python bench/bench_local_model.py --no-command    # the tokens/s only (~3 minutes)
    python bench/bench_local_model.py --compare threads

Each run starts once the 1-minute load is below --quiet_below (1.5), or after --quiet_wait seconds (600)
of waiting for it; the load at each start and end is printed. Each figure is the best run of its arm.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "bench" / "out"
sys.path.insert(0, str(ROOT))

PROMPT_TOKENS = 1024  # about what the first request of a sample carries (the tool list, ~1,100-1,700 tokens)
GENERATED_TOKENS = 128
FIRST_COMMAND = [
    "batch_runner.py",
    "--dataset_file=data/example_prompts.jsonl",
    "--batch_size=4",
    "--run_name=example",
    "--model=local",
    "--require_reasoning=false",
]


# The arms of each comparison: words for tests/local_model_site/sitecustomize.py, which the server (and a
# measuring child) gets on its PYTHONPATH in both arms, so both carry the same hook; it changes only what
# llama.cpp is given (use_extra_bufts off as the server's --no_repack sets it, or the prompt threads) and
# notes what llama.cpp was given, which the bench checks.
COMPARISONS = {
    "repack": (("repack on", ""), ("repack off", "no_repack")),
    "threads": (("prompt threads = cores", ""), ("prompt threads 1", "threads_batch=1")),
}
SITE = ROOT / "tests" / "local_model_site"
_BUFFER = re.compile(r"load_tensors:\s+(\S+) model buffer size =\s+([\d.]+) MiB")


def wait_quiet(below: float, most: float) -> float:
    """Waits (at most `most` seconds) for the 1-minute load to fall below `below`: the machine is shared."""
    deadline = time.monotonic() + most
    while os.getloadavg()[0] >= below and time.monotonic() < deadline:
        time.sleep(5)
    return os.getloadavg()[0]


def _site_env(words: str, note: Path) -> dict:
    env = dict(os.environ, BR_LLAMA_SITE=f"{words} note={note}")
    env["PYTHONPATH"] = os.pathsep.join(filter(None, (str(SITE), env.get("PYTHONPATH"))))
    return env


def _noted(note: Path) -> dict:
    """What llama.cpp was given in the last model load and context of a run: use_extra_bufts and thread counts."""
    given: dict = {}
    for line in note.read_text().splitlines() if note.exists() else []:
        given.update({k: v for k, v in json.loads(line).items() if k != "pid"})
    return given


def measure_tokens(model: str) -> dict:
    """In this process: one prompt of PROMPT_TOKENS, then GENERATED_TOKENS tokens one decode each."""
    import llama_cpp
    from llama_cpp.server.settings import ModelSettings

    from agentbatch.model import local_server

    settings = ModelSettings(model=model, n_ctx=local_server.N_CTX)  # the server's: its context, batch, threads
    started = time.perf_counter()
    llm = llama_cpp.Llama(
        model_path=model,
        n_ctx=settings.n_ctx,
        n_batch=settings.n_batch,
        n_ubatch=settings.n_ubatch,
        n_threads=settings.n_threads,
        n_threads_batch=settings.n_threads_batch,
        verbose=True,  # the buffer types chosen at load, read by the parent from stderr
    )
    loaded = time.perf_counter() - started
    text = "Name a file in /etc and say what it holds. " * 200
    tokens = llm.tokenize(text.encode())[:PROMPT_TOKENS]
    started = time.perf_counter()
    llm.eval(tokens)  # in batches of n_batch, as the server evaluates a prompt
    llama_cpp.llama_synchronize(llm.ctx)
    prompt_s = time.perf_counter() - started
    started = time.perf_counter()
    for i in range(GENERATED_TOKENS):  # one token a decode, as generation runs; which token does not change the time
        llm.eval([tokens[i]])
    llama_cpp.llama_synchronize(llm.ctx)
    generation_s = time.perf_counter() - started
    return {"load_s": loaded, "prompt_tps": len(tokens) / prompt_s, "generation_tps": GENERATED_TOKENS / generation_s}


def _child(model: str, words: str, quiet: tuple[float, float]) -> dict:
    load = wait_quiet(*quiet)
    with tempfile.TemporaryDirectory(prefix="bench-local-") as tmp:
        note = Path(tmp) / "note.jsonl"
        proc = subprocess.run(
            [sys.executable, __file__, "--child", model],
            env=_site_env(words, note),
            capture_output=True,
            text=True,
            timeout=600,
        )
        if proc.returncode != 0:
            raise RuntimeError(f"measurement of {model} ({words}) exited {proc.returncode}: {proc.stderr[-2000:]}")
        result = json.loads(proc.stdout.strip().splitlines()[-1])
        result["given"] = _noted(note)
    result["buffers"] = {name: float(mib) for name, mib in _BUFFER.findall(proc.stderr)}
    result["load"] = (load, os.getloadavg()[0])
    return result


def quantize(model: str, target: str) -> None:
    """In this process: `model` requantized to Q4_0 (its quality is beside the point: its kernels are timed)."""
    import llama_cpp

    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = llama_cpp.LLAMA_FTYPE_MOSTLY_Q4_0
    params.allow_requantize = True
    if llama_cpp.llama_model_quantize(model.encode(), target.encode(), params) != 0:
        raise RuntimeError("llama_model_quantize failed")


def q4_0_copy(model: str) -> str:
    OUT.mkdir(parents=True, exist_ok=True)
    target = OUT / "SmolLM2-135M-Instruct.Q4_0.gguf"
    if not target.exists():
        cmd = [sys.executable, __file__, "--quantize", model, str(target)]
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=600)
    return str(target)


def _turns(rounds: int, arms: tuple) -> list:
    """Each arm once a round, the order swapped every round, so a change of the machine's load falls on both."""
    return [arm for i in range(rounds) for arm in (arms if i % 2 == 0 else arms[::-1])]


def bench_tokens(comparison: str, rounds: int, quiet: tuple[float, float]) -> list[str]:
    from agentbatch.model import local_server

    arms = COMPARISONS[comparison]
    bundled = local_server.default_model_path()
    models = [("SmolLM2 Q4_1 (bundled)", bundled)]
    if comparison == "repack":
        models.append(("SmolLM2 Q4_0 (requantized)", q4_0_copy(bundled)))
    lines = []
    for name, model in models:
        runs = {arm: [] for arm in arms}
        for arm in _turns(rounds, arms):
            runs[arm].append(_child(model, arm[1], quiet))
        a, b = runs[arms[0]], runs[arms[1]]
        # The best run of each arm: on a shared machine a run is only ever slowed by the others' load.
        pp = [max(r["prompt_tps"] for r in arm) for arm in (a, b)]
        tg = [max(r["generation_tps"] for r in arm) for arm in (a, b)]
        loads = [x for arm in (a, b) for r in arm for x in r["load"]]
        lines.append(
            f"{name}: prompt processing {pp[0]:.0f} ÷ {pp[1]:.0f} tokens/s = {pp[0] / pp[1]:.3f}, "
            f"generation {tg[0]:.1f} ÷ {tg[1]:.1f} tokens/s = {tg[0] / tg[1]:.3f} ({arms[0][0]} ÷ {arms[1][0]}, "
            f"best of {rounds}; every run, prompt/generation tokens/s: {_all(a)} against {_all(b)}; "
            f"{PROMPT_TOKENS} prompt tokens, {GENERATED_TOKENS} generated; llama.cpp given {a[0]['given']} "
            f"against {b[0]['given']}; buffers {a[0]['buffers']} against {b[0]['buffers']}; load average "
            f"{min(loads):.1f}-{max(loads):.1f})"
        )
        print(lines[-1], flush=True)
    return lines


def _all(runs: list[dict]) -> str:
    return ", ".join(f"{r['prompt_tps']:.0f}/{r['generation_tps']:.1f}" for r in runs)


def _copy_checkout(dest: Path) -> Path:
    def ignore(folder: str, names: list[str]) -> set[str]:
        skipped = {n for n in names if n in (".git", "__pycache__", ".pytest_cache", ".ruff_cache", "out", "npm")}
        if Path(folder).resolve() == ROOT / "data":
            skipped |= {n for n in names if (Path(folder) / n).is_dir()}
        return skipped

    shutil.copytree(ROOT, dest, ignore=ignore)
    return dest


def run_first_command(words: str, quiet: tuple[float, float]) -> dict:
    """The README's first command in a fresh copy of the checkout: wall seconds, the load around it, its summary."""
    with tempfile.TemporaryDirectory(prefix="bench-local-") as tmp:
        repo = _copy_checkout(Path(tmp) / "repo")
        note = Path(tmp) / "note.jsonl"
        load_before = wait_quiet(*quiet)
        started = time.monotonic()
        proc = subprocess.run(
            [sys.executable, *FIRST_COMMAND],
            cwd=repo,
            env=_site_env(words, note),
            capture_output=True,
            text=True,
            timeout=3600,
        )
        seconds = time.monotonic() - started
        if proc.returncode not in (0, 3):
            raise RuntimeError(f"the first command exited {proc.returncode}: {proc.stderr[-2000:]}")
        stats = json.loads((repo / "data" / "example" / "statistics.json").read_text())
        given = _noted(note)
    return {
        "seconds": seconds,
        "load": (load_before, os.getloadavg()[0]),
        "done": stats["samples"]["done"],
        "tokens": stats["tokens"]["total"],
        "given": given,
        "warnings": [ln for ln in proc.stderr.splitlines() if ln.startswith("warning: the local model")],
    }


def bench_command(comparison: str, rounds: int, quiet: tuple[float, float]) -> list[str]:
    arms = COMPARISONS[comparison]
    runs = {arm: [] for arm in arms}
    for arm in _turns(rounds, arms):
        r = run_first_command(arm[1], quiet)
        runs[arm].append(r)
        print(
            f"  first command, {arm[0]}: {r['seconds']:.0f} s, done {r['done']}, load {r['load'][0]:.1f} -> "
            f"{r['load'][1]:.1f}, tokens {r['tokens']}, llama.cpp given {r['given']}, warnings {r['warnings']}",
            flush=True,
        )
    a, b = (min(r["seconds"] for r in runs[arm]) for arm in arms)
    loads = [x for arm in runs.values() for r in arm for x in r["load"]]
    line = (
        f"the first command: {a:.0f} ÷ {b:.0f} s = {a / b:.3f} ({arms[0][0]} ÷ {arms[1][0]}, best of {rounds}; "
        f"every run {[round(r['seconds']) for r in runs[arms[0]]]} against "
        f"{[round(r['seconds']) for r in runs[arms[1]]]}; load average {min(loads):.1f}-{max(loads):.1f})"
    )
    print(line, flush=True)
    return [line]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--compare", choices=sorted(COMPARISONS), default="repack", help="what the two arms differ in")
    parser.add_argument("--rounds", type=int, default=3, help="runs of each arm for the tokens/s")
    parser.add_argument("--command_rounds", type=int, default=2, help="runs of each arm of the whole command")
    parser.add_argument("--no-command", dest="command", action="store_false", help="the tokens/s only")
    parser.add_argument("--quiet_below", type=float, default=1.5, help="start each run once the load is below this")
    parser.add_argument("--quiet_wait", type=float, default=600.0, help="... or once this many seconds have passed")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--quantize", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.quantize:
        quantize(*args.quantize)
        return 0
    if args.child:
        print(json.dumps(measure_tokens(args.child)))
        return 0
    import llama_cpp

    cpu = next((ln.split(":", 1)[1].strip() for ln in open("/proc/cpuinfo") if ln.startswith("model name")), "?")
    flags = next((ln.split(":", 1)[1].split() for ln in open("/proc/cpuinfo") if ln.startswith("flags")), [])
    print(
        f"CPU: {cpu}, {os.cpu_count()} cores; avx512f {'avx512f' in flags}, amx_int8 {'amx_int8' in flags}; "
        f"llama-cpp-python {llama_cpp.__version__}: {llama_cpp.llama_print_system_info().decode().strip()}",
        flush=True,
    )
    quiet = (args.quiet_below, args.quiet_wait)
    lines = bench_tokens(args.compare, args.rounds, quiet)
    if args.command:
        lines += bench_command(args.compare, args.command_rounds, quiet)
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / f"local_model_{args.compare}.json").write_text(json.dumps(lines, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
