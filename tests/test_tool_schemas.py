"""The function schemas the model is offered, as declared by the tools, are pinned byte for byte.

A trajectory's `tools` field is what a trainer learns the tool interface from: a change to any tool's
name, description or parameters must be deliberate (update tests/fixtures/tool_schemas.json with it).
"""

import json
from pathlib import Path

from agentbatch.tools.registry import load_tools

GOLDEN = Path(__file__).parent / "fixtures" / "tool_schemas.json"


def test_every_tool_schema_is_byte_for_byte_the_pinned_one():
    schemas = [t.schema() for t in load_tools().values()]
    pinned = json.loads(GOLDEN.read_text(encoding="utf-8"))
    assert [s["function"]["name"] for s in schemas] == [s["function"]["name"] for s in pinned]
    for ours, theirs in zip(schemas, pinned, strict=True):
        assert json.dumps(ours, ensure_ascii=False) == json.dumps(theirs, ensure_ascii=False)
