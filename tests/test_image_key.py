"""The run's API key goes only to the run's endpoint: an images endpoint elsewhere gets IMAGE_API_KEY or none.

Two scripted endpoints on 127.0.0.1 record the Authorization header of every request they receive; the
real CLI generates an image through --image_base_url (issue 26, item 9).
"""

from __future__ import annotations

import threading

import pytest
from cli_helpers import RunDir, run_cli, thinking, write_dataset
from scripted_handler import Handler
from scripted_server import ScriptedServer

from agentbatch.tools.settings import ToolSettings

MAIN_KEY = "main-key-1234"
IMAGE_KEY = "image-key-5678"
DRAW = [
    {"tool_calls": [{"name": "image_generate", "arguments": {"prompt": "a lighthouse"}}], "reasoning": "draw it"},
    thinking("drawn"),
]


class _Recording(Handler):
    def _route(self, method, path, raw):
        owner = self.server.owner
        with owner.headers_lock:
            owner.authorizations.append((path, self.headers.get("Authorization")))
        return super()._route(method, path, raw)


class KeyedServer(ScriptedServer):
    """A ScriptedServer that keeps (path, Authorization header) of every request."""

    def __init__(self, **kwargs):
        self.authorizations: list[tuple[str, str | None]] = []
        self.headers_lock = threading.Lock()
        super().__init__(**kwargs)
        self._httpd.RequestHandlerClass = _Recording

    def keys(self, path_part: str) -> set[str | None]:
        with self.headers_lock:
            return {key for path, key in self.authorizations if path_part in path}


def _run(tmp_path, main: KeyedServer, image_base_url: str, env: dict | None = None):
    data = write_dataset(tmp_path / "d.jsonl", ["draw a lighthouse"])
    args = [
        f"--dataset_file={data}",
        "--batch_size=1",
        "--run_name=img",
        f"--output_dir={tmp_path / 'out'}",
        f"--base_url={main.base_url}",
        f"--api_key={MAIN_KEY}",
        "--model=m",
        "--distribution=default",
        "--image_model=img",
        f"--image_base_url={image_base_url}",
    ]
    proc = run_cli(args, tmp_path, env=env)
    assert proc.returncode == 0, proc.stderr
    assert len(RunDir(tmp_path / "out" / "img").trajectories()) == 1
    return proc


@pytest.mark.parametrize("paired", [False, True])
def test_an_images_endpoint_elsewhere_never_gets_the_runs_key(tmp_path, paired):
    env = {"IMAGE_API_KEY": IMAGE_KEY} if paired else None
    with KeyedServer(script={"draw a lighthouse": DRAW}) as main, KeyedServer() as images:
        _run(tmp_path, main, images.base_url, env)
        assert len(images.image_requests()) == 1
        assert main.keys("/chat/completions") == {f"Bearer {MAIN_KEY}"}
        assert images.keys("/images/generations") == ({f"Bearer {IMAGE_KEY}"} if paired else {None})
        assert main.image_requests() == []


def test_the_runs_own_endpoint_gets_the_runs_key_for_images_too(tmp_path):
    with KeyedServer(script={"draw a lighthouse": DRAW}) as main:
        _run(tmp_path, main, main.base_url)
        assert main.keys("/images/generations") == {f"Bearer {MAIN_KEY}"}


@pytest.mark.parametrize(
    "image_base_url, image_key, expected",
    [
        (None, "", None),  # the run's endpoint: its own client
        ("https://api.example.com/v1", "", None),
        ("https://api.example.com/v2", "", ("https://api.example.com/v2", "k")),  # the same origin, another path
        ("https://api.example.com:443/v2", "", ("https://api.example.com:443/v2", "k")),
        ("http://api.example.com/v1", "", ("http://api.example.com/v1", "")),  # not over plain http
        ("https://api.example.com:8443/v1", "", ("https://api.example.com:8443/v1", "")),
        ("https://images.example.com/v1", "", ("https://images.example.com/v1", "")),
        ("https://images.example.com/v1", "ik", ("https://images.example.com/v1", "ik")),
        (None, "ik", ("https://api.example.com/v1", "ik")),
    ],
)
def test_which_key_goes_to_the_images_endpoint(image_base_url, image_key, expected):
    settings = ToolSettings(image_base_url=image_base_url, image_api_key=image_key)
    assert settings.image_endpoint("https://api.example.com/v1", "k") == expected
