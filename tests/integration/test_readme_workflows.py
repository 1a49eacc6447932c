"""The README's Workflows section runs as written: its plugin saved as
``workflows.py``, its commands run by bash in that folder, with a real burst worker,
on this test's schema; the jobs end with the results its comments give."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

from pgqueue import JobState, Queue

ROOT = Path(__file__).resolve().parents[2]


def _blocks(language: str) -> list[str]:
    text = (ROOT / "README.md").read_text()
    section = text[text.index("## Workflows\n") :]
    section = section[: section.index("\n## ", 1)]
    return re.findall(rf"```{language}\n(.*?)```", section, re.S)


def test_the_readme_workflows_run_as_written(
    tmp_path: Path, database_url: str, schema: str, queue: Queue
) -> None:
    [plugin] = _blocks("python")
    [commands] = _blocks("sh")
    (tmp_path / "workflows.py").write_text(plugin)
    # The commands name the quickstart's .venv, relative to where they run.
    (tmp_path / ".venv").symlink_to(Path(sys.executable).parent.parent)
    env = {**os.environ, "DATABASE_URL": database_url, "PGQUEUE_SCHEMA": schema}
    script = commands + '\necho "ids $pipeline $callback"\n'
    ran = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", script],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert ran.returncode == 0, ran.stderr
    pipeline, callback = map(int, ran.stdout.strip().splitlines()[-1].split()[1:])
    assert queue.get(pipeline).state is JobState.SUCCEEDED
    assert queue.get(pipeline).result == {"sum": 42, "states": ["succeeded"]}
    assert queue.get(callback).result == {
        "sum": 6,
        "states": ["succeeded", "succeeded", "succeeded", "dead"],
    }
    # What the comments say `pgqueue job` prints.
    for job_id, name in ((pipeline, "$pipeline"), (callback, "$callback")):
        [line] = [line for line in commands.splitlines() if f'pgqueue job "{name}"' in line]
        expected = json.loads("{" + line.split("# ", 1)[1] + "}")
        assert queue.get(job_id).result == expected["result"]
