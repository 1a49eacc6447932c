"""Tags and payload search through the library: every producer takes tags, and
``Queue.list`` finds exactly the jobs carrying them or whose payload contains a value,
refusing what is not a tag or a JSON object."""

from __future__ import annotations

import asyncio

import pytest

from pgqueue import AsyncProducer, JobSpec, Queue, ValidationError


def test_every_producer_takes_tags_and_list_finds_them(queue: Queue) -> None:
    plain = queue.enqueue("t", {"n": 1}, tags=["x"]).job
    keyed = queue.enqueue("t", {"n": 2}, tags=["x", "y"], idempotency_key="k").job
    [spec_job] = [r.job for r in queue.enqueue_many([JobSpec("t", {"n": 3}, tags=("y",))])]

    async def produce() -> int:
        producer = await AsyncProducer.open(queue)
        try:
            return (await producer.enqueue("t", {"n": 4}, tags=["x", "z"])).job.id
        finally:
            await producer.close()

    async_id = asyncio.run(produce())
    assert queue.get(async_id).tags == ["x", "z"]
    assert [j.id for j in queue.list(tags=["x"]).jobs] == [async_id, keyed.id, plain.id]
    assert [j.id for j in queue.list(tags=["y"]).jobs] == [spec_job.id, keyed.id]
    assert [j.id for j in queue.list(tags=["x", "y"]).jobs] == [keyed.id]
    assert [j.id for j in queue.list(payload_contains={"n": 3}).jobs] == [spec_job.id]
    assert [j.id for j in queue.list(payload_contains='{"n": 2}').jobs] == [keyed.id]
    # {} is contained in every payload: no filter.
    assert len(queue.list(payload_contains={}).jobs) == 4


@pytest.mark.parametrize(
    ("arguments", "field"),
    [
        ({"tags": "x"}, "tag"),
        ({"tags": ["x" * 65]}, "tag"),
        ({"payload_contains": "{nope"}, "payload_contains"),
        ({"payload_contains": "[1]"}, "payload_contains"),
    ],
)
def test_list_refuses_what_is_not_a_filter(queue: Queue, arguments, field) -> None:
    with pytest.raises(ValidationError) as refused:
        queue.list(**arguments)
    assert refused.value.field == field


def test_specs_refuse_bad_tags() -> None:
    for tags in (["\ud800"], ["a\x00"], [""], [f"t{n}" for n in range(17)], [3]):
        with pytest.raises(ValidationError) as refused:
            JobSpec("t", tags=tags)
        assert refused.value.field == "tags"
    assert JobSpec("t", tags=["b", "a", "b"]).tags == ("b", "a")
