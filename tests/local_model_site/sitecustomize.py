"""Makes the real llama.cpp server die the way repacked kernels do on some CPUs (put this folder on PYTHONPATH).

An Intel Xeon with AMX killed the embedded model's server with SIGSEGV at its first decode when llama.cpp's
extra buffer types were on (use_extra_bufts, its default), and another CPU's virtual machine with SIGILL;
the machines the suite runs on may do neither. Python imports this file at start in every process that has
its folder on PYTHONPATH (the runner passes PYTHONPATH on to the server); it acts only once llama-cpp-python's
bindings are imported, i.e. in the server. BR_LLAMA_SITE says what to do, as space-separated words:

    crash=SIGSEGV   die of this signal (SIGSEGV, SIGBUS, SIGABRT, SIGILL...) in the thread that runs the model
    at=decode       ... at the first llama_decode (the default), or at=load: while loading the model
    when=repack     ... only if the model was loaded with use_extra_bufts (the default), or when=always
    no_repack       load every model with use_extra_bufts off (what the server's --no_repack does)
    threads_batch=N evaluate prompts on N threads (bench/bench_local_model.py compares thread counts)
    note=PATH       append a JSON line to PATH at each model load and context made: what llama.cpp was given

Before dying it writes SITE_MARKER to stderr (the server's log), which no message of the runner may repeat.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import json
import os
import sys
import time

SITE_MARKER = "sitecustomize: the simulated crash of the repacked kernels"
_WORDS = dict(w.partition("=")[::2] for w in os.environ.get("BR_LLAMA_SITE", "").split())


def _die(where: str) -> None:
    import faulthandler
    import signal
    import threading

    sig = signal.Signals[_WORDS["crash"]]
    print(f"{SITE_MARKER}: {sig.name} {where}", file=sys.stderr, flush=True)
    faulthandler.disable()
    signal.pthread_kill(threading.get_ident(), sig)  # as a fault would: to the thread running the model
    time.sleep(5)  # not reached: the default action of these signals ends the process


def _note(**what) -> None:
    if "note" in _WORDS:
        with open(_WORDS["note"], "a") as f:
            f.write(json.dumps(what) + "\n")


def _patch(bindings) -> None:
    loaded_repacked = []
    load, decode, init = bindings.llama_model_load_from_file, bindings.llama_decode, bindings.llama_init_from_model
    always = _WORDS.get("when") == "always"

    def llama_model_load_from_file(path, params):
        if "no_repack" in _WORDS:
            params.use_extra_bufts = False
        loaded_repacked.append(bool(params.use_extra_bufts))
        _note(pid=os.getpid(), use_extra_bufts=bool(params.use_extra_bufts))
        if "crash" in _WORDS and _WORDS.get("at") == "load" and (always or params.use_extra_bufts):
            _die("while loading the model")
        return load(path, params)

    def llama_init_from_model(model, params):
        if "threads_batch" in _WORDS:
            params.n_threads_batch = int(_WORDS["threads_batch"])
        _note(pid=os.getpid(), n_threads=params.n_threads, n_threads_batch=params.n_threads_batch)
        return init(model, params)

    def llama_decode(ctx, batch):
        if "crash" in _WORDS and _WORDS.get("at", "decode") == "decode" and (always or any(loaded_repacked)):
            _die("in llama_decode")
        return decode(ctx, batch)

    bindings.llama_model_load_from_file = llama_model_load_from_file
    bindings.llama_init_from_model = llama_init_from_model
    bindings.llama_decode = llama_decode


class _PatchBindings(importlib.abc.MetaPathFinder):
    """Finds llama_cpp.llama_cpp as usual and patches the module once it has run."""

    def find_spec(self, name, path, target=None):
        if name != "llama_cpp.llama_cpp":
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None:
            return spec
        run = spec.loader.exec_module

        def exec_module(module):
            run(module)
            _patch(module)

        spec.loader.exec_module = exec_module
        return spec


if _WORDS:
    sys.meta_path.insert(0, _PatchBindings())
