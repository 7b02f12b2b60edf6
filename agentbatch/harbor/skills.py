"""A task's agent skills ([environment] skills_dir): listed in the agent's prompt as Harbor's own agent lists them.

Harbor hands `skills_dir`, a directory inside the task's environment, to its agent; its Terminus-2 agent finds
each `<skills_dir>/<skill>/SKILL.md` there, reads the `name` and `description` of its YAML front matter, and adds
an `<available_skills>` block (each skill's name, description and the SKILL.md's path, for the model to `cat`)
to the instruction (harbor agents/terminus_2/terminus_2.py, `_build_skills_section`). This does the same, in the
sample's container, before the agent's first model call. A directory that is not there, or holds no skill with
both fields, adds nothing, as in Harbor.
"""

from __future__ import annotations

import re
import shlex
from xml.etree.ElementTree import Element, SubElement, indent, tostring

import yaml

from agentbatch.harbor import container
from agentbatch.sandboxes.base import Sandbox

MOST_SKILLS = 100  # a task's skills listed at most (the prompt stays bounded)
SKILL_BYTES = 64 * 1024  # of each SKILL.md read: its front matter is at its start
_FRONT_MATTER = re.compile(r"^---\n(.*?)\n---", re.DOTALL)


def section(sandbox: Sandbox, skills_dir: str) -> str:
    """The `<available_skills>` block for the skills in `skills_dir` of the sample's container, "" if none."""
    where = shlex.quote(skills_dir)
    listed = container.exec_as(
        sandbox,
        f"[ -d {where} ] && find {where} -mindepth 2 -maxdepth 2 -name SKILL.md -type f | sort | head -n {MOST_SKILLS}",
        timeout=10,
    )
    entries = []
    for path in listed.output.splitlines() if listed.exit_code == 0 else ():
        read = container.exec_as(sandbox, f"head -c {SKILL_BYTES} {shlex.quote(path)}", timeout=10)
        found = front_matter(read.output) if read.exit_code == 0 else None
        if found is not None:
            entries.append((*found, path))
    if not entries:
        return ""
    root = Element("available_skills")
    for name, description, location in entries:
        skill = SubElement(root, "skill")
        SubElement(skill, "name").text = name
        SubElement(skill, "description").text = description
        SubElement(skill, "location").text = location
    indent(root, space="  ")
    return "\n" + tostring(root, encoding="unicode")


def front_matter(text: str) -> tuple[str, str] | None:
    """A SKILL.md's name and description (its YAML front matter's), None unless it has both, as text."""
    match = _FRONT_MATTER.match(text)
    if not match:
        return None
    try:
        fields = yaml.safe_load(match.group(1))
    except yaml.YAMLError:
        return None
    if not isinstance(fields, dict):
        return None
    name, description = fields.get("name"), fields.get("description")
    # Text only: a number is written as text, anything else (a list, aliases of aliases) is no skill.
    if not all(isinstance(v, (str, int, float)) and not isinstance(v, bool) for v in (name, description)):
        return None
    return str(name), str(description)
