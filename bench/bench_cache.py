"""(21) What the model-call cache (--cache, agentbatch/model/cache.py) costs: a miss and a hit against an uncached
call, all measured in one run, and a second cached run of the CLI against the first.

Per call: the real HTTP client (model/client.py) against the scripted server in its own process at zero latency
(the uncached call, the cost a hit saves besides the endpoint's own time), the same behind the cache on calls it
has not seen (a miss: the key, a lookup, the call, a store) and on calls it has (a hit: the key, a lookup, the
reply decoded), taking turns in rounds; for a one-message request and for a 40-turn conversation of ~60 KB with
the 20 built-in tools' schemas (the key hashes the whole request). Then hits from 32 threads of one process at
once against one thread (the store is one SQLite connection per process, behind a lock). Last, the CLI: 200
prompts × 3 calls at 0.2 s a call, concurrency 32, without the cache, then twice with it (all misses, then all
hits: no request reaches the server).

    python bench/bench_cache.py            # or: python bench/run_bench.py --only 21
"""

from __future__ import annotations

import statistics
import tempfile
import threading
import time

from common import OUT, Server, check_all_done, report, run_cli, write_dataset

from agentbatch import plugins
from agentbatch.model import cache
from agentbatch.model.cache import CacheSettings
from agentbatch.model.client import ModelClient, ModelSettings
from agentbatch.tools.registry import load_tools

ROUNDS, PER_ROUND = 10, 50


def _conversation(turns: int) -> list[dict]:
    messages: list[dict] = [{"role": "user", "content": "Benchmark task: summarise the logs in /var/log. " * 4}]
    for i in range(turns):
        call = {
            "id": f"call_{i}",
            "type": "function",
            "function": {"name": "terminal", "arguments": '{"command": "ls"}'},
        }
        messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
        messages.append({"role": "tool", "tool_call_id": f"call_{i}", "name": "terminal", "content": "x" * 1400})
    return messages


def _per_call(fn, n: int) -> float:
    start = time.perf_counter()
    for i in range(n):
        fn(i)
    return (time.perf_counter() - start) / n


def bench_cache(results: dict) -> None:
    plugins.load()
    schemas = [t.schema() for t in load_tools().values()][:20]
    with Server(latency=0.0) as srv, tempfile.TemporaryDirectory(dir=OUT) as tmp:
        settings = ModelSettings("bench-model", srv.base_url, "sk-bench-not-a-real-key", max_retries=0)
        plain = ModelClient(settings)
        cached_settings = ModelSettings(
            "bench-model", srv.base_url, "sk-bench-not-a-real-key", max_retries=0, cache=CacheSettings(tmp)
        )
        behind = cache.cached(ModelClient(cached_settings), cached_settings)
        for name, messages, tools in (("short", _conversation(0), None), ("long", _conversation(20), schemas)):
            med = _per_request(plain, behind, messages, tools)
            results[f"cache_{name}"] = med
            size = len(str(messages)) // 1024
            report(
                results,
                f"cache_{name}",
                f"(21) {name} request (~{size} KB{', 20 tools' if tools else ''}): uncached {med['uncached']:.3f} ms, "
                f"miss {med['miss']:.3f} ms (+{med['miss'] - med['uncached']:.3f} ms, "
                f"{med['miss'] / med['uncached']:.2f}x), hit {med['hit']:.3f} ms ({med['hit'] / med['uncached']:.2f}x "
                f"the uncached call at zero latency), medians of {ROUNDS} rounds of {PER_ROUND}",
            )
        _threads(results, behind, _conversation(20), schemas)
    _cli(results)


def _per_request(plain, behind, messages: list[dict], tools: list[dict] | None) -> dict[str, float]:
    """Milliseconds a call, median of the rounds: uncached, a miss (a sample index no call had), a hit."""
    times: dict[str, list[float]] = {"uncached": [], "miss": [], "hit": []}
    seen = 0
    plain.chat(messages, tools)  # the connection made before any timing
    for _ in range(ROUNDS):
        times["uncached"].append(_per_call(lambda _i: plain.chat(messages, tools), PER_ROUND))
        times["miss"].append(
            _per_call(lambda i, s=seen: behind.for_sample(s + i, None).chat(messages, tools), PER_ROUND)
        )
        seen += PER_ROUND
        times["hit"].append(
            _per_call(lambda i, s=seen: behind.for_sample(i % s, None).chat(messages, tools), PER_ROUND)
        )
    return {k: statistics.median(v) * 1000 for k, v in times.items()}


def _threads(results: dict, behind, messages: list[dict], tools: list[dict]) -> None:
    """Hits per second from one thread and from 32 at once (the long request, its entries stored above)."""
    rates = {}

    def work(offset: int, n: int) -> None:
        for i in range(n):
            behind.for_sample((offset + i) % 500, None).chat(messages, tools)

    for threads in (1, 32):
        n = 2000 // threads
        pool = [threading.Thread(target=work, args=(k * 7, n)) for k in range(threads)]
        start = time.perf_counter()
        for t in pool:
            t.start()
        for t in pool:
            t.join()
        rates[threads] = n * threads / (time.perf_counter() - start)
    results["cache_threads"] = rates
    report(
        results,
        "cache_threads",
        f"(21) hits of the long request: {rates[1]:.0f}/s from one thread, {rates[32]:.0f}/s from 32 at once",
    )


def _cli(results: dict) -> None:
    n, latency = 200, 0.2
    dataset = write_dataset(n)
    with Server(latency=latency) as srv, tempfile.TemporaryDirectory(dir=OUT) as tmp:
        common = ("--concurrency=32", "--require_reasoning=false")
        runs = {"uncached": run_cli("cache_none", dataset, srv.base_url, *common)}
        for name in ("misses", "hits"):
            before = len(srv.get("/_requests"))
            runs[name] = run_cli(f"cache_{name}", dataset, srv.base_url, *common, "--cache", f"--cache_dir={tmp}")
            runs[name]["requests"] = len(srv.get("/_requests")) - before
        for name, r in runs.items():
            check_all_done(name, r, n)
    w = {k: r["wall"] for k, r in runs.items()}
    results["cache_cli"] = {
        k: {"wall": r["wall"], "cpu": r["cpu"], "requests": r.get("requests")} for k, r in runs.items()
    }
    report(
        results,
        "cache_cli",
        f"(21) CLI, {n} prompts × 3 calls at {latency} s, concurrency 32: uncached {w['uncached']:.2f} s, first "
        f"cached run {w['misses']:.2f} s ({w['misses'] / w['uncached']:.3f}x, {runs['misses']['requests']} requests), "
        f"second {w['hits']:.2f} s ({w['hits'] / w['uncached']:.3f}x, {runs['hits']['requests']} requests); CPU "
        f"{runs['uncached']['cpu']:.1f} / {runs['misses']['cpu']:.1f} / {runs['hits']['cpu']:.1f} s",
    )


if __name__ == "__main__":
    bench_cache({})
