"""One sample's headless Chromium, driven through Playwright from a thread of its own.

Threading: Playwright's sync API is bound to the thread that started it, while the batch runner may run
many samples on different threads of one process and call a sample's tools from whichever thread runs it.
So each `BrowserSession` owns one dedicated thread that starts Playwright, launches Chromium and runs every
browser operation handed to it through a queue; callers wait for the result with a deadline. No Playwright
object ever crosses threads, and no two samples share a Playwright driver, a browser or a process, so
closing or killing one sample's browser cannot touch another's.

Hangs and crashes: Playwright calls have timeouts of their own, but some have none (an `evaluate` on a page
stuck in a script loop), so the caller also waits with a deadline. Past it the session SIGKILLs its
Chromium, which makes the stuck call fail and frees the thread. The processes are found through /proc:
each launch gets a private config directory whose path appears in the command line of the browser and of
its crashpad handlers, and the browser's process group holds every renderer and helper. Before each
operation the thread checks the browser and relaunches it if it died; that result carries a note saying
the previous page was lost.

Network policy: Chromium sends every request through the session's `browser_proxy.PolicyProxy`, and WebRTC
and QUIC, which could send UDP around it, are held to it by the launch flags (browser_proxy.py says how).
"""

from __future__ import annotations

import concurrent.futures
import importlib.util
import logging
import os
import queue
import shutil
import signal
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from agentbatch.tools.browser_proxy import PolicyProxy
from agentbatch.tools.url_policy import Networks

log = logging.getLogger("batch_runner")
EXECUTABLE_ENV = "BROWSER_EXECUTABLE"
CHROMIUM_ARGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    # Without these Chromium keeps phoning home, which floods a closed network with refused connections.
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    # The preference behind Chrome's WebRtcIPHandling policy, set from the command line (Debian's build honours
    # this name; "--force-webrtc-ip-handling-policy" is ignored by it).
    "--webrtc-ip-handling-policy=disable_non_proxied_udp",
)
LAUNCH_TIMEOUT = 60.0
MAX_CONFIG_PATH = 50  # leaves room for Chromium's own temp dir and socket name under 107 bytes
HANG_GRACE = 10.0  # beyond an operation's own timeout before the browser is declared hung
DEADLINE_GRACE = 1.0  # beyond a caller's deadline: time for Playwright's own timeout error to come back first
VIEWPORT = {"width": 1280, "height": 900}
MARKER_FLAG = "--batch-runner-browser-session="


class BrowserError(Exception):
    """A browser operation failed in a way the model should be told about."""


def unavailable_reason(path: str) -> str | None:
    """Why the browser tools cannot run here with this Chromium, or None."""
    if not (os.path.isfile(path) and os.access(path, os.X_OK)):
        return f"no Chromium executable at {path} (install chromium or set {EXECUTABLE_ENV})"
    # Found, not imported: importing playwright.sync_api took ~0.3 s of every run's start.
    if importlib.util.find_spec("playwright") is None:
        return "the playwright Python package is not installed (pip install playwright)"
    return None


def short_error(e: BaseException) -> str:
    """The first line of an exception: Playwright appends long call logs and browser output."""
    text = str(e).strip().splitlines()
    return text[0] if text else type(e).__name__


def launch_error(e: BaseException) -> str:
    """The first line of a launch error plus Chromium's last words, which say why it did not start."""
    lines = [line.strip() for line in str(e).strip().splitlines() if line.strip()]
    if not lines:
        return type(e).__name__
    logs = [line for line in lines[1:] if not line.startswith(("=", "-", "Call log", "- <launching>"))]
    return "; ".join([lines[0], *logs[-3:]])[:600]


@dataclass
class _Task:
    fn: Callable[[Any], dict]
    timeout: float
    started: threading.Event = field(default_factory=threading.Event)
    future: concurrent.futures.Future = field(default_factory=concurrent.futures.Future)


class Live:
    """The browser state the session thread hands to operations (only ever touched on that thread)."""

    def __init__(self, session: BrowserSession):
        self.session = session
        self.timeout_ms = session.timeout * 1000
        self.browser: Any = None
        self.context: Any = None
        self.crashed: set[int] = set()
        self.ref_counter = 1  # refs are unique over the session, so a ref from an earlier page is never reused

    def set_timeout(self, seconds: float) -> None:
        """The Playwright timeout of the operations to come (each call brings its own, cut to its sample's time)."""
        ms = max(round(seconds * 1000), 1)  # whole milliseconds, as Playwright reports them; 0 would be none
        if ms != self.timeout_ms:
            self.timeout_ms = ms
            self.context.set_default_timeout(ms)
            self.context.set_default_navigation_timeout(ms)

    @property
    def page(self) -> Any:
        """The active tab: the newest one still open (a link may have opened a popup)."""
        pages = [p for p in self.context.pages if not p.is_closed() and id(p) not in self.crashed]
        return pages[-1] if pages else self.context.new_page()


class BrowserSession:
    """A headless Chromium of one prompt, run on a dedicated thread; `run` executes operations on it."""

    def __init__(self, allowed: Networks, executable: str, timeout: float = 30.0):
        self.allowed = allowed
        self.timeout = timeout
        self.executable = executable
        self.broken = False  # the thread is wedged beyond recovery: the owner should start a new session
        self._queue: queue.Queue[_Task | None] = queue.Queue()
        self._lock = threading.Lock()
        self._dirs: list[str] = []
        self._pgids: set[int] = set()
        self._driver_pids: set[int] = set()
        self._blocked: list[str] = []
        self._proxy: PolicyProxy | None = None
        self._closed = False
        self._thread = threading.Thread(target=self._serve, name="browser-session", daemon=True)
        self._thread.start()

    # -- caller side -------------------------------------------------------------------------------------

    def run(self, fn: Callable[[Live], dict], timeout: float | None = None, deadline: float | None = None) -> dict:
        """Run fn(live) on the session thread and return its dict; raise BrowserError on a hang or failure.

        `timeout` is the Playwright timeout of fn's operations (the session's by default); `deadline`
        (time.monotonic), when given, ends every wait here, the browser's start included.
        """
        if self._closed or self.broken:
            raise BrowserError("the browser session is closed")
        task = _Task(fn, max(timeout or self.timeout, 0.1))  # 0 would be no timeout at all to Playwright

        def within(seconds: float) -> float:
            return seconds if deadline is None else max(0.0, min(seconds, deadline + DEADLINE_GRACE - time.monotonic()))

        self._queue.put(task)
        launch = within(LAUNCH_TIMEOUT)
        if not task.started.wait(launch):
            self._kill_browser()
            self._abandon_if_stuck(task)
            raise BrowserError(f"the browser did not start within {launch:.0f}s")
        limit = within(task.timeout + HANG_GRACE)
        try:
            return task.future.result(limit)
        except concurrent.futures.TimeoutError:
            self._kill_browser()
            self._abandon_if_stuck(task)
            raise BrowserError(
                f"the browser did not respond within {limit:.0f}s and was killed; the next call starts a new one"
            ) from None

    def close(self) -> None:
        """Close the browser and stop the thread; whatever is still running is killed. Never raises."""
        if self._closed:
            return
        self._closed = True
        self._queue.put(None)
        self._thread.join(15)
        if self._thread.is_alive():
            self._kill_browser()
            self._thread.join(5)
        if self._thread.is_alive():
            self._kill_pids(self._driver_pids)
        self._kill_browser()
        if self._proxy is not None:
            self._proxy.close()
        for d in self._dirs:
            shutil.rmtree(d, ignore_errors=True)

    def take_blocked(self) -> list[str]:
        """Policy refusals since the last call (cleared)."""
        with self._lock:
            out, self._blocked = self._blocked, []
        return out

    def _record_refusal(self, reason: str) -> None:
        with self._lock:
            self._blocked.append(reason)

    def _abandon_if_stuck(self, task: _Task) -> None:
        try:
            task.future.exception(HANG_GRACE)
        except concurrent.futures.TimeoutError:
            # Killing Chromium did not free the thread, so its Playwright driver is stuck: give up on it.
            self.broken = True
            self._kill_pids(self._driver_pids)

    # -- session thread ----------------------------------------------------------------------------------

    def _serve(self) -> None:
        from playwright.sync_api import sync_playwright

        live = Live(self)
        playwright = None
        try:
            while True:
                task = self._queue.get()
                if task is None:
                    break
                if not task.future.set_running_or_notify_cancel():
                    continue
                try:
                    if playwright is None:
                        playwright = sync_playwright().start()
                    try:
                        note = self._ensure_browser(playwright, live)
                    except Exception as first:
                        # A launch can fail transiently on a loaded machine (Chromium exits during start-up):
                        # one more try, after clearing what the failed launch left, before failing the call.
                        log.warning("browser launch failed, retrying once: %s", launch_error(first))
                        self._kill_browser()
                        live.browser = None
                        time.sleep(1.0)
                        note = self._ensure_browser(playwright, live)
                except BaseException as e:
                    task.started.set()
                    task.future.set_exception(BrowserError(f"cannot start the browser: {launch_error(e)}"))
                    continue
                task.started.set()
                try:
                    live.set_timeout(task.timeout)
                    result = task.fn(live)
                    if note:
                        result.setdefault("note", note)
                    task.future.set_result(result)
                except BaseException as e:
                    task.future.set_exception(e)
        finally:
            for step in (
                lambda: live.browser and live.browser.close(),
                lambda: playwright and playwright.stop(),
            ):
                try:
                    step()
                except Exception:
                    pass

    def _ensure_browser(self, playwright: Any, live: Live) -> str | None:
        """Launch the browser if there is none or it died; say so when a dead one was replaced."""
        if live.browser is not None and live.browser.is_connected():
            crashed = [p for p in live.context.pages if id(p) in live.crashed]
            for page in crashed:
                try:
                    page.close()
                except Exception:
                    pass
            live.crashed.clear()
            return "the page crashed and was closed; its tab is lost" if crashed else None
        note = None
        if live.browser is not None:
            note = "the browser had crashed or hung and was restarted; the previous page is lost"
            try:
                live.browser.close()
            except Exception:
                pass
            self._kill_browser()
        if self._proxy is None:
            self._proxy = PolicyProxy(self.allowed, self._record_refusal)
        config = tempfile.mkdtemp(prefix="batch-runner-browser-")
        if len(config) > MAX_CONFIG_PATH:
            # Chromium's singleton socket lives under TMPDIR and a Unix socket path has 107 bytes at most:
            # under a deep TMPDIR Chromium dies at start-up ("Socket path too long").
            os.rmdir(config)
            config = tempfile.mkdtemp(prefix="br-browser-", dir="/tmp")
        self._dirs.append(config)
        live.browser = playwright.chromium.launch(
            executable_path=self.executable,
            headless=True,
            args=[*CHROMIUM_ARGS, MARKER_FLAG + config],
            # "<-loopback>" drops Chromium's implicit proxy bypass for loopback, which the policy must see too.
            proxy={"server": f"http://127.0.0.1:{self._proxy.port}", "bypass": "<-loopback>"},
            # Crashpad and profile data land under XDG_CONFIG_HOME: keeping it per launch both spares the
            # user's ~/.config and puts the directory in the crashpad handlers' command lines, to find them.
            env={**os.environ, "XDG_CONFIG_HOME": config, "TMPDIR": config},
            timeout=LAUNCH_TIMEOUT * 1000,
            handle_sigint=False,
            handle_sigterm=False,
            handle_sighup=False,
        )
        self._record_processes(config)
        live.context = live.browser.new_context(
            viewport=VIEWPORT,
            service_workers="block",
            accept_downloads=False,
            ignore_https_errors=True,
        )
        live.context.set_default_timeout(live.timeout_ms)
        live.context.set_default_navigation_timeout(live.timeout_ms)
        live.context.on("page", lambda page: page.on("crash", lambda p: live.crashed.add(id(p))))
        live.crashed.clear()
        live.page  # noqa: B018 - opens the first tab
        return note

    # -- processes ---------------------------------------------------------------------------------------

    def _record_processes(self, config: str) -> None:
        for _pid, ppid, pgid, cmdline in _processes():
            if MARKER_FLAG + config in cmdline:
                self._pgids.add(pgid)
                self._driver_pids.add(ppid)

    def _kill_browser(self) -> None:
        """SIGKILL every process of every browser this session launched."""
        targets = [
            pid
            for pid, _, pgid, cmdline in _processes()
            if pgid in self._pgids or any(d in cmdline for d in self._dirs)
        ]
        self._kill_pids(targets)

    @staticmethod
    def _kill_pids(pids: Any) -> None:
        for pid in pids:
            if pid in (os.getpid(), 0, 1):
                continue
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass


def _processes() -> list[tuple[int, int, int, str]]:
    """(pid, ppid, pgid, command line) of every live process; zombies are left out."""
    out = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as f:
                stat = f.read()
            with open(f"/proc/{name}/cmdline", "rb") as f:
                cmdline = f.read().replace(b"\0", b" ").decode("utf-8", "replace")
        except OSError:
            continue
        fields = stat[stat.rfind(")") + 2 :].split()
        if fields[0] in ("Z", "X"):
            continue
        out.append((int(name), int(fields[1]), int(fields[2]), cmdline))
    return out
