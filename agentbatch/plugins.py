"""The one loader of plug-ins: importing a plug-in module registers what it declares (docs/plugins.md).

Tools (`@tool`), sandbox backends, dataset formats (`@dataset_format`) and models (`@register_model`)
register through their decorators when their module is imported. The built-ins are imported here exactly as
a third party's plug-ins are, in this order:

1. BUILTINS, the package's own modules;
2. every module named by an installed package's entry points in one of GROUPS, as simonw/llm finds its
   plug-ins (`[project.entry-points."batch_runner.tools"] my_tools = "my_package.tools"`; found with
   importlib.metadata, agentbatch/entry_points.py);
3. the modules or `.py` files a run names (`--plugins`), in the order given.

Each kind's decorator adds to its one Registry (agentbatch/registry.py); the registries are read once `load`
has run (the runner's start, each worker's start), and never load anything themselves. A worker (forked,
spawned, or a Ray actor) calls `load` with the run's list at its start, so a plug-in file's tools exist in
every worker. Loading twice imports nothing twice.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import os
import signal
import sys
import threading
import traceback
from collections.abc import Iterable
from types import ModuleType

import agentbatch.entry_points as entry_points
import agentbatch.registry as registry
from agentbatch.errors import FatalError

GROUPS = ("batch_runner.tools", "batch_runner.sandboxes", "batch_runner.datasets", "batch_runner.models")
BUILTINS = (
    # The tool modules; the browser's pulls in Playwright only when a browser tool is called.
    "agentbatch.tools.terminal",
    "agentbatch.tools.files",
    "agentbatch.tools.web",
    "agentbatch.tools.vision",
    "agentbatch.tools.image",
    "agentbatch.tools.moa",
    "agentbatch.tools.browser",
    # The sandbox backends, in the order --sandbox lists them; docker's imports the Docker SDK only when
    # a sample first needs it.
    "agentbatch.sandboxes.bwrap",
    "agentbatch.sandboxes.local",
    "agentbatch.sandboxes.docker",
    # The JSONL dataset format.
    "agentbatch.dataset_jsonl",
    # Harbor task directories, and --model=oracle (docs/harbor.md).
    "agentbatch.harbor.dataset_format",
    "agentbatch.harbor.oracle",
)

_lock = threading.RLock()
_installed = False  # BUILTINS and the entry points are imported (or being imported, by this thread)
_named: dict[str, ModuleType] = {}  # what a run named (a module name or a file's real path) -> its module


def load(named: Iterable[str] = ()) -> list[ModuleType]:
    """Import the built-ins and the installed plug-ins (once), then each named module or file (once each).

    Returns the modules of `named`, in order. A module that does not import, a name that is neither a
    module nor a file, or a file whose name another module has is a FatalError naming it.
    """
    global _installed
    with _lock:
        if not _installed:
            _installed = True  # first: a plug-in that asks for the tools while it is imported must not recurse
            registry.loading()
            for name in BUILTINS:
                importlib.import_module(name)
            for group, name, value in entry_points.find(GROUPS):
                _import(f"plug-in {value!r} (entry point {name!r} of {group})", lambda v=value: _load_value(v))
        return [_load_named(spec) for spec in named]


def loaded() -> tuple[str, ...]:
    """The modules and files runs named so far, as they were named (what a worker must load again)."""
    with _lock:
        return tuple(_named)


def _load_named(spec: str) -> ModuleType:
    module = _named.get(spec)
    if module is not None:
        return module
    if spec.endswith(".py") or os.sep in spec:
        module = _from_file(spec)
    else:
        try:
            found = importlib.util.find_spec(spec)
        except (ImportError, ValueError):
            found = None
        if found is None:
            raise FatalError(f"plug-in {spec!r}: no such module, and not a .py file")
        module = _import(f"plug-in {spec!r}", lambda: importlib.import_module(spec))
    _named[spec] = module
    return module


def _from_file(path: str) -> ModuleType:
    """A .py file as a module named after it (so `my_tools.py` is the module, and the toolset, `my_tools`)."""
    real = os.path.realpath(path)
    if not os.path.isfile(real):
        if os.path.exists(real):
            raise FatalError(f"plug-in file {path} is not a regular file (a directory, device or FIFO)")
        raise FatalError(f"plug-in file {path} does not exist")
    name = os.path.splitext(os.path.basename(real))[0]
    if not name.isidentifier():
        raise FatalError(f"plug-in file {path}: {name!r} is not a Python module name; rename the file")
    other = sys.modules.get(name)
    if other is not None:
        if os.path.realpath(getattr(other, "__file__", "") or "") == real:
            return other
        raise FatalError(f"plug-in file {path}: a module named {name!r} is already loaded; rename the file")
    spec = importlib.util.spec_from_file_location(name, real)
    if spec is None or spec.loader is None:
        raise FatalError(f"plug-in file {path} cannot be loaded as a Python module")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    folder = os.path.dirname(real)
    if folder not in sys.path:
        sys.path.append(folder)  # its neighbours import as they would next to it
    try:
        _import(f"plug-in file {path}", lambda: spec.loader.exec_module(module))
    except FatalError:
        del sys.modules[name]
        raise
    return module


def _import(what: str, do):
    """Run `do` (an import); whatever the plug-in raises (an exception, sys.exit, a KeyboardInterrupt of its own, a
    SyntaxError) is a FatalError naming it and where; a real Ctrl-C meanwhile stays one."""
    with _ctrl_c_noted() as ctrl_c:
        try:
            return do()
        except FatalError:
            raise
        except KeyboardInterrupt as e:
            if ctrl_c:
                raise
            raise FatalError(_does_not_import(what, e)) from e
        except BaseException as e:  # the plug-in's own error: one line naming it, the traceback with --verbose
            raise FatalError(_does_not_import(what, e)) from e


def _does_not_import(what: str, e: BaseException) -> str:
    if isinstance(e, SyntaxError):  # where the syntax is wrong, not the importer's frame that compiled it
        text, file, line = e.msg, e.filename, e.lineno
    else:
        text, file, line = str(e), None, None
        # The deepest frame of a file (importlib's own frozen frames name no file of the plug-in's).
        for frame in reversed(traceback.extract_tb(e.__traceback__)):
            if not frame.filename.startswith("<frozen "):
                file, line = frame.filename, frame.lineno
                break
    where = f" ({os.path.basename(file)}, line {line})" if file and line else ""
    text = " ".join(text.split())[:300]
    return f"{what} does not import: {type(e).__name__}{': ' + text if text else ''}{where}"


@contextlib.contextmanager
def _ctrl_c_noted():
    """A list that is not empty once a real Ctrl-C (SIGINT) arrived: told apart from a plug-in raising
    KeyboardInterrupt itself. Signals come to the main thread only, so only there can a KeyboardInterrupt be one."""
    noted: list[bool] = []
    previous = signal.getsignal(signal.SIGINT)
    if threading.current_thread() is not threading.main_thread() or not callable(previous):
        yield noted
        return

    def note(signum, frame):
        noted.append(True)
        previous(signum, frame)

    signal.signal(signal.SIGINT, note)
    try:
        yield noted
    finally:
        signal.signal(signal.SIGINT, previous)


def _load_value(value: str):
    """What an entry point names: `module` or `module:attribute` (importing the module registers it)."""
    module, _, attribute = value.partition(":")
    loaded = importlib.import_module(module.strip())
    for part in filter(None, attribute.strip().split(".")):
        loaded = getattr(loaded, part)
    return loaded
