"""``pgqueue enqueue --tag`` and what ``pgqueue job`` shows of tags and progress, run as
real processes."""

import json

from test_cli import run

from pgqueue import Lease, Queue, WorkerProtocol


def test_enqueue_takes_repeated_tags_and_job_shows_them_and_the_progress(
    database_url: str, schema: str, queue: Queue
) -> None:
    db = ["--database-url", database_url, "--schema", schema]
    out = run("enqueue", "echo", "--tag", "nightly", "--tag", "eu", "--queue", "cli", *db)
    assert out.returncode == 0, out.stderr
    job = json.loads(out.stdout)["job"]
    assert job["tags"] == ["nightly", "eu"] and job["progress"] is None
    assert [j.id for j in queue.list(tags=["eu"]).jobs] == [job["id"]]

    protocol = WorkerProtocol(queue)
    [claimed] = protocol.claim(["cli"], ["echo"], 1)
    assert claimed.lease_token is not None
    protocol.write_progress([(Lease(claimed.id, claimed.lease_token), 0.75, "3 of 4")])
    shown = json.loads(run("job", str(job["id"]), *db).stdout)
    assert shown["tags"] == ["nightly", "eu"]
    assert shown["progress"]["fraction"] == 0.75 and shown["progress"]["message"] == "3 of 4"
    assert shown["progress"]["at"]
    untagged = json.loads(run("enqueue", "echo", *db).stdout)["job"]
    assert untagged["tags"] == []


def test_bad_tags_get_one_line_errors(database_url: str, schema: str) -> None:
    db = ["--database-url", database_url, "--schema", schema]
    for args, message in (
        (["--tag", "x" * 65], "tags: must hold tags of at most 64 characters"),
        (["--tag", ""], "tags: must not hold an empty tag"),
        ([arg for i in range(17) for arg in ("--tag", f"t{i}")], "at most 16 tags"),
    ):
        result = run("enqueue", "echo", *args, *db)
        assert result.returncode != 0 and message in result.stderr, result.stderr
        assert "Traceback" not in result.stderr
