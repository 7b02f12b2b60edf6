"""Tool settings are read once at start, from flags and environment; a bad one stops the run before it starts."""

from __future__ import annotations

import dataclasses
import ipaddress
import re
import threading
import time
from pathlib import Path

import pytest
from cli_helpers import assert_clean_exit, run_cli, write_dataset

from agentbatch.errors import FatalError
from agentbatch.tools import registry
from agentbatch.tools import settings as tool_settings
from agentbatch.tools.settings import ENVIRONMENT, from_environment

TOOLS_DIR = Path(__file__).resolve().parents[1] / "agentbatch" / "tools"


def test_no_tool_reads_the_environment_itself():
    # A tool reading os.environ would see nothing of the credentials (withdrawn at start) and would fail
    # late on a bad value: every setting goes through tools/settings.py.
    for path in TOOLS_DIR.glob("*.py"):
        if path.name == "settings.py":
            continue
        text = path.read_text(encoding="utf-8")
        assert not re.search(r"os\.environ\.get|os\.getenv|getenv\(|environ\[", text), path.name


def test_environment_values_are_parsed_and_flags_win():
    s = from_environment(
        {
            "WEB_TIMEOUT": "7.5",
            "WEB_EXTRACT_MAX_URLS": "3",
            "IMAGE_MODEL": "from-env",
            "IMAGE_RESPONSE_FORMAT": "B64_JSON",
            "TAVILY_API_KEY": "tvly-1",
            "BATCH_RUNNER_ALLOW_PRIVATE_URLS": "10.0.0.0/8",
        },
        image_model="from-flag",
    )
    assert (s.web_timeout, s.web_extract_max_urls, s.image_model) == (7.5, 3, "from-flag")
    assert s.image_response_format == "b64_json"
    assert (s.search_backend, s.search_credential) == ("tavily", "tvly-1")
    assert s.private_networks == (ipaddress.ip_network("10.0.0.0/8"),)
    assert "tvly-1" not in repr(s) and s.secrets() == ("tvly-1",)
    assert from_environment({}, allow_private_urls=True).private_networks is None


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"WEB_TIMEOUT": "3O"}, "WEB_TIMEOUT must be a number above 0 and at most 604800, got '3O'"),
        ({"WEB_TIMEOUT": "nan"}, "WEB_TIMEOUT must be a number above 0 and at most 604800, got 'nan'"),
        ({"WEB_EXTRACT_MAX_BYTES": "-1"}, "WEB_EXTRACT_MAX_BYTES must be a number above 0"),
        ({"IMAGE_RESPONSE_FORMAT": "png"}, "IMAGE_RESPONSE_FORMAT must be one of url, b64_json"),
        ({"WEB_SEARCH_BACKEND": "tavly", "TAVILY_API_KEY": "k"}, "WEB_SEARCH_BACKEND='tavly' is not one of"),
        ({"BATCH_RUNNER_ALLOW_PRIVATE_URLS": "intranet"}, "is not a network"),
    ],
)
def test_a_bad_setting_is_a_fatal_error_naming_it(env, message):
    with pytest.raises(FatalError, match=re.escape(message)):
        from_environment(env)


def test_every_documented_variable_is_read_by_the_settings():
    page = (Path(__file__).resolve().parents[1] / "docs" / "toolsets.md").read_text(encoding="utf-8")
    for name in [*ENVIRONMENT, *tool_settings.READ_ELSEWHERE]:
        assert f"`{name}`" in page, f"{name} is read but not documented in docs/toolsets.md"


def test_a_bad_setting_stops_the_cli_before_anything_runs(tmp_path):
    dataset = write_dataset(tmp_path / "d.jsonl", ["hello"])
    done = run_cli(
        [f"--dataset_file={dataset}", "--batch_size=1", "--run_name=r", f"--output_dir={tmp_path}"],
        tmp_path,
        env={"WEB_TIMEOUT": "soon"},
    )
    assert_clean_exit(done, 2)
    assert done.stderr.strip() == "error: WEB_TIMEOUT must be a number above 0 and at most 604800, got 'soon'"
    assert not (tmp_path / "r").exists()


def test_the_tools_a_run_leaves_out_are_worked_out_once_when_many_sessions_start_together(monkeypatch):
    """Hundreds of sessions start at once and each asks which tools it may offer: one thread works it out
    (a check may look for a package on disk), the others wait for its answer instead of repeating it."""
    calls = []

    def slow_check(settings):
        calls.append(1)
        time.sleep(0.01)
        return None

    tools = {name: dataclasses.replace(t, unavailable=slow_check) for name, t in registry.load_tools().items()}
    monkeypatch.setattr(registry, "load_tools", lambda: dict(tools))
    settings = tool_settings.ToolSettings()
    start = threading.Barrier(32)
    offered = []

    def session() -> None:
        start.wait()
        offered.append([t.name for t in registry.offered_tools(["terminal", "file"], settings)])

    threads = [threading.Thread(target=session) for _ in range(32)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert len(offered) == 32 and all(names == offered[0] for names in offered) and "terminal" in offered[0]
    assert len(calls) == len(tools)  # each tool checked once, not once per session
