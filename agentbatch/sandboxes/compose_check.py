"""What a Compose project may not ask of this machine (compose.py runs it once per sample, many at once).

Checked on the project as Compose resolves it (`config --format json`: every file merged, variables
interpolated), before any sample: one line naming the first service and key that asks for one of these, or
None. A sample's services are its own and go with it; nothing of them may reach the machine or other samples:
no privileged container, added capability or device, no host network, PID, IPC, UTS or user namespace, no
security option, no port published on the machine (two samples would also collide on it), no fixed container
name (the same), no bind mount, build context, env_file, secret or config outside the project directory, and
no external network, volume, secret or config.
"""

from __future__ import annotations

import os
from typing import Any

HOST_MODES = ("pid", "ipc", "uts", "userns_mode", "cgroup")
FORBIDDEN_SET = ("cap_add", "devices", "device_cgroup_rules", "security_opt", "container_name", "runtime")


def refusal(config: dict[str, Any], directory: str) -> str | None:
    """Why the project cannot run here (one line), or None."""
    root = os.path.realpath(directory)
    services = config.get("services") or {}
    if not isinstance(services, dict) or not services:
        return "it defines no service"
    for name, service in services.items():
        if not isinstance(service, dict):
            return f"service {name!r} is not a mapping"
        why = _service(service, root)
        if why:
            return f"service {name!r} {why}"
    for kind in ("networks", "volumes", "secrets", "configs"):
        for name, item in (config.get(kind) or {}).items():
            if isinstance(item, dict) and item.get("external"):
                return f"{kind[:-1]} {name!r} is external (only the sample's own may be used)"
            source = item.get("file") if isinstance(item, dict) else None
            if source and not _inside(source, root):
                return f"{kind[:-1]} {name!r} reads {source}, outside the task's environment/"
    return None


def _service(service: dict, root: str) -> str | None:
    if service.get("privileged"):
        return "is privileged"
    for key in FORBIDDEN_SET:
        if service.get(key):
            return f"sets {key} (not allowed: it reaches beyond the sample's own containers)"
    for key in HOST_MODES:
        if str(service.get(key) or "").startswith("host"):
            return f"shares the machine's {key.split('_')[0]} namespace"
    network_mode = str(service.get("network_mode") or "")
    if network_mode == "host" or network_mode.startswith("container:"):
        return f"has network_mode {network_mode!r} (only the sample's own networks may be used)"
    for port in service.get("ports") or ():
        published = port.get("published") if isinstance(port, dict) else str(port)
        if published not in (None, ""):
            return "publishes a port on this machine (use expose: the other services reach it by name)"
    for volume in service.get("volumes") or ():
        if isinstance(volume, dict) and volume.get("type") == "bind" and not _inside(volume.get("source") or "", root):
            return f"bind-mounts {volume.get('source')}, outside the task's environment/"
    build = service.get("build")
    if isinstance(build, dict):
        context = str(build.get("context") or "")
        if "://" in context or context.startswith("git@") or not _inside(context, root):
            return f"builds from {context}, outside the task's environment/"
    for env_file in service.get("env_file") or ():
        path = env_file.get("path") if isinstance(env_file, dict) else env_file
        if path and not _inside(str(path), root):
            return f"reads env_file {path}, outside the task's environment/"
    return None


def _inside(path: str, root: str) -> bool:
    if not path:
        return False
    real = os.path.realpath(os.path.join(root, path))
    return real == root or real.startswith(root + os.sep)
