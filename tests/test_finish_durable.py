"""A run that ends says so in checkpoint.json only once every line of its batch files is on disk.

The checkpoint is what --resume trusts after a power loss: a batch file's last lines still in the page
cache when it says "finished" would be lost, and their prompts paid for again. The real CLI runs with
os.fsync wrapped to note which file was synced at what size, in order.
"""

from __future__ import annotations

import json
import subprocess

from cli_helpers import ROOT, RunDir, cli_command, cli_env, thinking, write_dataset
from scripted_server import ScriptedServer

NOTING_FSYNC = """
import os, sys
sys.path.insert(0, {root!r})
real = os.fsync
def fsync(fd):
    real(fd)
    with open({log!r}, "a") as log:
        log.write(f"{{os.readlink(f'/proc/self/fd/{{fd}}')}}\\t{{os.fstat(fd).st_size}}\\n")
os.fsync = fsync
from batch_runner import cli
cli()
"""


def test_every_batch_line_is_synced_before_the_checkpoint_says_finished(tmp_path):
    log = tmp_path / "fsyncs.tsv"
    wrapper = tmp_path / "noting_fsync.py"
    wrapper.write_text(NOTING_FSYNC.format(root=str(ROOT), log=str(log)))
    dataset = write_dataset(tmp_path / "d.jsonl", [f"task {i}" for i in range(12)])
    with ScriptedServer(default_script=[thinking("done")]) as srv:
        command = cli_command(
            [f"--dataset_file={dataset}", "--run_name=r", f"--output_dir={tmp_path}", "--batch_size=5"], srv
        )
        done = subprocess.run(
            [command[0], str(wrapper), *command[2:]], cwd=tmp_path, env=cli_env(), capture_output=True, text=True
        )
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
