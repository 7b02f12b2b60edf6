"""The docker backend's images made before any sample starts (`DockerBackend.prepare_all`, docs/sandboxes.md).

A spec with a build (`base.ImageBuild`) gets an image built from its context with the docker SDK (the classic
builder), tagged by a hash of the context and of the ids of its FROM images (`ImageBuild.tag`), so it is built
once and reused by every sample and every later run until the context or a base image changes. The engine's
images are listed once per run, whatever the number of specs; a FROM image that is not there is pulled, once
for all the builds that name it. Builds run a few at once, each within its own timeout; a build that fails (or
times out, or whose FROM image cannot be had) is that spec's error, and nothing else. A spec with an image only
gets the engine's id of it if it is here (its samples pull it otherwise, as any sample does).
"""

from __future__ import annotations

import collections
import contextlib
import os
import re
import socket
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import docker
import docker.errors
import requests
import urllib3
from docker.utils import kwargs_from_env

from agentbatch.sandboxes.base import RUN_DIR_LABEL, ImageBuild, Prepared, SandboxSpec
from agentbatch.sandboxes.docker_engine import client, message
from agentbatch.terminal_text import safe

LOG_TAIL_LINES = 40
TAIL_CHARS = 2000
DOCKERFILE = "Dockerfile"
MAX_DOCKERFILE_CHARS = 1 << 20  # FROM lines are read from this much of a Dockerfile
CHECKING_NOTE_BUILDS = 50  # from this many builds on, a line says what the run does before its first build
_ENGINE_ERRORS = (docker.errors.DockerException, requests.RequestException, urllib3.exceptions.HTTPError, OSError)


class BuildFailed(Exception):
    """An image could not be had: why, in one line, then the end of the build log."""


class _BuildClient(docker.APIClient):
    """An API client that keeps the build's response, so a watchdog can cut its connection at the timeout."""

    response = None

    def _stream_helper(self, response, decode=False):
        self.response = response
        return super()._stream_helper(response, decode=decode)


def prepare_all(specs: list[SandboxSpec], parallel: int, log: Callable[[str], None]) -> list[Prepared]:
    """What `DockerBackend.prepare_all` makes of each spec: its build's image built or found, at most `parallel`
    builds at once (each build's FROM images resolved first: pulled if absent), or an image's id looked up."""
    builds = [s.build for s in specs if s.build is not None]
    if len(builds) >= CHECKING_NOTE_BUILDS:  # many builds: say what the pause before the first one is
        log(f"checking the images of {len(builds)} task(s)")
    try:
        local = Images() if specs else None
    except BuildFailed as e:  # the engine went away since the run checked it: every build says so
        return [Prepared(s.build.tag(), error=str(e)) if s.build else Prepared(s.image) for s in specs]
    done: dict[int, Prepared] = {}
    todo: dict[str, tuple[ImageBuild, str | None]] = {}  # tag -> the build, and the run directory it labels
    tags: dict[int, str] = {}
    for i, spec in enumerate(specs):
        if spec.build is None:
            done[i] = Prepared(spec.image, local.id_of(spec.image) if spec.image else None)
            continue
        try:
            base_ids = tuple(local.resolve(image) for image in dockerfile_bases(spec.build))
        except BuildFailed as e:
            done[i] = Prepared(spec.build.tag(), error=str(e))
            continue
        tags[i] = tag = spec.build.tag(base_ids)
        todo.setdefault(tag, (spec.build, spec.labels.get(RUN_DIR_LABEL)))
        done[i] = Prepared(tag, local.id_of(tag), base_ids=base_ids)
    missing = [tag for tag in todo if local.id_of(tag) is None]
    results = _build_all(missing, todo, parallel, log)
    for i, tag in tags.items():
        if tag in results:
            made = results[tag]
            done[i] = Prepared(tag, made.image_id, made.built, made.error, done[i].base_ids, made.seconds)
    prepared = [done[i] for i in range(len(specs))]
    _summary(prepared, next((s.labels[RUN_DIR_LABEL] for s in specs if s.labels.get(RUN_DIR_LABEL)), None), log)
    return prepared


def _build_all(
    missing: list[str], todo: dict[str, tuple[ImageBuild, str | None]], parallel: int, log: Callable[[str], None]
) -> dict[str, Prepared]:
    """The missing images built, `parallel` at a time, each line of progress logged; results by tag."""
    if not missing:
        return {}
    log(f"building {len(missing)} image(s), {min(parallel, len(missing))} at a time")
    numbers = iter(range(1, len(missing) + 1))
    lock = threading.Lock()

    def one(tag: str) -> Prepared:
        build, run_dir = todo[tag]
        result = build_one(build, tag, run_dir, log)
        with lock:
            n = next(numbers)
        status = f"failed: {result.error.splitlines()[0]}" if result.error else "built"
        log(safe(f"[{n}/{len(missing)}] {build.name}: {status} ({result.seconds:.0f} s)"))
        return result

    with ThreadPoolExecutor(max_workers=max(1, parallel), thread_name_prefix="image-build") as pool:
        return dict(zip(missing, pool.map(one, missing), strict=True))


def _summary(prepared: list[Prepared], run_dir: str | None, log: Callable[[str], None]) -> None:
    """One line when anything was built or failed: how many of each image, and how to remove what was built."""
    images = list({p.image: p for p in prepared}.values())
    built, failed = sum(p.built and not p.error for p in images), sum(1 for p in images if p.error)
    if built or failed:
        found = len(images) - built - failed
        remove = f"; remove the images this run built with: {remove_command(run_dir)}" if run_dir else ""
        log(f"{built} image(s) built, {found} found, {failed} failed{remove}")


def dockerfile_bases(build: ImageBuild) -> list[str]:
    """The FROM images of the Dockerfile at the top of the build's context; BuildFailed if it cannot be read."""
    try:
        with open(os.path.join(build.context, DOCKERFILE), encoding="utf-8", errors="replace") as f:
            return base_images(f.read(MAX_DOCKERFILE_CHARS))
    except OSError as e:
        shown = f"{os.path.basename(build.context.rstrip(os.sep))}/{DOCKERFILE}"
        raise BuildFailed(f"cannot read {shown}: {e.strerror}") from None


def base_images(dockerfile: str) -> list[str]:
    """The images a Dockerfile's FROM lines name (stages, scratch and names with unresolved ${ARG}s left out)."""
    text = re.sub(r"\\\r?\n", " ", dockerfile)
    args: dict[str, str] = {}
    stages: set[str] = set()
    images: list[str] = []
    for line in text.splitlines():
        words = line.split()
        if not words or words[0].startswith("#"):
            continue
        op = words[0].upper()
        if op == "ARG" and len(words) > 1 and not stages and not images:
            name, _, default = words[1].partition("=")
            if default.strip("\"'"):
                args[name] = default.strip("\"'")
        elif op == "FROM":
            rest = [w for w in words[1:] if not w.startswith("--")]
            if not rest:
                continue
            image = re.sub(r"\$\{?(\w+)\}?", lambda m: args.get(m.group(1), m.group(0)), rest[0])
            alias = rest[2].lower() if len(rest) >= 3 and rest[1].upper() == "AS" else None
            if "$" not in image and image.lower() != "scratch" and image.lower() not in stages:
                if image not in images:
                    images.append(image)
            if alias:
                stages.add(alias)
    return images


class Images:
    """The engine's images, listed once (one call for any number of specs), then looked up by reference."""

    def __init__(self):
        self._ids: dict[str, str] = {}
        self._resolved: dict[str, str | BuildFailed] = {}
        try:
            listing = docker.APIClient(version="auto", timeout=300, **kwargs_from_env()).images()
        except _ENGINE_ERRORS as e:
            raise BuildFailed(f"cannot reach the Docker engine: {message(e)}") from None
        for image in listing:
            for ref in (image.get("RepoTags") or []) + (image.get("RepoDigests") or []):
                self._ids[normal_reference(ref)] = image["Id"]

    def id_of(self, reference: str) -> str | None:
        return self._ids.get(normal_reference(reference))

    def resolve(self, reference: str) -> str:
        """A FROM image's id: found, else asked for by name, else pulled; BuildFailed naming it if none of these
        (asked once per run: the builds that share a base image share its answer)."""
        if reference not in self._resolved:
            try:
                self._resolved[reference] = self.id_of(reference) or self._ask(reference)
            except BuildFailed as e:
                self._resolved[reference] = e
        found = self._resolved[reference]
        if isinstance(found, BuildFailed):
            raise BuildFailed(str(found))
        return found

    @staticmethod
    def _ask(reference: str) -> str:
        engine = docker.from_env(timeout=300)
        try:
            return engine.images.get(reference).id  # a name the engine reads its own way
        except docker.errors.ImageNotFound:
            pass
        except _ENGINE_ERRORS as e:
            raise BuildFailed(f"cannot reach the Docker engine: {message(e)}") from None
        try:
            return engine.images.pull(reference).id
        except _ENGINE_ERRORS as e:
            raise BuildFailed(
                f"FROM image {reference!r} is not on this machine and could not be pulled ({message(e)}): "
                "it must be present (docker pull, load or import) or pullable"
            ) from None


def normal_reference(reference: str) -> str:
    """An image reference as the engine lists it: no docker.io/library/ prefix, ":latest" when it has no tag."""
    ref = reference
    for prefix in ("docker.io/", "index.docker.io/", "registry-1.docker.io/"):
        if ref.startswith(prefix):
            ref = ref[len(prefix) :]
            if ref.startswith("library/"):
                ref = ref[len("library/") :]
            break
    if "@" not in ref and ":" not in ref.rsplit("/", 1)[-1]:
        ref += ":latest"
    return ref


def build_one(build: ImageBuild, tag: str, run_dir: str | None, log: Callable[[str], None]) -> Prepared:
    """Build one image from its context as `tag`, labelled with the build's labels and the run directory."""
    start = time.monotonic()
    result = Prepared(tag)
    try:
        _build(build, tag, {**dict(build.labels), **({RUN_DIR_LABEL: run_dir} if run_dir else {})}, log)
        result.built = True
        result.image_id = _image_id(tag)
    except BuildFailed as e:
        result.error = str(e)
    result.seconds = time.monotonic() - start
    return result


def _image_id(image: str) -> str | None:
    try:
        return client().images.get(image).id
    except Exception:  # the engine away, or the image gone already: the id is only information
        return None


def _build(build: ImageBuild, tag: str, labels: dict[str, str], log: Callable[[str], None]) -> None:
    """Run the build, streaming its steps to the log; BuildFailed with the log's tail if it fails or times out."""
    timeout = build.timeout
    engine = _BuildClient(version="auto", timeout=max(timeout, 60) + 60, **kwargs_from_env())
    tail: collections.deque[str] = collections.deque(maxlen=LOG_TAIL_LINES)
    timed_out = threading.Event()

    def cut() -> None:  # the engine cancels a build whose client went away
        timed_out.set()
        response = engine.response
        if response is not None:
            with contextlib.suppress(Exception):
                raw = engine._get_raw_response_socket(response)
                getattr(raw, "_sock", raw).shutdown(socket.SHUT_RDWR)

    timer = threading.Timer(timeout, cut)
    timer.daemon = True
    timer.start()
    error = None
    try:
        stream = engine.build(path=build.context, tag=tag, rm=True, forcerm=True, decode=True, labels=labels)
        for chunk in stream:
            if "stream" in chunk:
                for line in str(chunk["stream"]).splitlines():
                    if line.strip():
                        tail.append(line)
                        if line.startswith("Step ") and " : LABEL batch_runner." not in line:
                            log(safe(f"{build.name}: {line.strip()[:200]}"))
            if "error" in chunk:
                error = str(chunk.get("error") or "").strip()
                tail.append(error)
    except _ENGINE_ERRORS as e:
        if not timed_out.is_set():
            error = f"the build stopped: {message(e)}"
    finally:
        timer.cancel()
        with contextlib.suppress(Exception):
            engine.close()
    if timed_out.is_set():
        error = f"the build took over its build_timeout_sec ({timeout:g} s)"
    if error:
        raise BuildFailed(f"image build failed: {message(error)}\n{_tail(tail)}")


def _tail(lines) -> str:
    text = "\n".join(lines)
    return text[-TAIL_CHARS:] if len(text) > TAIL_CHARS else text


def remove_command(run_dir: str) -> str:
    """The documented command that removes the images a run built."""
    return f"docker rmi $(docker images -q --filter label={RUN_DIR_LABEL}={run_dir})"
