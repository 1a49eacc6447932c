"""Declaring schedules: the hook, what registration refuses (in one line naming the
schedule and its plugin), and ``pgqueue worker`` refusing to start with that line."""

from __future__ import annotations

import inspect
import subprocess
import types
from pathlib import Path

import pytest
from processes import environment, pgqueue_command

from pgqueue import hookimpl, hookspecs
from pgqueue.plugins import get_plugin_manager
from pgqueue.schedules import Schedule, ScheduleError, collect_schedules

HERE = Path(__file__).resolve().parent


def plugin_declaring(*declarations: tuple[tuple, dict]) -> types.SimpleNamespace:
    @hookimpl
    def register_schedules(register):
        for args, kwargs in declarations:
            register(*args, **kwargs)

    return types.SimpleNamespace(register_schedules=register_schedules)


def collect(**plugins: types.SimpleNamespace) -> dict[str, Schedule]:
    pm = get_plugin_manager(load_entrypoints=False)
    for name, plugin in plugins.items():
        pm.register(plugin, name=name)
    return collect_schedules(pm)


def test_the_hook_is_documented_and_takes_register() -> None:
    spec = hookspecs.register_schedules
    assert "register(name, cron, task" in inspect.getdoc(spec)
    assert list(inspect.signature(spec).parameters) == ["register"]


def test_declarations_are_collected_with_their_plugin_and_defaults() -> None:
    found = collect(
        reports=plugin_declaring(
            (("nightly", "30 2 * * *", "report"), {"timezone": "Europe/Berlin"}),
            (
                ("often", "*/10 * * * * *", "ping"),
                {"payload": {"a": 1}, "queue": "q", "priority": 3, "max_attempts": 2},
            ),
        )
    )
    assert found["nightly"] == Schedule(
        "nightly", "30 2 * * *", "report", timezone="Europe/Berlin", source="reports"
    )
    often = found["often"]
    assert (often.payload, often.queue, often.priority, often.max_attempts) == ({"a": 1}, "q", 3, 2)
    assert found["nightly"].job_max_attempts() == 5


@pytest.mark.parametrize(
    ("args", "kwargs", "message"),
    [
        (("s", "61 * * * *", "t"), {}, "invalid cron expression '61 * * * *'"),
        (("s", "* * *", "t"), {}, "5 fields (minute hour day month weekday), or 6"),
        (("s", "* * * * * * *", "t"), {}, "or 6 with a leading seconds field"),
        (("s", "0 0 30 2 *", "t"), {}, "cron expression '0 0 30 2 *' never fires"),
        (("s", "* * * * *", "t"), {"timezone": "Mars/Olympus"}, "unknown time zone 'Mars/Olympus'"),
        (("s", "* * * * *", "bad task"), {}, "task: may contain only"),
        (("s", "* * * * *", "t"), {"payload": [1]}, "payload: must be a JSON object"),
        (("bad name", "* * * * *", "t"), {}, "name: may contain only"),
    ],
)
def test_a_declaration_that_cannot_work_fails_in_one_line(args, kwargs, message) -> None:
    with pytest.raises(ScheduleError) as raised:
        collect(mine=plugin_declaring((args, kwargs)))
    text = str(raised.value)
    assert message in text and "\n" not in text
    assert text.startswith(f"schedule {args[0]!r} of plugin mine: ")


def test_a_name_declared_twice_fails_naming_both_plugins() -> None:
    declaration = (("nightly", "0 3 * * *", "t"), {})
    with pytest.raises(
        ScheduleError, match="'nightly' is declared twice: by plugin a and by plugin b"
    ):
        collect(a=plugin_declaring(declaration), b=plugin_declaring(declaration))
    with pytest.raises(ScheduleError, match="'nightly' is declared twice by plugin a"):
        collect(a=plugin_declaring(declaration, declaration))


def test_the_example_plugin_declares_a_schedule() -> None:
    found = collect_schedules(get_plugin_manager())
    assert found["examples-weekly-echo"].source == "examples"
    assert found["examples-weekly-echo"].task == "echo"


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"PGQUEUE_TEST_SCHEDULES": "bad=61 * * * *"}, "invalid cron expression '61 * * * *'"),
        (
            {"PGQUEUE_TEST_SCHEDULES": "s=* * * * *", "PGQUEUE_TEST_SCHEDULE_TIMEZONE": "No/Where"},
            "unknown time zone 'No/Where'",
        ),
        (
            {"PGQUEUE_TEST_SCHEDULES": "s=* * * * *", "PGQUEUE_TEST_SCHEDULE_DUPLICATE": "1"},
            "'s' is declared twice by plugin schedule_test_plugin",
        ),
    ],
)
def test_the_worker_refuses_to_start_with_the_line(
    env: dict[str, str], message: str, database_url: str, schema: str
) -> None:
    result = subprocess.run(
        [
            *pgqueue_command(),
            "worker",
            "--plugin",
            "schedule_test_plugin",
            "--no-plugin-autoload",
            "--database-url",
            database_url,
            "--schema",
            schema,
        ],
        env=environment(HERE, **env),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 1, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: not starting: schedule "), lines
    assert message in lines[0]
