"""The graph of dependencies around a job, read by ``Queue.workflow`` in one recursive
statement, and a job's direct neighbours with their states (``Queue.neighbours``), on
real PostgreSQL: ancestors and descendants only, links between them, finished and pruned
jobs, the size limit and how a cut shows, and a hand-made cycle that must not loop."""

from __future__ import annotations

import psycopg
import pytest
from psycopg import sql

from pgqueue import JobNotFound, JobSpec, JobState, Queue, ValidationError, WorkerProtocol


def _succeed(queue: Queue, job_id: int) -> None:
    protocol = WorkerProtocol(queue)
    [job] = protocol.claim(["default"], ["step"])
    assert job.id == job_id
    protocol.ack(job, {"ok": True})


def test_the_workflow_holds_every_ancestor_and_descendant_and_their_links(queue: Queue):
    # a -> b -> d, a -> c -> d, d -> e; and x -> c, unrelated to b; y depends on a alone.
    a = queue.enqueue("step", {}).job.id
    x = queue.enqueue("step", {}).job.id
    b = queue.enqueue("step", {}, depends_on=[a]).job.id
    c = queue.enqueue("step", {}, depends_on=[a, x]).job.id
    d = queue.enqueue("step", {}, depends_on=[b, c]).job.id
    e = queue.enqueue("step", {}, depends_on=[d]).job.id
    y = queue.enqueue("step", {}, depends_on=[a]).job.id
    _succeed(queue, a)

    around_b = queue.workflow(b)
    assert [job.id for job in around_b.jobs] == [a, b, d, e]  # not c, x or y: no path to b
    assert sorted(around_b.edges) == sorted([(a, b), (b, d), (d, e)])
    assert not around_b.truncated
    states = {job.id: job.state for job in around_b.jobs}
    assert states == {
        a: JobState.SUCCEEDED,
        b: JobState.QUEUED,
        d: JobState.WAITING,
        e: JobState.WAITING,
    }

    around_d = queue.workflow(d)
    assert {job.id for job in around_d.jobs} == {a, b, c, x, d, e}
    assert sorted(around_d.edges) == sorted([(a, b), (a, c), (x, c), (b, d), (c, d), (d, e)])

    around_a = queue.workflow(a)
    assert {job.id for job in around_a.jobs} == {a, b, c, d, e, y}
    # c's other dependency, x, is neither an ancestor nor a descendant of a: left out,
    # and not a cut (the limit was not reached).
    assert (x, c) not in around_a.edges
    assert not around_a.truncated
    assert next(job for job in around_a.jobs if job.id == c).depends_on == (a,)


def test_a_job_without_links_is_a_workflow_of_one_and_a_missing_job_is_not_found(
    queue: Queue,
):
    alone = queue.enqueue("step", {"note": "<b>"}).job
    workflow = queue.workflow(alone.id)
    assert [(job.id, job.task, job.queue) for job in workflow.jobs] == [
        (alone.id, "step", "default")
    ]
    assert workflow.edges == []
    with pytest.raises(JobNotFound):
        queue.workflow(alone.id + 1000)
    with pytest.raises(ValidationError):
        queue.workflow(alone.id, limit=0)


def test_a_large_workflow_is_cut_nearest_first_and_says_where(queue: Queue):
    # A chain of 30: from its middle, a limit of 5 keeps the 5 nearest each way.
    chain = [queue.enqueue("step", {}).job.id]
    for _ in range(29):
        chain.append(queue.enqueue("step", {}, depends_on=[chain[-1]]).job.id)
    middle = 15
    workflow = queue.workflow(chain[middle], limit=5)
    assert [job.id for job in workflow.jobs] == chain[middle - 5 : middle + 6]
    assert workflow.truncated
    cut = {job.id: (job.more_dependencies, job.more_dependents) for job in workflow.jobs}
    assert cut[chain[middle - 5]] == (1, 0)
    assert cut[chain[middle + 5]] == (0, 1)
    assert all(cut[i] == (0, 0) for i in chain[middle - 4 : middle + 5])

    # A fan-out of 120 from a root, seen from the root with the default limit (100).
    root = queue.enqueue("step", {}).job.id
    queue.enqueue_many([JobSpec("step", {"n": n}, depends_on=[root]) for n in range(120)])
    fan = queue.workflow(root)
    assert len(fan.jobs) == 101 and len(fan.edges) == 100
    assert fan.truncated
    [root_job] = [job for job in fan.jobs if job.id == root]
    assert root_job.more_dependents == 20

    # Exactly at the limit: everything is there, nothing is cut.
    exact = queue.workflow(root, limit=120)
    assert len(exact.jobs) == 121 and not exact.truncated


def test_a_pruned_dependency_shows_without_task_or_state(queue: Queue, db, schema: str):
    first = queue.enqueue("step", {}).job.id
    second = queue.enqueue("step", {}, depends_on=[first]).job.id
    _succeed(queue, first)
    # Prune the dependency alone, as a retention period shorter than its dependent's
    # life does: the dependent keeps its link.
    db.execute(
        sql.SQL("DELETE FROM {}.finished_jobs WHERE id = %s").format(sql.Identifier(schema)),
        (first,),
    )
    workflow = queue.workflow(second)
    pruned = next(job for job in workflow.jobs if job.id == first)
    assert (pruned.task, pruned.queue, pruned.state) == (None, None, None)
    assert workflow.edges == [(first, second)]
    neighbours = queue.neighbours(second)
    assert [(job.id, job.state) for job in neighbours.depends_on] == [(first, None)]


def test_a_cycle_made_by_hand_does_not_loop(queue: Queue, db: psycopg.Connection, schema: str):
    a = queue.enqueue("step", {}).job.id
    b = queue.enqueue("step", {}, depends_on=[a]).job.id
    c = queue.enqueue("step", {}, depends_on=[b]).job.id
    # The enqueue cannot close a cycle (a job names only jobs that exist before it); a
    # hand-made link can, and the walk must still end.
    db.execute(
        sql.SQL("INSERT INTO {}.job_dependencies (depends_on, job_id) VALUES (%s, %s)").format(
            sql.Identifier(schema)
        ),
        (c, a),
    )
    workflow = queue.workflow(b)
    assert {job.id for job in workflow.jobs} == {a, b, c}
    assert sorted(workflow.edges) == sorted([(a, b), (b, c), (c, a)])
    assert not workflow.truncated


def test_neighbours_are_bounded_with_their_states_and_totals(queue: Queue):
    parents = [job.job.id for job in queue.enqueue_many([JobSpec("step", {}) for _ in range(7)])]
    child = queue.enqueue("fan_in", {}, depends_on=parents).job.id
    neighbours = queue.neighbours(child, limit=5)
    assert [job.id for job in neighbours.depends_on] == parents[:5]
    assert {job.state for job in neighbours.depends_on} == {JobState.QUEUED}
    assert (neighbours.depends_on_total, neighbours.dependents_total) == (7, 0)
    assert neighbours.dependents == []
    up = queue.neighbours(parents[0])
    assert [(job.id, job.task, job.state) for job in up.dependents] == [
        (child, "fan_in", JobState.WAITING)
    ]
    none = queue.neighbours(child + 1000)
    assert none == type(none)([], [], 0, 0)
