"""What the Parquet export writes, pinned: rows, row groups, report counts and dataset card of a deterministic run
(tests/export_pin_run.py), under several filters, exported alone and beside another format.

The fixture was written by the export before it was made fast; regenerate it only for an intended change of
output:  python tests/test_export_parquet_pin.py
"""

from __future__ import annotations

import hashlib
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from export_pin_run import write_pin_run  # noqa: E402

from agentbatch.export.common import Filters  # noqa: E402
from agentbatch.export.run_export import export  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
FIXTURE = Path(__file__).parent / "fixtures" / "export_parquet_pin.json"
SETTINGS = {
    "none": Filters(),
    "completed_min_turns": Filters(completed_only=True, min_turns=2),
    "no_partial_no_errors_web": Filters(no_partial=True, no_tool_errors=True, toolsets=("web",)),
    "passed_only": Filters(passed_only=True),
}
REPORT_KEYS = ("source", "filtered", "kept", "written", "shards", "row_by_row_batches")


def snapshot(run_dir: Path, filters: Filters, formats: tuple[str, ...] = ("parquet",)) -> dict:
    """Export, then what the export wrote: per row group its row count and a digest of its rows, the card."""
    report = export(run_dir, "pin", formats, filters)["parquet"]
    return written(run_dir, report)


def written(run_dir: Path, report: dict) -> dict:
    """What the last export of the run wrote (removed once read, for the next export)."""
    out = run_dir / "export" / "parquet"
    groups = []
    for path in sorted((out / "data").glob("*.parquet")):
        f = pq.ParquetFile(path)
        for i in range(f.num_row_groups):
            rows = f.read_row_group(i).to_pylist()
            text = "\n".join(json.dumps(r, sort_keys=True, ensure_ascii=False) for r in rows)
            groups.append([path.name, len(rows), hashlib.sha256(text.encode()).hexdigest()[:24]])
    # The digest of the files changes with Parquet's own bytes (its writer's version): the rows above pin them.
    card = re.sub(
        r"files sha256:[0-9a-f]{64}", "files sha256:<digest>", (out / "README.md").read_text(encoding="utf-8")
    )
    shutil.rmtree(run_dir / "export")
    return {"report": {k: report[k] for k in REPORT_KEYS}, "row_groups": groups, "card": card}


@pytest.fixture(scope="module")
def pin_run(tmp_path_factory) -> Path:
    return write_pin_run(tmp_path_factory.mktemp("pin") / "pin")


@pytest.mark.parametrize("setting", SETTINGS)
@pytest.mark.parametrize("formats", [("parquet",), ("openai", "parquet")], ids=["alone", "beside_openai"])
def test_parquet_export_writes_what_it_wrote_before(pin_run, setting, formats):
    expected = json.loads(FIXTURE.read_text(encoding="utf-8"))[setting]
    got = snapshot(pin_run, SETTINGS[setting], formats)
    assert got["report"] == expected["report"]
    assert got["row_groups"] == expected["row_groups"]
    assert got["card"] == expected["card"]


def test_without_msgspec_the_cli_exports_the_same(pin_run):
    """msgspec is optional: without it every line is parsed in Python, slower, and the output is the same."""
    blocked = (
        "import sys; sys.modules['msgspec'] = None; import batch_runner; "
        f"sys.argv = ['batch-runner', '--run_name=pin', '--output_dir={pin_run.parent}', '--export=parquet']; "
        "batch_runner.cli()"
    )
    done = subprocess.run([sys.executable, "-c", blocked], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    report = json.loads((pin_run / "export" / "report.json").read_text())["parquet"]
    expected = json.loads(FIXTURE.read_text(encoding="utf-8"))["none"]
    assert written(pin_run, report) == expected


def main() -> None:
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        run_dir = write_pin_run(Path(tmp) / "pin")
        doc = {name: snapshot(run_dir, filters) for name, filters in SETTINGS.items()}
    FIXTURE.write_text(json.dumps(doc, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    print(f"wrote {FIXTURE}")


if __name__ == "__main__":
    main()
