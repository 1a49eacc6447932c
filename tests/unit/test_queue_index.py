"""The library page's index of Queue lists every public method of pgqueue.Queue, each
once, with the module that defines it (docs/design.md says why Queue is one namespace,
and this is what keeps its methods findable)."""

from __future__ import annotations

import re
from pathlib import Path

from pgqueue import Queue

ROOT = Path(__file__).resolve().parents[2]
ROW = re.compile(r"^\| (\w+) \| `(\w+)` \| [^|]+ \| `([\w.]+)` \|$", re.MULTILINE)


def defining_modules() -> dict[str, str]:
    """Each public method or property of Queue, and the module of the class defining it."""
    found = {}
    for name in dir(Queue):
        if name.startswith("_"):
            continue
        owner = next(cls for cls in Queue.__mro__ if name in cls.__dict__)
        if owner is not object:
            found[name] = owner.__module__
    return found


def test_every_public_method_of_queue_is_in_the_index_with_its_module() -> None:
    text = (ROOT / "docs" / "library.md").read_text()
    rows = ROW.findall(text.split("## Every method of Queue", 1)[1].split("\n## ", 1)[0])
    listed = [name for _, name, _ in rows]
    assert len(listed) == len(set(listed)), "a method is listed twice"
    assert {name: module for _, name, module in rows} == defining_modules()
