"""(5) Heavy-tailed latencies: prompt-level scheduling against two batch-level baselines, through the real CLI.

Run as a script with --batch-level-cli it is the CLI with the batch-level executor in place of the
prompt-level one (the baselines' entry point).
"""

from __future__ import annotations

import os
import sys
import threading

from common import CALLS_PER_PROMPT, Server, check_all_done, report, run_cli, write_dataset


def bench_scheduling(results: dict, n: int = 2000, conc: int = 256, batch_size: int = 8) -> None:
    """(5) batch-level (a slot runs a whole batch in order) vs prompt-level scheduling, heavy-tailed latency."""
    dataset = write_dataset(n)
    args = ("--num_workers=2", f"--concurrency={conc}", f"--batch_size={batch_size}")
    with Server(latency=1.0, heavy_tail=True, seed=7) as srv:
        prompt_level = run_cli("sched_prompt", dataset, srv.base_url, *args)
    with Server(latency=1.0, heavy_tail=True, seed=7) as srv:
        batch_level = run_cli(
            "sched_batch", dataset, srv.base_url, *args, entry=[sys.executable, __file__, BATCH_LEVEL_CLI]
        )
    per_worker = conc // 2
    os.environ["BENCH_BATCH_MODE"] = "barrier"
    try:
        with Server(latency=1.0, heavy_tail=True, seed=7) as srv:
            barrier = run_cli(
                "sched_barrier",
                dataset,
                srv.base_url,
                "--num_workers=2",
                f"--concurrency={conc}",
                f"--batch_size={per_worker}",
                entry=[sys.executable, __file__, BATCH_LEVEL_CLI],
            )
    finally:
        del os.environ["BENCH_BATCH_MODE"]
    for name, r in (("prompt", prompt_level), ("batch", batch_level), ("barrier", barrier)):
        check_all_done(name, r, n)
    ideal = n * CALLS_PER_PROMPT / conc
    ratio = batch_level["wall"] / prompt_level["wall"]
    ratio_barrier = barrier["wall"] / prompt_level["wall"]
    results["scheduling"] = {"prompt": prompt_level, "batch": batch_level, "barrier": barrier, "ratio": ratio}
    report(
        results,
        "scheduling",
        f"(5) heavy-tailed latency, {n} prompts, concurrency {conc}: prompt-level {prompt_level['wall']:.1f} s "
        f"(ideal {ideal:.1f} s); batch-level, each of the {conc} slots running a batch of {batch_size} in order, "
        f"{batch_level['wall']:.1f} s = {ratio:.2f}x; batch-level, each of the 2 workers running a batch of "
        f"{per_worker} on its threads and waiting for its slowest prompt, {barrier['wall']:.1f} s = "
        f"{ratio_barrier:.2f}x",
    )


BATCH_LEVEL_CLI = "--batch-level-cli"


def _batch_slot_main(cfg, batches, results, threads: int, barrier: bool) -> None:
    import signal
    from concurrent.futures import ThreadPoolExecutor, as_completed

    from agentbatch.sample_runner import Clients, run_sample

    signal.signal(signal.SIGINT, signal.SIG_IGN)
    clients = Clients.for_config(cfg)
    if barrier:  # the worker runs its batch on all its threads and takes the next once the slowest is done
        with ThreadPoolExecutor(threads) as pool:
            while (batch := batches.get()) is not None:
                for done in as_completed([pool.submit(run_sample, task, cfg, clients) for task in batch]):
                    results.put(done.result())
        return

    def slot() -> None:
        while (batch := batches.get()) is not None:
            for task in batch:  # in order: the next prompt waits for the slowest so far
                results.put(run_sample(task, cfg, clients))

    pool = [threading.Thread(target=slot) for _ in range(threads)]
    for t in pool:
        t.start()
    for t in pool:
        t.join()


class BatchLevelExecutor:
    """The baselines of (5): a slot runs a whole batch in order, or (barrier) a worker runs one batch at a time."""

    def __init__(self, cfg, num_workers: int, threads_per_worker: int, barrier: bool):
        self.cfg, self.num_workers, self.threads, self.barrier = cfg, num_workers, threads_per_worker, barrier

    def close(self) -> None:
        pass

    def run(self, tasks, stop, admit=None):
        import multiprocessing as mp
        from itertools import groupby

        ctx = mp.get_context("spawn")
        batches, results = ctx.Queue(), ctx.Queue()
        total = 0
        for _, group in groupby(tasks, key=lambda t: t.batch_num):
            batch = list(group)
            total += len(batch)
            batches.put(batch)
        procs = [
            ctx.Process(
                target=_batch_slot_main, args=(self.cfg, batches, results, self.threads, self.barrier), daemon=True
            )
            for _ in range(self.num_workers)
        ]
        for p in procs:
            p.start()
        for _ in range(self.num_workers * (1 if self.barrier else self.threads)):
            batches.put(None)
        for _ in range(total):
            yield results.get()
        for p in procs:
            p.join()


def batch_level_cli() -> None:
    """The real CLI with the batch-level executor in place of the prompt-level one."""
    from agentbatch import runtime
    from batch_runner import cli

    runtime.make_executor = lambda cfg, plan, ray_address: BatchLevelExecutor(
        cfg, plan.processes, plan.threads, os.environ.get("BENCH_BATCH_MODE") == "barrier"
    )
    cli()


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == BATCH_LEVEL_CLI:
        del sys.argv[1]
        batch_level_cli()
