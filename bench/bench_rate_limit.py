"""(11) Adaptive concurrency against a rate-limited endpoint, through the real CLI.

400 one-call prompts, 0.2 s latency, a scripted server that accepts R = 50 requests a second (a token bucket of
one second's worth, OpenAI's x-ratelimit-* and Retry-After headers) and answers 429 beyond that,
--concurrency=256 and every other flag at its default, as a new user would run it. The baseline in the same
run is the same command with pacing off: every call sent as soon as its prompt's slot has it, as before.

Run as a script with --fixed-concurrency-cli it is the CLI with pacing off (the baseline's entry point), with
--paced-cli the CLI as it is, through the same entry point (so the two start alike: bench (18)).
"""

from __future__ import annotations

import dataclasses
import sys

from common import CALLS_PER_PROMPT, Server, check_all_done, report, run_cli, write_dataset

N, RATE, LATENCY, CONCURRENCY = 400, 50.0, 0.2, 256
SCRIPT = [{"reasoning": "Nothing to look up.", "content": "Answered: {prompt}"}]
FIXED_CLI = "--fixed-concurrency-cli"
PACED_CLI = "--paced-cli"


def _run(name: str, paced: bool, headers: bool = True) -> dict:
    extra = ("--rate_limit", str(RATE), *(() if headers else ("--no_rate_headers",)))
    with Server(latency=LATENCY, script=SCRIPT, extra=extra) as srv:
        entry = None if paced else [sys.executable, __file__, FIXED_CLI]
        r = run_cli(
            name,
            write_dataset(N),
            srv.base_url,
            f"--concurrency={CONCURRENCY}",
            entry=entry,
            retries=None,
            codes=(0, 3),
        )
        rate = srv.get("/_rate")
    sent = rate["accepted"] + rate["refused"]
    span = (rate["last_accepted"] - rate["first_accepted"]) if rate["accepted"] > 1 else float("nan")
    rate_failures = sum(1 for f in r["failed_lines"] if "429" in (f.get("error") or ""))
    # When the 429s came, in half seconds from the first accepted request: a burst at the start, or all along.
    first = rate["first_accepted"] or 0.0
    when: dict[float, int] = {}
    for t in rate["refused_at"]:
        when[round((t - first) * 2) / 2] = when.get(round((t - first) * 2) / 2, 0) + 1
    return dict(
        r,
        accepted=rate["accepted"],
        refused=rate["refused"],
        refused_share=rate["refused"] / sent if sent else 0.0,
        goodput=(rate["accepted"] - 1) / span if span == span and span > 0 else 0.0,
        span=span,
        rate_failures=rate_failures,
        refused_when=sorted(when.items()),
    )


def bench_rate_limit(results: dict, headers: bool = True) -> None:
    """(11) goodput, 429 share, failures and wall time: adaptive pacing against fixed concurrency."""
    ideal = N / RATE
    fixed = _run("rate_fixed", paced=False, headers=headers)
    paced = _run("rate_paced", paced=True, headers=headers)
    results["rate_limit" if headers else "rate_limit_no_headers"] = {"fixed": fixed, "paced": paced, "ideal": ideal}
    for label, r in (("fixed concurrency (before)", fixed), ("adaptive pacing", paced)):
        report(
            results,
            "rate_limit",
            f"(11{'' if headers else 'n'}) {label}, {N} one-call prompts, R = {RATE:g}/s{'' if headers else ' (Retry-After only)'}, "
            f"concurrency {CONCURRENCY}: {r['samples']['failed']} prompts failed ({r['rate_failures']} for 429); "
            f"{r['refused']} of {r['accepted'] + r['refused']} requests answered 429 ({r['refused_share']:.1%}); "
            f"goodput {r['goodput']:.1f}/s ({r['goodput'] / RATE:.1%} of R) over {r['span']:.1f} s of accepted requests; "
            f"wall {r['wall']:.1f} s = {r['wall'] / ideal:.3f} x ideal {ideal:.1f} s (run phase {r['run_seconds']:.1f} s)",
        )
    print(f"    429s by half second since the first accepted request: {paced['refused_when']}", flush=True)
    ok = (
        paced["goodput"] >= 0.9 * RATE
        and paced["refused_share"] <= 0.10
        and paced["rate_failures"] == 0
        and paced["wall"] <= 1.15 * ideal
    )
    report(
        results,
        "rate_limit",
        f"(11{'' if headers else 'n'}) targets (goodput >= 90% of R, 429 <= 10%, no rate failures, wall <= 1.15x): {'met' if ok else 'NOT met'}",
    )


def bench_probe_cost(results: dict, n: int = 2000, conc: int = 256) -> None:
    """(11p) what the probe costs an endpoint without limits: run (1b) of run_bench.py with pacing on and off."""
    runs = {}
    for label, entry in (("pacing off", [sys.executable, __file__, FIXED_CLI]), ("pacing on", None)):
        with Server(latency=1.0, jitter=0.2) as srv:
            r = run_cli(
                f"probe_{label[7:]}",
                write_dataset(n),
                srv.base_url,
                "--num_workers=2",
                f"--concurrency={conc}",
                entry=entry,
            )
        check_all_done(label, r, n)
        runs[label] = r
    ideal = n * CALLS_PER_PROMPT / conc
    results["probe_cost"] = dict(runs, ideal=ideal)
    off, on = runs["pacing off"], runs["pacing on"]
    report(
        results,
        "probe_cost",
        f"(11p) no rate limit, {n} prompts x {CALLS_PER_PROMPT} calls, concurrency {conc}: pacing off {off['wall']:.1f} s "
        f"({off['wall'] / ideal:.3f} x ideal), pacing on {on['wall']:.1f} s ({on['wall'] / ideal:.3f} x ideal): "
        f"the probe costs {on['wall'] - off['wall']:+.1f} s",
    )


def fixed_concurrency_cli(paced: bool = False) -> None:
    """The real CLI with pacing off in every worker (the setting travels to them inside the run config)."""
    from agentbatch import runtime
    from agentbatch.model.client import ModelSettings
    from batch_runner import cli

    @dataclasses.dataclass(frozen=True)
    class Unpaced(ModelSettings):
        pacing: bool = False

    if not paced:
        runtime.ModelSettings = Unpaced
    cli()


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] in (FIXED_CLI, PACED_CLI):
        paced = sys.argv.pop(1) == PACED_CLI
        fixed_concurrency_cli(paced)
