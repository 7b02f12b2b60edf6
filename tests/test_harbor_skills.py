"""A task's agent skills ([environment] skills_dir) through the real CLI, real Docker and a scripted endpoint: each
SKILL.md with a name and a description in the sample's container is listed after the instruction the model gets,
as Harbor's Terminus-2 agent lists it (docs/harbor.md); a skill without both, or a directory that is not there,
adds nothing."""

from __future__ import annotations

import pytest
from cli_helpers import RunDir
from harbor_helpers import BUSYBOX, by_task, harbor_run, nothing_left, write_task
from scripted_server import ScriptedServer

from agentbatch.harbor.skills import front_matter

pytestmark = pytest.mark.docker

SKILLS = (
    "RUN mkdir -p /skills/greet /skills/count /skills/broken /skills/deep/er\n"
    "RUN printf -- '---\\nname: greet\\ndescription: Say hello & wave <politely>\\n---\\nSay hello.\\n'"
    " > /skills/greet/SKILL.md\n"
    "RUN printf -- '---\\nname: count\\ndescription: Count to three\\n---\\n' > /skills/count/SKILL.md\n"
    "RUN printf -- 'no front matter\\n' > /skills/broken/SKILL.md\n"
    "RUN printf -- '---\\nname: too-deep\\ndescription: x\\n---\\n' > /skills/deep/er/SKILL.md\n"
)


def test_a_tasks_skills_are_listed_after_its_instruction(tmp_path, docker_images, docker_run_name):
    root = tmp_path / "tasks"
    dockerfile = {"environment/Dockerfile": f"FROM {BUSYBOX}\n{SKILLS}"}
    write_task(
        root,
        "skilled",
        "echo 1 > /logs/verifier/reward.txt\n",
        toml='[environment]\nskills_dir = "/skills"\n',
        files=dockerfile,
        image=None,
    )
    write_task(root, "absent", "echo 1 > /logs/verifier/reward.txt\n", toml='[environment]\nskills_dir = "/nowhere"\n')
    write_task(root, "plain", "echo 1 > /logs/verifier/reward.txt\n")
    out = tmp_path / "out"
    with ScriptedServer(default_script=[{"content": "done"}]) as srv:
        done = harbor_run(root, out, docker_run_name, "--require_reasoning=false", server=srv)
        sent = {r["messages"][-1]["content"].split(":")[0]: r["messages"][-1]["content"] for r in srv.requests()}

    assert done.returncode == 0, done.stderr
    assert "skills_dir" not in done.stderr  # applied: no warning
    skilled = sent["Task skilled"]
    assert skilled == (
        "Task skilled: do what the tests want.\n\n"
        "<available_skills>\n"
        "  <skill>\n"
        "    <name>count</name>\n"
        "    <description>Count to three</description>\n"
        "    <location>/skills/count/SKILL.md</location>\n"
        "  </skill>\n"
        "  <skill>\n"
        "    <name>greet</name>\n"
        "    <description>Say hello &amp; wave &lt;politely&gt;</description>\n"
        "    <location>/skills/greet/SKILL.md</location>\n"
        "  </skill>\n"
        "</available_skills>"
    )
    assert sent["Task absent"] == "Task absent: do what the tests want.\n"
    assert sent["Task plain"] == "Task plain: do what the tests want.\n"
    lines = by_task(RunDir(out / docker_run_name).trajectories())
    human = next(t["value"] for t in lines["skilled"]["conversations"] if t["from"] == "human")
    assert human == skilled  # the line records the prompt that was sent
    assert nothing_left(out / docker_run_name)


def test_front_matter_takes_text_fields_only():
    assert front_matter("---\nname: a\ndescription: b\n---\nbody") == ("a", "b")
    assert front_matter("---\nname: 7\ndescription: b\n---\n") == ("7", "b")
    assert front_matter("---\nname: a\n---\n") is None  # no description
    assert front_matter("---\nname: [a, b]\ndescription: b\n---\n") is None
    bomb = "---\na: &a [x, x, x, x, x, x, x, x, x]\nb: &b [*a, *a, *a, *a, *a, *a, *a, *a, *a]\nname: *b\ndescription: d\n---\n"
    assert front_matter(bomb) is None  # never expanded into text
    assert front_matter("---\nname: a\ndescription: [unclosed\n---\n") is None
    assert front_matter("name: a\ndescription: b\n") is None
