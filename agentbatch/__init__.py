"""The batch runner's package. Its public API for plug-ins (docs/plugins.md), importable from here:

    from agentbatch import tool, ToolContext      # your own tools (docs/tools.md)
    from agentbatch import Sandbox, ExecResult    # the sandbox a tool gets (docs/sandboxes.md)
    from agentbatch import dataset_format, Entry  # your own dataset formats (docs/datasets.md)
    from agentbatch import TaskHooks, HookContext, CheckResult, TaskLimits, ImageBuild, Resources, RunContext
    from agentbatch import Egress, ComposeProject  # a sample's egress policy, its several containers
    from agentbatch import register_model, Model, Reply, ScriptedModel   # models without an endpoint
    from agentbatch import Rollouts                # rollouts on demand for a training loop (docs/rollouts.md)

The names are looked up when first used, so importing one part of the package does not import them all.
"""

from __future__ import annotations

import importlib

_PUBLIC = {
    "tool": "agentbatch.tools.registry",
    "ToolContext": "agentbatch.tools.context",
    "Sandbox": "agentbatch.sandboxes.base",
    "ExecResult": "agentbatch.sandboxes.base",
    "dataset_format": "agentbatch.dataset_formats",
    "DatasetError": "agentbatch.dataset",
    "Entry": "agentbatch.dataset",
    "TaskHooks": "agentbatch.task_hooks",
    "HookContext": "agentbatch.task_hooks",
    "CheckResult": "agentbatch.verification",
    "TaskLimits": "agentbatch.limits",
    "ImageBuild": "agentbatch.sandboxes.base",
    "Resources": "agentbatch.sandboxes.base",
    "Egress": "agentbatch.sandboxes.base",
    "ComposeProject": "agentbatch.sandboxes.base",
    "RunContext": "agentbatch.dataset_steps",
    "register_model": "agentbatch.model.registry",
    "Model": "agentbatch.model.base",
    "Reply": "agentbatch.model.base",
    "ModelCallError": "agentbatch.model.base",
    "ScriptedModel": "agentbatch.model.scripted",
    "Rollouts": "agentbatch.rollouts",
}
__all__ = sorted(_PUBLIC)


def __getattr__(name: str):
    module = _PUBLIC.get(name)
    if module is None:
        raise AttributeError(f"module 'agentbatch' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
