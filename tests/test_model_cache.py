"""The model-call cache (--cache, docs/replay.md) through the real CLI against the scripted endpoint: a second run
sends nothing and writes the same conversations; the samples of a prompt stay apart; another model, endpoint or
message misses; a corrupt entry or store is a miss, never a crash or a wrong reply; limits replay as paid;
`batch-runner cache --stats/--clear`; no key reaches the store."""

from __future__ import annotations

import importlib.util
import sqlite3
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from cli_helpers import ROOT, RUNNER, RunDir, assert_clean_exit, cli_env, run_cli, write_dataset
from helpers import SequencedServer
from scripted_server import ScriptedServer
from verify_helpers import answer, args_for, sh

from agentbatch.model.cache_store import FILE

KEY = "sk-cache-test-0123456789"
SCRIPT = {
    "count": [sh("printf 'a\\nb\\nc\\n' > f.txt && wc -l < f.txt"), answer("There are 3 lines.")],
    "two steps": [sh("echo one"), sh("echo two"), answer("done: one, two")],
    "plain": [answer("just text")],
}
ROWS = [{"prompt": "count", "answer": "3"}, {"prompt": "two steps", "verify": "true"}, {"prompt": "plain"}]


def cached_args(data, tmp: Path, run: str, *extra: str) -> list[str]:
    return args_for(data, tmp / "out", run, "--cache", f"--cache_dir={tmp / 'cache'}", *extra)


def run(args: list[str], tmp: Path, server, key: str = KEY) -> subprocess.CompletedProcess:
    done = run_cli([*args, f"--base_url={server.base_url}", f"--api_key={key}"], tmp)
    assert_clean_exit(done)
    return done


def by_sample(records: list[dict]) -> dict[tuple[int, int], dict]:
    return {(r["prompt_index"], r["sample_index"]): r for r in records}


def store(tmp: Path) -> sqlite3.Connection:
    return sqlite3.connect(tmp / "cache" / FILE)


def test_a_second_cached_run_sends_nothing_and_writes_the_same_conversations(tmp_path):
    data = write_dataset(tmp_path / "ds.jsonl", ROWS)
    with ScriptedServer(script=SCRIPT) as srv:
        run(cached_args(data, tmp_path, "first", "--samples_per_prompt=2"), tmp_path, srv)
        sent = len(srv.requests())
        done = run(cached_args(data, tmp_path, "second", "--samples_per_prompt=2", "--export=parquet"), tmp_path, srv)
        assert len(srv.requests()) == sent  # not one model call
    assert f"model calls answered by the cache: {sent} of {sent}" in done.stdout
    first = by_sample(RunDir(tmp_path / "out" / "first").trajectories())
    second = by_sample(RunDir(tmp_path / "out" / "second").trajectories())
    assert sent == 2 * (2 + 3 + 1) and sorted(first) == sorted(second) and len(first) == 6
    for key, line in second.items():
        assert line["conversations"] == first[key]["conversations"], key
        assert (line["reward"], line["passed"], line["stop_reason"]) == (
            first[key]["reward"],
            first[key]["passed"],
            first[key]["stop_reason"],
        )
        assert line["usage"] == {
            "prompt_tokens": 0,
            "completion_tokens": 0,
            "total_tokens": 0,
            "cost": 0.0,
            "cached_calls": line["api_calls"],
        }
        assert first[key]["usage"]["cached_calls"] == 0 and first[key]["usage"]["total_tokens"] > 0
    stats = RunDir(tmp_path / "out" / "second").stats()
    assert stats["tokens"]["total"]["total_tokens"] == 0 and stats["cached_calls"] == stats["api_calls"] == sent
    assert RunDir(tmp_path / "out" / "first").stats()["cached_calls"] == 0
    table = pq.read_table(tmp_path / "out" / "second" / "export" / "parquet" / "data")
    assert sorted(u["cached_calls"] for u in table.column("usage").to_pylist()) == sorted(
        line["api_calls"] for line in second.values()
    )
    # The reply of a line a check rejects is kept too: "plain" has no check, "count" answers 3.
    assert {first[k]["passed"] for k in first} == {True, None}
    assert store(tmp_path).execute("SELECT COUNT(*) FROM entries").fetchone()[0] == sent


def test_the_samples_of_a_prompt_stay_apart(tmp_path):
    """Four samples make four entries, and each replays what that very sample got (their replies differed)."""
    script = {"pick": [answer("first") | {"then": [answer("second"), answer("third"), answer("fourth")]}]}
    data = write_dataset(tmp_path / "ds.jsonl", ["pick"])
    with SequencedServer(script=script) as srv:
        run(cached_args(data, tmp_path, "a", "--samples_per_prompt=4"), tmp_path, srv)
        run(cached_args(data, tmp_path, "b", "--samples_per_prompt=4"), tmp_path, srv)
        assert len(srv.requests()) == 4
    got = {
        run_name: {
            r["sample_index"]: r["conversations"][-1]["value"]
            for r in RunDir(tmp_path / "out" / run_name).trajectories()
        }
        for run_name in ("a", "b")
    }
    assert sorted(got["a"].values()) == ["first", "fourth", "second", "third"]
    assert got["b"] == got["a"]
    assert store(tmp_path).execute("SELECT COUNT(*) FROM entries").fetchone()[0] == 4


def test_another_model_endpoint_seed_or_message_misses(tmp_path):
    data = write_dataset(tmp_path / "ds.jsonl", [{"prompt": "plain"}])
    with ScriptedServer(script=SCRIPT) as srv, ScriptedServer(script=SCRIPT) as other:
        run(cached_args(data, tmp_path, "base"), tmp_path, srv)
        assert len(srv.requests()) == 1
        run(cached_args(data, tmp_path, "again"), tmp_path, srv, key="another-key")  # the key is not in the key
        assert len(srv.requests()) == 1
        run(cached_args(data, tmp_path, "model", "--model=vendor/other-model"), tmp_path, srv)
        assert len(srv.requests()) == 2
        run(cached_args(data, tmp_path, "system", "--ephemeral_system_prompt=Be brief."), tmp_path, srv)
        assert len(srv.requests()) == 3
        run(cached_args(data, tmp_path, "seed", "--seed=7"), tmp_path, srv)
        assert len(srv.requests()) == 4
        run(cached_args(data, tmp_path, "tokens", "--max_tokens=64"), tmp_path, srv)  # a sampling setting
        assert len(srv.requests()) == 5
        run(cached_args(data, tmp_path, "endpoint"), tmp_path, other)
        assert len(other.requests()) == 1
        edited = write_dataset(tmp_path / "edited.jsonl", [{"prompt": "plain, edited"}])
        run(cached_args(edited, tmp_path, "prompt"), tmp_path, srv)
        assert len(srv.requests()) == 6
        run(cached_args(data, tmp_path, "base again"), tmp_path, srv)  # every entry is still there
        assert len(srv.requests()) == 6


def test_a_corrupt_entry_is_a_miss_and_a_corrupt_store_only_unused(tmp_path):
    data = write_dataset(tmp_path / "ds.jsonl", ROWS)
    with ScriptedServer(script=SCRIPT) as srv:
        run(cached_args(data, tmp_path, "first"), tmp_path, srv)
        sent = len(srv.requests())
        db = store(tmp_path)
        keys = [k for (k,) in db.execute("SELECT key FROM entries ORDER BY created")]
        # Damaged bytes, a valid value of another key, and a valid value of another shape.
        with db:
            db.execute("UPDATE entries SET value = X'789c0badbeef' WHERE key = ?", (keys[0],))
            other = db.execute("SELECT value FROM entries WHERE key = ?", (keys[2],)).fetchone()[0]
            db.execute("UPDATE entries SET value = ? WHERE key = ?", (other, keys[1]))
        db.close()
        run(cached_args(data, tmp_path, "second"), tmp_path, srv)
        assert len(srv.requests()) == sent + 2  # exactly the two damaged entries asked again
        first = by_sample(RunDir(tmp_path / "out" / "first").trajectories())
        second = by_sample(RunDir(tmp_path / "out" / "second").trajectories())
        assert {k: v["conversations"] for k, v in second.items()} == {k: v["conversations"] for k, v in first.items()}
        run(cached_args(data, tmp_path, "third"), tmp_path, srv)  # asked again, stored again: whole now
        assert len(srv.requests()) == sent + 2

        (tmp_path / "cache" / FILE).write_bytes(b"this is not a database, only a torn copy of one" * 100)
        for suffix in ("-wal", "-shm"):
            (tmp_path / "cache" / (FILE + suffix)).unlink(missing_ok=True)
        done = run(cached_args(data, tmp_path, "fourth"), tmp_path, srv)
        assert "cannot be used" in done.stderr and "cache --clear" in done.stderr
        assert len(srv.requests()) == 2 * sent + 2
        assert by_sample(RunDir(tmp_path / "out" / "fourth").trajectories()).keys() == first.keys()
        cleared = cache_command(tmp_path, "--clear")
        assert cleared.returncode == 0 and "not a model-call cache" in cleared.stdout
        run(cached_args(data, tmp_path, "fifth"), tmp_path, srv)
        run(cached_args(data, tmp_path, "sixth"), tmp_path, srv)
        assert len(srv.requests()) == 3 * sent + 2


def test_a_replay_stops_where_the_paid_run_stopped(tmp_path):
    """15 tokens a call: a limit of 20 stops "two steps" after its second call. The replay's calls cost nothing,
    yet it stops there too (its limit counts what the replies cost once), not one call later."""
    data = write_dataset(tmp_path / "ds.jsonl", [{"prompt": "two steps"}])
    with ScriptedServer(script=SCRIPT) as srv:
        run(cached_args(data, tmp_path, "paid", "--max_tokens_per_prompt=20"), tmp_path, srv)
        run(cached_args(data, tmp_path, "replay", "--max_tokens_per_prompt=20"), tmp_path, srv)
        assert len(srv.requests()) == 2
    paid, replay = (RunDir(tmp_path / "out" / n).trajectories()[0] for n in ("paid", "replay"))
    assert paid["stop_reason"] == replay["stop_reason"] == "tokens"
    assert replay["conversations"] == paid["conversations"] and replay["usage"]["cached_calls"] == 2


def test_a_cached_call_spends_none_of_the_runs_budget(tmp_path):
    """15 tokens a call: a budget of 20 tokens ends a paid run after its first prompt (exit 4); the same budget lets
    a cached run do every prompt, since its calls cost nothing."""
    data = write_dataset(tmp_path / "ds.jsonl", ROWS)
    with ScriptedServer(script=SCRIPT) as srv:
        run(cached_args(data, tmp_path, "fill"), tmp_path, srv)
        sent = len(srv.requests())
        paid = run_cli(
            [*args_for(data, tmp_path / "out", "paid", "--budget_tokens=20"), f"--base_url={srv.base_url}"], tmp_path
        )
        assert_clean_exit(paid, 4)
        assert len(RunDir(tmp_path / "out" / "paid").trajectories()) < len(ROWS)
        spent = len(srv.requests())
        run(cached_args(data, tmp_path, "replay", "--budget_tokens=20"), tmp_path, srv)
        assert len(srv.requests()) == spent  # nothing sent
    replay = RunDir(tmp_path / "out" / "replay")
    assert len(replay.trajectories()) == len(ROWS) and replay.stats()["cached_calls"] == sent


def test_expiry_and_stats_and_clear(tmp_path):
    data = write_dataset(tmp_path / "ds.jsonl", ROWS)
    with ScriptedServer(script=SCRIPT) as srv:
        run(cached_args(data, tmp_path, "first"), tmp_path, srv)
        sent = len(srv.requests())
        with store(tmp_path) as db:  # stored two days ago
            db.execute("UPDATE entries SET created = created - 2 * 86400")
        stats = cache_command(tmp_path, "--stats", "--cache_expiry=1D")
        assert stats.returncode == 0, stats.stderr
        assert f"{sent} replies" in stats.stdout and f"{sent} older than 1D" in stats.stdout
        assert "anthropic/claude-sonnet-4.6" in stats.stdout
        run(cached_args(data, tmp_path, "week", "--cache_expiry=1W"), tmp_path, srv)
        assert len(srv.requests()) == sent
        run(cached_args(data, tmp_path, "day", "--cache_expiry=1D"), tmp_path, srv)
        assert len(srv.requests()) == 2 * sent  # too old: asked again, and stored anew
        run(cached_args(data, tmp_path, "day again", "--cache_expiry=1D"), tmp_path, srv)
        assert len(srv.requests()) == 2 * sent
        cleared = cache_command(tmp_path, "--clear")
        assert cleared.returncode == 0 and f"removed {sent} replies" in cleared.stdout
        assert "0 replies" in cache_command(tmp_path, "--stats").stdout
        run(cached_args(data, tmp_path, "after clear"), tmp_path, srv)
        assert len(srv.requests()) == 3 * sent
    bad = cache_command(tmp_path, "--stats", "--cache_expiry=1d")
    assert bad.returncode == 2 and "--cache_expiry" in bad.stderr and "Traceback" not in bad.stderr
    neither = cache_command(tmp_path)
    assert neither.returncode == 2 and "--stats or --clear" in neither.stderr


def test_no_key_reaches_the_store(tmp_path):
    data = write_dataset(tmp_path / "ds.jsonl", ROWS)
    with ScriptedServer(script=SCRIPT) as srv:
        run(cached_args(data, tmp_path, "first"), tmp_path, srv)
    files = list((tmp_path / "cache").iterdir())
    assert files
    for path in files:
        assert KEY.encode() not in path.read_bytes(), path
    assert srv.base_url.encode() not in (tmp_path / "cache" / FILE).read_bytes()  # endpoints only hashed


def test_the_usual_command_line_is_unchanged_beside_the_subcommand(tmp_path):
    """`cache` as the first word is the subcommand; every other command line reaches the runner as before."""
    done = subprocess.run([sys.executable, RUNNER, "cache", "--help"], capture_output=True, text=True, env=cli_env())
    assert done.returncode == 0 and "--stats" in done.stdout
    data = write_dataset(tmp_path / "ds.jsonl", [{"prompt": "plain"}])
    with ScriptedServer(script=SCRIPT) as srv:
        run(args_for(data, tmp_path / "out", "plain"), tmp_path, srv)
    assert not (tmp_path / "cache").exists()


def cache_command(tmp: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, RUNNER, "cache", *args, f"--cache_dir={tmp / 'cache'}"],
        capture_output=True,
        text=True,
        env=cli_env(),
        cwd=str(ROOT),
        timeout=60,
    )


WRITER = """
import sys, time
sys.path.insert(0, {root!r})
from agentbatch.model import cache
from agentbatch.model.cache import CacheSettings
from agentbatch.model.client import ModelSettings
from agentbatch.model.scripted import ScriptedModel
from agentbatch.model.usage import Usage

me, n, start, directory = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3]), sys.argv[4]
inner = ScriptedModel([lambda messages: {{"content": "reply to " + messages[-1]["content"]}}])
settings = ModelSettings("m", "http://127.0.0.1:9/v1", "k", cache=CacheSettings(directory))
model = cache.cached(inner, settings)
time.sleep(max(0.0, start - time.time()))  # every process starts writing at the same moment
asked = [(writer, i) for i in range(n) for writer in ([me] if len(sys.argv) < 6 else range(int(sys.argv[5])))]
for writer, i in asked:
    usage = Usage()
    reply = cache.for_sample(model, 0, usage).chat([{{"role": "user", "content": f"{{writer}}-{{i}}"}}])
    assert reply["choices"][0]["message"]["content"] == f"reply to {{writer}}-{{i}}", reply
print(len(inner.calls))
"""


def test_sixteen_processes_write_one_cache_at_once(tmp_path):
    import time

    writers, n = 16, 150
    script = tmp_path / "writer.py"
    script.write_text(WRITER.format(root=str(ROOT)))
    directory = str(tmp_path / "cache")
    start = time.time() + 3
    procs = [
        subprocess.Popen(
            [sys.executable, str(script), str(me), str(n), str(start), directory],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for me in range(writers)
    ]
    for p in procs:
        out, err = p.communicate(timeout=300)
        assert p.returncode == 0 and out.strip() == str(n), err  # every call a miss, then stored
        assert "cannot be used" not in err and "busy" not in err, err
    db = store(tmp_path)
    assert db.execute("SELECT COUNT(*) FROM entries").fetchone()[0] == writers * n
    assert db.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    db.close()
    # One more process asks every call of every writer: all answered from the cache, each with its own reply.
    reader = subprocess.run(
        [sys.executable, str(script), "0", str(n), "0", directory, str(writers)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert reader.returncode == 0 and reader.stdout.strip() == "0", reader.stderr


def test_a_reply_quoting_the_key_is_never_stored(tmp_path):
    from agentbatch.model import cache
    from agentbatch.model.cache import CacheSettings
    from agentbatch.model.client import ModelSettings
    from agentbatch.model.scripted import ScriptedModel

    inner = ScriptedModel([lambda messages: {"content": f"your header said Bearer {KEY}"}, {"content": "fine"}])
    model = cache.cached(inner, ModelSettings("m", "http://127.0.0.1:9/v1", KEY, cache=CacheSettings(str(tmp_path))))
    ask = [{"role": "user", "content": "echo"}]
    assert KEY in model.chat(ask)["choices"][0]["message"]["content"]
    assert model.chat(ask)["choices"][0]["message"]["content"] == "fine"  # asked again: nothing was kept
    assert model.chat(ask)["choices"][0]["message"]["content"] == "fine" and len(inner.calls) == 2
    assert all(KEY.encode() not in p.read_bytes() for p in tmp_path.iterdir())


def test_the_embedded_models_endpoint_is_its_file_whatever_its_port(tmp_path):
    """--model=local serves on a new port every run: its entries are keyed by the GGUF file it serves."""
    from agentbatch.model import cache
    from agentbatch.model.client import ModelSettings
    from agentbatch.model.scripted import ScriptedModel

    gguf = tmp_path / "model.gguf"
    gguf.write_bytes(b"GGUF not really a model")
    ask = [{"role": "user", "content": "hi"}]
    inner = ScriptedModel([{"content": "hello"}])
    for port in (41001, 41002):
        url = f"http://127.0.0.1:{port}/v1"
        settings = cache.for_run(str(tmp_path / "cache"), None, 1 << 30, None, url, str(gguf))
        cache.cached(inner, ModelSettings("local", url, "x", cache=settings)).chat(ask)
    assert len(inner.calls) == 1  # the second run's port is another, its model file the same
    gguf.write_bytes(b"GGUF another model file")  # replaced: another endpoint
    settings = cache.for_run(str(tmp_path / "cache"), None, 1 << 30, None, "http://127.0.0.1:41003/v1", str(gguf))
    cache.cached(inner, ModelSettings("local", "http://127.0.0.1:41003/v1", "x", cache=settings)).chat(ask)
    assert len(inner.calls) == 2


def test_past_its_size_the_least_recently_used_replies_are_removed(tmp_path):
    """--cache_size bounds the store: a run that stores past it removes the oldest-used replies (an earlier run's),
    keeps its own, and the store's pages stay within the bound; an evicted reply is only a miss, asked again."""
    import secrets

    def rows(name: str) -> list[str]:
        return [f"{name} {i}" for i in range(10)]

    # ~100 KB of random text a reply, ~75 KB stored (zlib gains little): one run's ten fit in 1 MiB, two do not.
    script = {prompt: [answer(secrets.token_urlsafe(75_000))] for prompt in rows("old") + rows("new")}
    old = write_dataset(tmp_path / "old.jsonl", rows("old"))
    new = write_dataset(tmp_path / "new.jsonl", rows("new"))
    bound = ("--cache_size=1m",)
    with ScriptedServer(script=script) as srv:
        run(cached_args(old, tmp_path, "old", *bound), tmp_path, srv)
        assert store(tmp_path).execute("SELECT COUNT(*) FROM entries").fetchone()[0] == 10  # within the bound
        run(cached_args(new, tmp_path, "new", *bound), tmp_path, srv)
        assert len(srv.requests()) == 20
        with store(tmp_path) as db:
            kept = db.execute("SELECT COUNT(*) FROM entries").fetchone()[0]
            pages = db.execute("PRAGMA page_count").fetchone()[0] - db.execute("PRAGMA freelist_count").fetchone()[0]
            in_use = pages * db.execute("PRAGMA page_size").fetchone()[0]
        assert 10 <= kept < 20 and in_use <= 1024**2, (kept, in_use)
        run(cached_args(new, tmp_path, "new again", *bound), tmp_path, srv)
        assert len(srv.requests()) == 20  # the newest run's replies were all kept
        run(cached_args(old, tmp_path, "old again", *bound), tmp_path, srv)
        evicted = len(srv.requests()) - 20
        assert evicted >= 20 - kept and evicted > 0  # the earlier run's were removed first: asked again
    first = {r["prompt_index"]: r["conversations"] for r in RunDir(tmp_path / "out" / "old").trajectories()}
    again = {r["prompt_index"]: r["conversations"] for r in RunDir(tmp_path / "out" / "old again").trajectories()}
    assert again == first  # a hit or a miss, each the same reply


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("llama_cpp") is None, reason="llama-cpp-python is not installed")
def test_a_second_cached_run_of_the_embedded_model_asks_it_nothing(tmp_path):
    """--model=local --cache through the CLI: the embedded model is served on a new port each run, and its replies
    are found again by its file (runtime.model_cache), so the second run's calls all come from the cache."""
    data = write_dataset(tmp_path / "ds.jsonl", [{"prompt": "Say hello."}])
    flags = ("--model=local", "--max_turns=1", "--max_tokens=16", "--sandbox=local")
    for name in ("first", "second"):
        assert_clean_exit(run_cli(cached_args(data, tmp_path, name, *flags), tmp_path), 0)
    first, second = (RunDir(tmp_path / "out" / n).trajectories()[0] for n in ("first", "second"))
    assert first["usage"]["cached_calls"] == 0 and first["api_calls"] >= 1
    assert second["usage"]["cached_calls"] == second["api_calls"] == first["api_calls"]
    assert second["conversations"] == first["conversations"]
    assert store(tmp_path).execute("SELECT COUNT(*) FROM entries").fetchone()[0] == first["api_calls"]
