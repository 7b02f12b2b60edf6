"""The Python API (agentbatch.Rollouts) against the scripted endpoint: groups handed back as each task's samples
finish, a training loop stepping its policy label, a consumer that stops reading holding rollouts back, and a
run directory recorded as a CLI run's (and resumed after a kill)."""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
import textwrap
import time

import pytest
from cli_helpers import ROOT, RUN_TIMEOUT, RunDir, cli_env, thinking
from scripted_replies import IM_END, build_message, completion_ids
from scripted_server import ScriptedServer

from agentbatch import Rollouts
from agentbatch.errors import FatalError


def flags(srv, **more) -> dict:
    return {
        "model": "m",
        "base_url": srv.base_url,
        "api_key": "test-key",
        "sandbox": "local",
        "distribution": "terminal_only",
        "concurrency": 4,
        **more,
    }


def chat_prompts(srv) -> list[str]:
    return [r["messages"][-1]["content"] for r in srv.requests() if r["messages"][0]["role"] == "user"]


def test_a_group_comes_back_as_soon_as_its_samples_finish_not_at_the_end():
    script = {"slow": [thinking("s", latency=4.0)], "fast": [thinking("f")]}
    with ScriptedServer(script=script) as srv, Rollouts(**flags(srv), samples_per_prompt=2) as rollouts:
        seen = []
        for group in rollouts.run([{"prompt": "slow"}, {"prompt": "fast"}]):
            seen.append((group.index, group.task["prompt"]))
    # The slow task is listed first: handed back at the batch's end (or in task order), it would come first.
    assert seen == [(1, "fast"), (0, "slow")]


def test_a_training_loop_pulls_groups_computes_advantages_and_steps_its_policy(tmp_path):
    """Group-relative advantages from rewards that differ within a group (the check prints a random reward), the
    next step asked with a new policy label and another endpoint, every sample recording the label it ran under."""
    tasks = [{"prompt": f"task {i}", "verify": "shuf -i 0-9 -n 1"} for i in range(3)]
    with (
        ScriptedServer(default_script=[thinking("one")]) as first,
        ScriptedServer(default_script=[thinking("two")]) as second,
        Rollouts(**flags(first), samples_per_prompt=4, policy_version="step-0", seed=1, token_ids=True) as rollouts,
    ):
        steps = []
        for step, srv in enumerate((first, second)):
            if step:
                rollouts.update(base_url=srv.base_url, policy_version=f"step-{step}")
            advantages = {}
            for group in rollouts.run(tasks):
                rewards = [s.reward for s in group.samples]
                mean = sum(rewards) / len(rewards)
                advantages[group.index] = [r - mean for r in rewards]
                assert [s.sample for s in group.samples] == [0, 1, 2, 3]
                assert {s.policy_version for s in group.samples} == {f"step-{step}"}
                assert {s.record["policy_version"] for s in group.samples} == {f"step-{step}"}
                answers = {s.record["conversations"][-1]["value"].split("</think>")[-1].strip() for s in group.samples}
                assert answers == {("one", "two")[step]}
                sampled = completion_ids(build_message(thinking(("one", "two")[step]), 0)[0])
                for s in group.samples:  # what the trainer would train on: exactly what the endpoint sampled
                    assert [i for i, m in zip(s.tokens["ids"], s.tokens["mask"], strict=True) if m] == sampled
            steps.append(advantages)
        assert len(first.requests()) == len(second.requests()) == 12  # each step's samples at its own endpoint
    for advantages in steps:
        assert sorted(advantages) == [0, 1, 2]
        assert all(abs(sum(a)) < 1e-9 for a in advantages.values())
    # Some group's rewards differed (12 draws of 0-9 per step all equal within every group: ~1e-9).
    assert any(len(set(a)) > 1 for advantages in steps for a in advantages.values())


def test_a_training_loop_trains_on_exactly_the_tokens_the_endpoint_sampled():
    """With --token_ids, a two-call sample's mask-1 ids are exactly the ids the endpoint sent as sampled, call
    after call (the tool call's and the answer's, each with its end of turn), under the label in force."""
    tool = {"tool_calls": [{"name": "terminal", "arguments": {"command": "echo hi"}}], "reasoning": "r"}
    answer = thinking("x")
    with (
        ScriptedServer(script={"p": [tool, answer]}) as srv,
        Rollouts(**flags(srv), token_ids=True, logprobs=True, samples_per_prompt=2, policy_version="v1") as r,
    ):
        (group,) = list(r.run([{"prompt": "p"}]))
        r.update(policy_version="v2")
        (later,) = list(r.run([{"prompt": "p"}]))
    sampled = completion_ids(build_message(tool, 0)[0]) + completion_ids(build_message(answer, 1)[0])
    for s in group.samples + later.samples:
        t = s.tokens
        assert t["source"] == "endpoint" and not t["drift"]
        assert [i for i, m in zip(t["ids"], t["mask"], strict=True) if m] == sampled
        assert all(lp is not None for lp, m in zip(t["logprobs"], t["mask"], strict=True) if m)
    assert {c["policy_version"] for s in group.samples for c in s.tokens["calls"]} == {"v1"}
    assert {c["policy_version"] for s in later.samples for c in s.tokens["calls"]} == {"v2"}


def test_asyncio_callers_get_the_same_groups():
    async def pull(rollouts) -> list[int]:
        return [g.index async for g in rollouts.arun([{"prompt": f"q{i}"} for i in range(3)], samples_per_prompt=2)]

    with ScriptedServer(default_script=[thinking("a")]) as srv, Rollouts(**flags(srv)) as rollouts:
        indexes = asyncio.run(pull(rollouts))
    assert sorted(indexes) == [0, 1, 2]


def test_a_consumer_that_stops_reading_holds_the_rollouts_back():
    with (
        ScriptedServer(default_script=[thinking("a", latency=0.05)]) as srv,
        Rollouts(**flags(srv, concurrency=2)) as r,
    ):
        groups = r.run([{"prompt": f"q{i}"} for i in range(30)])
        next(groups)
        time.sleep(2.0)  # the consumer reads nothing more: at most its window of groups run meanwhile
        held = len(srv.requests())
        assert held <= 1 + 4  # the group read, and a window of max(2, 2 × 2 slots / 1 sample) groups
        assert len(list(groups)) == 29
        assert len(srv.requests()) == 30


def test_leaving_the_loop_early_cancels_what_was_not_read():
    with ScriptedServer(default_script=[thinking("a", latency=0.3)]) as srv, Rollouts(**flags(srv, concurrency=2)) as r:
        for _ in r.run([{"prompt": f"q{i}"} for i in range(20)]):
            break
        time.sleep(1.5)
        after_break = len(srv.requests())
        time.sleep(1.0)
        assert len(srv.requests()) == after_break < 20  # nothing more started once the caller left
        (group,) = list(r.run([{"prompt": "later"}]))  # and the workers still serve the next call
        assert group.samples[0].status == "done"


def test_a_bad_task_is_named_before_anything_runs():
    with ScriptedServer(default_script=[thinking("a")]) as srv, Rollouts(**flags(srv)) as rollouts:
        with pytest.raises(FatalError, match='task 1: no "prompt" field'):
            rollouts.run([{"prompt": "fine"}, {"question": "?"}])
        with pytest.raises(FatalError, match="only model, base_url, policy_version"):
            rollouts.run([{"prompt": "fine"}], api_key="other")
        assert srv.requests() == []


def test_with_a_run_name_every_sample_is_recorded_as_a_cli_run_records_it(tmp_path):
    out = tmp_path / "out"
    with ScriptedServer(default_script=[thinking("a")]) as srv:
        with Rollouts(**flags(srv), run_name="api", output_dir=str(out), samples_per_prompt=2) as rollouts:
            handed = [s.record for g in rollouts.run([{"prompt": "p0"}, {"prompt": "p1"}]) for s in g.samples]
            handed += [s.record for g in rollouts.run([{"prompt": "p0"}], policy_version="v2") for s in g.samples]
    run = RunDir(out / "api")
    lines = run.trajectories()
    assert len(lines) == 6 and sorted(json.dumps(r, sort_keys=True) for r in lines) == sorted(
        json.dumps(r, sort_keys=True) for r in handed
    )
    assert sorted(r.get("policy_version") or "" for r in lines) == ["", "", "", "", "v2", "v2"]
    # A consumer of the file reads the label where there is one, and null where there is none.
    import datasets

    loaded = datasets.load_dataset("json", data_files=str(out / "api" / "trajectories.jsonl"), split="train")
    assert sorted(v or "" for v in loaded["policy_version"]) == ["", "", "", "", "v2", "v2"]
    assert run.stats()["prompts"]["done"] >= 4
    assert json.loads((out / "api" / "checkpoint.json").read_text())["state"] == "finished"


def test_without_a_run_name_nothing_is_written(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with ScriptedServer(default_script=[thinking("a")]) as srv, Rollouts(**flags(srv)) as rollouts:
        (group,) = list(rollouts.run([{"prompt": "p"}]))
    assert group.samples[0].status == "done"
    assert list(tmp_path.iterdir()) == []


CALLER = textwrap.dedent(
    """
    import json, sys
    sys.path.insert(0, {root!r})
    from agentbatch import Rollouts

    def main():
        with Rollouts(**json.loads(sys.argv[1])) as rollouts:
            for g in rollouts.run([{{"prompt": f"task {{i}}"}} for i in range(6)]):
                print(json.dumps([g.index, [s.status for s in g.samples]]), flush=True)

    if __name__ == "__main__":
        main()
    """
)


def test_a_killed_api_run_directory_resumes_with_every_sample_recorded_once(tmp_path):
    caller = tmp_path / "caller.py"
    caller.write_text(CALLER.format(root=str(ROOT)), encoding="utf-8")
    out = tmp_path / "out"
    with ScriptedServer(default_script=[thinking("a", latency=0.4)]) as srv:
        values = flags(srv, run_name="api", output_dir=str(out), samples_per_prompt=2, concurrency=2)
        proc = subprocess.Popen(
            [sys.executable, str(caller), json.dumps(values)], cwd=tmp_path, env=cli_env(), stdout=subprocess.PIPE
        )
        got = [proc.stdout.readline(), proc.stdout.readline()]  # two groups handed back, others in flight
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
        assert all(got)
        time.sleep(1.0)  # its workers die with it (process_guard): a request one had under way lands first
        recorded = sum(p.read_bytes().count(b"\n") for p in (out / "api").glob("batch_*.jsonl"))
        before = len(srv.requests())
        done = subprocess.run(
            [sys.executable, str(caller), json.dumps({**values, "resume": True})],
            cwd=tmp_path,
            env=cli_env(),
            capture_output=True,
            text=True,
            timeout=RUN_TIMEOUT,
        )
        assert done.returncode == 0, done.stderr
        asked_again = len(srv.requests()) - before
    groups = [json.loads(line) for line in done.stdout.splitlines()]
    assert sorted(i for i, _ in groups) == list(range(6))
    assert all(statuses == ["done", "done"] for _, statuses in groups)
    lines = RunDir(out / "api").trajectories()
    keys = [(r["identity"], r["sample_index"]) for r in lines]
    assert len(keys) == len(set(keys)) == 12  # every sample once
    assert 4 <= recorded < 12
    assert asked_again == 12 - recorded  # only the samples the kill left unrecorded ran again


def test_leaving_does_not_wait_for_a_reply_that_never_comes_and_leaves_no_sandbox(tmp_path, monkeypatch):
    """A sample waiting on a reply of 120 s when the caller leaves: its worker is killed after the grace, and the
    sandbox it had made is removed (no run directory here: the Rollouts reap their own)."""
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    monkeypatch.setattr("tempfile.tempdir", None)
    tool = {"tool_calls": [{"name": "terminal", "arguments": {"command": "echo hi"}}], "reasoning": "r"}
    with ScriptedServer(default_script=[tool, thinking("late", latency=120.0)]) as srv:
        started = time.monotonic()
        with Rollouts(**flags(srv, concurrency=1)) as rollouts:
            groups = rollouts.run([{"prompt": "p"}])
            assert groups.next_within(3.0) is None  # it ran its command and waits on the slow reply
            assert [n for n in tmp_path.iterdir() if n.name.startswith("br-sandbox-")]
        assert time.monotonic() - started < 60  # not the 120 s of the reply
    assert [n.name for n in tmp_path.iterdir() if n.name.startswith("br-sandbox-")] == []


def test_the_budget_stops_rollouts_and_says_so():
    """--budget_tokens 30 with 15 tokens a sample: one sample is run, then the projection forbids another; the
    call gets its first group, then RolloutsError naming the budget, and nothing more is asked."""
    from agentbatch.rollouts import RolloutsError

    with ScriptedServer(default_script=[thinking("a")]) as srv, Rollouts(**flags(srv), budget_tokens=30) as r:
        groups = r.run([{"prompt": f"q{i}"} for i in range(5)])
        first = next(groups)
        with pytest.raises(RolloutsError, match=r"budget reached \(15 of 30 tokens\)"):
            next(groups)
        assert first.samples[0].status == "done" and len(srv.requests()) == 1


def test_the_trl_rollout_func_of_the_docs_gives_one_completion_per_prompt_in_order():
    """The adapter docs/rollouts.md shows, run as written on a TRL-shaped call: prompts repeated num_generations
    times in a row; each entry's prompt + completion ids are its sample's ids, env_mask its mask after the split."""
    import types

    from token_helpers import docs_rollout_func

    trainer = types.SimpleNamespace(num_generations=2, processing_class=types.SimpleNamespace(eos_token_id=IM_END))
    with (
        ScriptedServer(script={"a": [thinking("x")], "b": [thinking("yy")]}) as srv,
        Rollouts(**flags(srv), token_ids=True, logprobs=True) as rollouts,
    ):
        out = docs_rollout_func()(rollouts)(["a", "a", "b", "b"], trainer)
    assert {k: len(v) for k, v in out.items()} == dict.fromkeys(out, 4)
    a, b = (completion_ids(build_message(thinking(t), 0)[0]) for t in ("x", "yy"))
    assert out["completion_ids"] == [a, a, b, b]  # in the prompts' order, whatever order the groups finished in
    assert all(set(m) == {1} for m in out["env_mask"])  # one call each: every completion token was sampled
    assert all(len(lp) == len(c) for lp, c in zip(out["logprobs"], out["completion_ids"], strict=True))
    assert out["reward"] == [None] * 4  # no check: unscorable


def test_a_formats_entries_are_tasks_too():
    from agentbatch.dataset import Entry

    with ScriptedServer(default_script=[thinking("42")]) as srv, Rollouts(**flags(srv)) as rollouts:
        (group,) = list(rollouts.run([Entry(1, "the answer?", answers=("42",))]))
    assert group.samples[0].reward == 1.0 and group.task.prompt == "the answer?"
