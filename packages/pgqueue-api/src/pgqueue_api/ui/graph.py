"""The workflow page's drawing: a graph of dependencies laid out in layers, left to
right, as plain numbers for the template to draw as SVG (no JavaScript, no external
program).

Each job goes in the column after its farthest dependency (the longest path from a job
with none), so every edge points right. Within a column, jobs are ordered by the mean
position of their neighbours in the columns before, then after (a few sweeps of the
barycenter heuristic), which keeps most edges short and uncrossed, and each job is
placed level with its dependencies where its column leaves room. Everything a job shows (its task is user text) goes through the
template, which escapes it; here it is only cut to fit its box.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

from pgqueue import Workflow, WorkflowJob

NODE_WIDTH = 160
NODE_HEIGHT = 30
ROW_HEIGHT = 40
COLUMN_GAP = 40
MARGIN = 24
LABEL_CHARS = 20
"""A box shows this many characters of ``#id task``; its tooltip shows all of it."""
SWEEPS = 4


@dataclass
class Node:
    """A job's box: its top-left corner and what it shows."""

    job: WorkflowJob
    x: float
    y: float
    label: str
    title: str
    focus: bool
    width: int = NODE_WIDTH
    height: int = NODE_HEIGHT

    @property
    def state(self) -> str:
        """The job's state, ``pruned`` for a job that no longer exists."""
        return self.job.state.value if self.job.state else "pruned"


@dataclass
class Edge:
    """A link from a dependency (left) to its dependent (right), as an SVG path."""

    dependency: int
    dependent: int
    path: str
    focus: bool


@dataclass
class Drawing:
    """A workflow laid out: boxes, edges, and the size of the picture."""

    nodes: list[Node] = field(default_factory=list)
    edges: list[Edge] = field(default_factory=list)
    width: float = 0
    height: float = 0
    columns: int = 0


def layers(workflow: Workflow) -> list[list[int]]:
    """The jobs of ``workflow`` in columns: each job one column after its farthest
    dependency. A cycle (which the enqueue cannot make) would leave jobs unplaced: they
    go in a last column rather than loop."""
    ids = [job.id for job in workflow.jobs]
    parents = {job.id: [d for d in job.depends_on if d != job.id] for job in workflow.jobs}
    children: dict[int, list[int]] = defaultdict(list)
    for child, dependencies in parents.items():
        for parent in dependencies:
            children[parent].append(child)
    unmet = {job_id: len(parents[job_id]) for job_id in ids}
    column = dict.fromkeys(ids, 0)
    ready = [job_id for job_id in ids if unmet[job_id] == 0]
    placed: set[int] = set()
    while ready:
        job_id = ready.pop()
        placed.add(job_id)
        for child in children[job_id]:
            column[child] = max(column[child], column[job_id] + 1)
            unmet[child] -= 1
            if unmet[child] == 0:
                ready.append(child)
    last = max(column.values(), default=0) + 1
    for job_id in ids:
        if job_id not in placed:
            column[job_id] = last
    result: list[list[int]] = [[] for _ in range(max(column.values(), default=0) + 1)]
    for job_id in ids:
        result[column[job_id]].append(job_id)
    return [layer for layer in result if layer]


def _barycenters(
    column: list[int], neighbours: dict[int, list[int]], where: dict[int, float]
) -> list[int]:
    """``column`` sorted by the mean place of each job's ``neighbours`` (its own place
    for one without any), ties kept in their order."""

    def key(item: tuple[int, int]) -> tuple[float, int]:
        index, job_id = item
        linked = [where[n] for n in neighbours.get(job_id, ()) if n in where]
        return (sum(linked) / len(linked) if linked else where[job_id]), index

    return [job_id for _, job_id in sorted(enumerate(column), key=key)]


def _order(columns: list[list[int]], workflow: Workflow) -> list[list[int]]:
    """``columns`` with each one reordered to bring linked jobs level."""
    parents = {job.id: list(job.depends_on) for job in workflow.jobs}
    children: dict[int, list[int]] = defaultdict(list)
    for job in workflow.jobs:
        for parent in job.depends_on:
            children[parent].append(job.id)
    columns = [sorted(column) for column in columns]
    for sweep in range(SWEEPS):
        forward = sweep % 2 == 0
        indexes = range(1, len(columns)) if forward else range(len(columns) - 2, -1, -1)
        for index in indexes:
            # Centred places, so that columns of different heights compare.
            where = {
                job_id: n - (len(column) - 1) / 2
                for column in columns
                for n, job_id in enumerate(column)
            }
            columns[index] = _barycenters(columns[index], parents if forward else children, where)
    return columns


def _label(job: WorkflowJob) -> str:
    text = f"#{job.id} {job.task if job.task is not None else '(pruned)'}"
    return text if len(text) <= LABEL_CHARS else text[: LABEL_CHARS - 1] + "…"


def _title(job: WorkflowJob) -> str:
    if job.state is None:
        return f"Job {job.id}: pruned"
    title = f"Job {job.id}: {job.task} in {job.queue}, {job.state.value}"
    if job.more_dependencies:
        title += f"; {job.more_dependencies} more dependencies not shown"
    if job.more_dependents:
        title += f"; {job.more_dependents} more dependents not shown"
    return title


def _packed(wanted: list[float]) -> list[float]:
    """Rows as near as they can be to ``wanted``, in order, at least one row apart: the
    least-squares answer (pool adjacent violators): jobs that would overlap form a
    block, centred on the mean of what its jobs want."""
    blocks: list[list[float]] = []  # [sum of wanted, count]
    for value in wanted:
        blocks.append([value, 1])
        while len(blocks) > 1:
            total, count = blocks[-1]
            before_total, before_count = blocks[-2]
            top = total / count - (count - 1) / 2
            before_bottom = before_total / before_count + (before_count - 1) / 2
            if before_bottom + 1 <= top:
                break
            blocks[-2:] = [[before_total + total, before_count + count]]
    rows: list[float] = []
    for total, count in blocks:
        top = total / count - (count - 1) / 2
        rows += [top + n for n in range(int(count))]
    return rows


def _rows(columns: list[list[int]], workflow: Workflow) -> dict[int, float]:
    """Each job's row (its vertical place, in rows, maybe fractional): level with the
    mean of its dependencies (first, left to right), then of all its links (right to
    left), as near as its column leaves room. So a job that gathers many sits beside
    them, and a short column stays next to what it links to, not at the top of a tall
    one."""
    parents = {job.id: list(job.depends_on) for job in workflow.jobs}
    linked: dict[int, list[int]] = {job_id: list(ids) for job_id, ids in parents.items()}
    for job in workflow.jobs:
        for parent in job.depends_on:
            linked.setdefault(parent, []).append(job.id)
    row = {job_id: float(n) for column in columns for n, job_id in enumerate(column)}

    def place(column: list[int], neighbours: dict[int, list[int]]) -> None:
        wanted = []
        for job_id in column:
            near = [row[n] for n in neighbours.get(job_id, ()) if n in row]
            wanted.append(sum(near) / len(near) if near else row[job_id])
        row.update(zip(column, _packed(wanted), strict=True))

    for column in columns[1:]:
        place(column, parents)
    for column in reversed(columns[:-1]):
        place(column, linked)
    top = min(row.values(), default=0.0)
    return {job_id: value - top for job_id, value in row.items()}


def draw(workflow: Workflow) -> Drawing:
    """``workflow`` laid out in columns, left to right."""
    columns = _order(layers(workflow), workflow)
    rows = _rows(columns, workflow)
    jobs = {job.id: job for job in workflow.jobs}
    drawing = Drawing(columns=len(columns))
    boxes: dict[int, Node] = {}
    for index, column in enumerate(columns):
        x = MARGIN + index * (NODE_WIDTH + COLUMN_GAP)
        for job_id in column:
            job = jobs[job_id]
            node = Node(
                job,
                x,
                round(MARGIN + rows[job_id] * ROW_HEIGHT, 1),
                _label(job),
                _title(job),
                job_id == workflow.job_id,
            )
            boxes[job_id] = node
            drawing.nodes.append(node)
    for dependency, dependent in workflow.edges:
        start, end = boxes[dependency], boxes[dependent]
        x1, y1 = start.x + NODE_WIDTH, start.y + NODE_HEIGHT / 2
        x2, y2 = end.x, end.y + NODE_HEIGHT / 2
        if x2 <= x1:
            continue  # only a hand-made cycle points back: its job sits in a last column
        bend = max(COLUMN_GAP / 2, (x2 - x1) / 3)
        path = f"M{x1:g},{y1:g} C{x1 + bend:g},{y1:g} {x2 - bend:g},{y2:g} {x2 - 6:g},{y2:g}"
        focus = workflow.job_id in (dependency, dependent)
        drawing.edges.append(Edge(dependency, dependent, path, focus))
    tallest = max(rows.values(), default=-1.0) + 1
    drawing.width = 2 * MARGIN + max(len(columns) * (NODE_WIDTH + COLUMN_GAP) - COLUMN_GAP, 0)
    drawing.height = round(
        2 * MARGIN + max(tallest * ROW_HEIGHT - (ROW_HEIGHT - NODE_HEIGHT), 0), 1
    )
    return drawing
