"""A run that ends says so in checkpoint.json only once every line of its batch files is on disk.

The checkpoint is what --resume trusts after a power loss: a batch file's last lines still in the page
cache when it says "finished" would be lost, and their prompts paid for again. The real CLI runs with
os.fsync wrapped to note which file was synced at what size, in order.
"""

from __future__ import annotations

import json

from cli_helpers import RunDir, run_cli_wrapped, thinking, write_dataset
from scripted_server import ScriptedServer

NOTING_FSYNC = """
import os
real = os.fsync
def fsync(fd):
    real(fd)
    with open({log!r}, "a") as log:
        log.write(f"{{os.readlink(f'/proc/self/fd/{{fd}}')}}\\t{{os.fstat(fd).st_size}}\\n")
os.fsync = fsync
"""


def test_every_batch_line_is_synced_before_the_checkpoint_says_finished(tmp_path):
    log = tmp_path / "fsyncs.tsv"
    dataset = write_dataset(tmp_path / "d.jsonl", [f"task {i}" for i in range(12)])
    args = [f"--dataset_file={dataset}", "--run_name=r", f"--output_dir={tmp_path}", "--batch_size=5"]
    with ScriptedServer(default_script=[thinking("done")]) as srv:
        done = run_cli_wrapped(NOTING_FSYNC.format(log=str(log)), args, tmp_path, srv)
    assert done.returncode == 0, done.stderr
    run = RunDir(tmp_path / "r")
    assert json.loads((run.path / "checkpoint.json").read_text())["state"] == "finished"
    synced = [line.split("\t") for line in log.read_text().splitlines()]
    last_checkpoint = max(i for i, (path, _) in enumerate(synced) if path.endswith("/checkpoint.json.tmp"))
    batches = sorted(run.path.glob("batch_*.jsonl"))
    assert len(batches) == 3
    for batch in batches:
        at_full_size = [
            i for i, (path, size) in enumerate(synced) if path == str(batch) and int(size) == batch.stat().st_size
        ]
        assert at_full_size and at_full_size[0] < last_checkpoint, (
            f"{batch.name} not synced whole before the checkpoint"
        )
