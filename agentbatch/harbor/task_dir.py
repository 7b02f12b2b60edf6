"""A Harbor task directory read and checked: its instruction, config, identity and build context.

    my-task/
      instruction.md      the prompt
      task.toml           its config (task_config.py)
      environment/        the build context: Dockerfile (unless [environment] docker_image), docker-compose.yaml
      tests/test.sh       the verifier, copied to /tests after the agent (tests/Dockerfile: a separate verifier's image)
      solution/solve.sh   the reference solution, copied to /solution for an oracle run

Everything wrong with a task is a `TaskError` with a one-line reason; the loader skips that task and says why.
"""

from __future__ import annotations

import hashlib
import os
import re
import stat
from dataclasses import dataclass, field

from agentbatch.harbor import compose_task
from agentbatch.harbor.task_config import EnvConfig, TaskConfig, TaskError, parse
from agentbatch.sandboxes.base import ComposeProject, ImageBuild

INSTRUCTION, CONFIG, ENVIRONMENT, TESTS, SOLUTION = "instruction.md", "task.toml", "environment", "tests", "solution"
TEST_SCRIPT, SOLVE_SCRIPT = "tests/test.sh", "solution/solve.sh"
DOCKERFILE, COMPOSE_FILES = "Dockerfile", ("docker-compose.yaml", "docker-compose.yml")
PRIOR_CONTEXT = "trajectory.json"  # Harbor's prior agent context (an ATIF trajectory seeded before the agent)
MAX_CONTEXT_BYTES = 1024**3  # environment/, tests/ or solution/ over this is refused: docs/harbor.md
MAX_INSTRUCTION_CHARS = 1_000_000
MAX_INSTRUCTION_BYTES = 4 * MAX_INSTRUCTION_CHARS  # UTF-8: at most 4 bytes a character; checked before reading
MAX_CONFIG_BYTES = 1 << 20  # task.toml
BOUNDED_DIRS = (ENVIRONMENT, TESTS, SOLUTION)  # copied into an image or a container: each at most MAX_CONTEXT_BYTES
IMAGE_REPOSITORY = "br-harbor"
# Every image a run builds carries it (and the run directory's label, sandboxes.base.RUN_DIR_LABEL): docs/harbor.md.
BUILT_LABEL = "batch_runner.harbor"  # = the task's name
# Canary lines (benchmark provenance markers) that open an instruction are not shown to the agent, as in Harbor.
_CANARY = re.compile(r"^(<!--.*canary.*-->|#.*canary.*)$", re.IGNORECASE)


@dataclass
class HarborTask:
    """One task directory, checked: what a dataset entry and its sandbox need."""

    path: str  # absolute, symlinks resolved
    name: str
    instruction: str
    config: TaskConfig
    files_hash: str  # every file of the task: an edited task is another task
    context_hash: str | None  # environment/ alone: with base_ids, the image's tag
    compose_file: str | None = None
    warnings: list[str] = field(default_factory=list)
    has_dockerfile: bool = True  # environment/Dockerfile, which the run builds (unless docker_image)
    compose: ComposeProject | None = None  # environment/docker-compose.yaml's project (compose_task.py)
    compose_image: str | None = None  # main's image when the Compose file gives it
    tests_hash: str | None = None  # tests/, when a separate verifier's image is built from it

    @property
    def identity(self) -> str:
        """What resume matches a finished sample to: the task's name and a hash of its files."""
        return f"harbor:{self.name}:{self.files_hash[:32]}"

    @property
    def metadata(self) -> dict:
        """The trajectory line's task metadata: which task, and which image its sample ran in (the run fills in the
        image built, and its id, once it is made: dataset_steps.prepare_sandboxes)."""
        c = self.config
        return {
            "name": self.name,
            "difficulty": c.difficulty,
            "category": c.category,
            "tags": list(c.tags),
            "image": self.image,
            "image_id": None,  # known once the run has built or found it
        }

    @property
    def image_build(self) -> ImageBuild | None:
        """The image built from environment/ (None with [environment] docker_image): tagged by a hash of the build
        context and of its FROM images' ids, so a base image retagged is another image (ImageBuild.tag)."""
        if self.config.docker_image or not self.has_dockerfile:
            return None
        return ImageBuild(
            context=self.file(ENVIRONMENT),
            repository=f"{IMAGE_REPOSITORY}/{safe_name(self.name)}",
            context_hash=self.context_hash or "",
            name=self.name,
            timeout=self.config.build_timeout,
            labels=((BUILT_LABEL, self.name),),
        )

    @property
    def image(self) -> str:
        """The container image: [environment] docker_image as is, else the build's tag before its FROM images are
        resolved (the run's is `image_build.tag(base_ids)`, once they are), else main's in the Compose file."""
        if self.config.docker_image:
            return self.config.docker_image
        build = self.image_build
        return build.tag() if build else self.compose_image or ""

    @property
    def builds(self) -> bool:
        """Whether the run builds this task's image from its Dockerfile."""
        return self.image_build is not None

    @property
    def verifier_image(self) -> str | None:
        """A separate verifier's prebuilt image: [verifier.environment] docker_image (Harbor uploads tests/ into its
        working directory; /tests/test.sh must be in it)."""
        own = self.config.verifier_environment
        return own.docker_image if self.config.separate and own is not None else None

    @property
    def verifier_build(self) -> ImageBuild | None:
        """A separate verifier's image, built from tests/ (its Dockerfile), as Harbor builds it, unless
        [verifier.environment] names a docker_image."""
        if not self.config.separate or self.verifier_image or self.tests_hash is None:
            return None
        return ImageBuild(
            context=self.file(TESTS),
            repository=f"{IMAGE_REPOSITORY}/{safe_name(self.name)}-verifier",
            context_hash=self.tests_hash,
            name=f"{self.name} (verifier)",
            timeout=self.config.build_timeout,  # Harbor bounds the verifier's start by the agent env's
            labels=((BUILT_LABEL, self.name),),
        )

    def file(self, relative: str) -> str:
        return os.path.join(self.path, relative)


def safe_name(name: str) -> str:
    """A task name as one component of an image name: lower case, [a-z0-9._-], starting alphanumeric."""
    safe = re.sub(r"[^a-z0-9._-]+", "-", name.lower()).strip("-._") or "task"
    return safe[:100]


def is_task_dir(path: str) -> bool:
    """A directory that means to be a task: it has instruction.md or task.toml."""
    return os.path.isfile(os.path.join(path, INSTRUCTION)) or os.path.isfile(os.path.join(path, CONFIG))


def load(path: str) -> HarborTask:
    """Read and check one task directory; TaskError with the reason if it cannot run.

    Everything is checked before anything is read: symlinks, kinds of file and sizes (a 5 GB instruction.md is
    refused, never read), then the two files are read, then every file hashed (streamed).
    """
    root = os.path.realpath(path)
    for required in (INSTRUCTION, CONFIG):
        if not os.path.isfile(os.path.join(root, required)):
            raise TaskError(f"not a task directory: no {required}")
    sizes = scan(root)  # also refuses a symlink that leads out of the task
    for name, limit in ((CONFIG, MAX_CONFIG_BYTES), (INSTRUCTION, MAX_INSTRUCTION_BYTES)):
        size = os.stat(os.path.join(root, name)).st_size
        if size > limit:
            raise TaskError(f"{name} is {size} bytes, over the limit of {limit}")
    cfg, warnings = parse(_read_text(root, CONFIG))
    instruction = strip_canary(_read_text(root, INSTRUCTION))
    if not instruction.strip():
        raise TaskError("instruction.md is empty")
    if len(instruction) > MAX_INSTRUCTION_CHARS:
        raise TaskError(f"instruction.md is {len(instruction)} characters, over the limit of {MAX_INSTRUCTION_CHARS}")
    if "\x00" in instruction:
        raise TaskError("instruction.md contains a NUL character")
    verifier_dockerfile = cfg.separate and os.path.isfile(os.path.join(root, TESTS, DOCKERFILE))
    _check_verifier(root, cfg, verifier_dockerfile)
    env_dir = os.path.join(root, ENVIRONMENT)
    compose = next((f for f in COMPOSE_FILES if os.path.isfile(os.path.join(env_dir, f))), None)
    has_dockerfile = os.path.isfile(os.path.join(env_dir, DOCKERFILE))
    if not cfg.docker_image and not has_dockerfile and not compose:
        raise TaskError(
            f"no {ENVIRONMENT}/{DOCKERFILE}, {ENVIRONMENT}/{COMPOSE_FILES[0]} or [environment] docker_image"
        )
    if cfg.services() and not compose:
        raise TaskError(
            f"[[verifier.collect]] or artifacts name the service(s) {', '.join(sorted(cfg.services()))}, "
            f"but the task has no {ENVIRONMENT}/{COMPOSE_FILES[0]}"
        )
    for name in BOUNDED_DIRS:
        if name == ENVIRONMENT and cfg.docker_image and not compose:
            continue  # not built
        if sizes.get(name, 0) > MAX_CONTEXT_BYTES:
            what = "the build context " if name == ENVIRONMENT else ""
            raise TaskError(f"{what}{name}/ holds {sizes[name]} bytes, over the limit of {MAX_CONTEXT_BYTES} (1 GiB)")
    files_hash = tree_hash(root)
    context_hash = None if cfg.docker_image and not compose else tree_hash(env_dir, inside=root)
    name = cfg.name or os.path.basename(root)
    task = HarborTask(
        root,
        name,
        instruction,
        cfg,
        files_hash,
        context_hash,
        os.path.join(ENVIRONMENT, compose) if compose else None,
        warnings,
        has_dockerfile=has_dockerfile,
        tests_hash=tree_hash(os.path.join(root, TESTS), inside=root) if verifier_dockerfile else None,
    )
    if compose:
        task.compose, task.compose_image = compose_task.resolve(task, f"{IMAGE_REPOSITORY}/{safe_name(name)}")
    return task


def _check_verifier(root: str, cfg: TaskConfig, verifier_dockerfile: bool) -> None:
    """tests/test.sh is there, unless a separate verifier's image holds it (Harbor's rule); prior context refused."""
    if os.path.lexists(os.path.join(root, PRIOR_CONTEXT)):
        raise TaskError(
            f"{PRIOR_CONTEXT} (prior agent context to seed before the agent): this runner starts every agent "
            "from the instruction alone"
        )
    if cfg.separate and any(os.path.isfile(os.path.join(root, TESTS, f)) for f in COMPOSE_FILES):
        raise TaskError("a separate verifier of several containers (tests/docker-compose.yaml) is not run here")
    in_image = cfg.separate and (verifier_dockerfile or (cfg.verifier_environment or EnvConfig()).docker_image)
    script = os.path.join(root, TEST_SCRIPT)
    if not in_image and (not os.path.isfile(script) or os.path.islink(script)):
        raise TaskError(f"no {TEST_SCRIPT}: the task has no verifier")


def strip_canary(text: str) -> str:
    """The instruction without the canary comment lines (and blank lines) that open it."""
    lines = text.split("\n")
    i = 0
    while i < len(lines) and _CANARY.match(lines[i].strip()):
        i += 1
    while i < len(lines) and not lines[i].strip():
        i += 1
    return "\n".join(lines[i:])


def _read_text(root: str, name: str) -> str:
    path = os.path.join(root, name)
    limit = MAX_CONFIG_BYTES if name == CONFIG else MAX_INSTRUCTION_BYTES
    try:
        with open(path, "rb") as f:
            raw = f.read(limit + 1)  # its size was checked; a file that grew since is cut, and refused below
    except OSError as e:
        raise TaskError(f"cannot read {name}: {e.strerror}") from None
    if len(raw) > limit:
        raise TaskError(f"{name} is over the limit of {limit} bytes")
    try:
        return raw.removeprefix(b"\xef\xbb\xbf").decode("utf-8")
    except UnicodeDecodeError as e:
        raise TaskError(f"{name} is not valid UTF-8 (byte {e.start})") from None


def _walk(root: str):
    """(relative path, lstat) of everything under root, sorted, never following a symlink."""
    for top, dirs, files in os.walk(root, followlinks=False):
        dirs.sort()
        for name in sorted(dirs + files):
            full = os.path.join(top, name)
            yield os.path.relpath(full, root), os.lstat(full)


def scan(root: str) -> dict[str, int]:
    """The bytes of regular files under each top-level entry of the task, nothing read; TaskError for a symlink
    that leads out of the task, or anything that is not a file, directory or symlink. A symlink counts as its
    file's size where the link is, since it is copied as that file."""
    sizes: dict[str, int] = {}
    for rel, st in _walk(root):
        full = os.path.join(root, rel)
        if stat.S_ISLNK(st.st_mode):
            _inside(full, root)
            try:
                st = os.stat(full)
            except OSError:
                continue  # a dangling link: nothing to copy
        if stat.S_ISREG(st.st_mode):
            top = rel.split(os.sep, 1)[0]
            sizes[top] = sizes.get(top, 0) + st.st_size
        elif not stat.S_ISDIR(st.st_mode):
            raise TaskError(f"{rel} is not a regular file, directory or symlink")
    return sizes


def _inside(full: str, inside: str) -> None:
    real = os.path.realpath(full)
    if real != inside and not real.startswith(inside + os.sep):
        shown = os.path.relpath(full, inside)
        raise TaskError(f"{shown} is a symlink to {os.readlink(full)}, outside the task directory")


def tree_hash(root: str, inside: str | None = None) -> str:
    """sha256 over every path, file content, executable bit and symlink target under root.

    A symlink must lead inside `inside` (the task directory; default root): one leading out is refused.
    """
    inside = os.path.realpath(inside or root)
    digest = hashlib.sha256()
    for rel, st in _walk(root):
        full = os.path.join(root, rel)
        if stat.S_ISLNK(st.st_mode):
            _inside(full, inside)
            digest.update(f"L\0{rel}\0{os.readlink(full)}\n".encode())
        elif stat.S_ISDIR(st.st_mode):
            digest.update(f"D\0{rel}\n".encode())
        elif stat.S_ISREG(st.st_mode):
            digest.update(f"F\0{rel}\0{bool(st.st_mode & 0o111)}\0{_file_hash(full)}\n".encode())
        else:
            raise TaskError(f"{os.path.relpath(full, inside)} is not a regular file, directory or symlink")
    return digest.hexdigest()


def _file_hash(path: str) -> str:
    digest = hashlib.sha256()
    try:
        with open(path, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                digest.update(block)
    except OSError as e:
        raise TaskError(f"cannot read {path}: {e.strerror}") from None
    return digest.hexdigest()
