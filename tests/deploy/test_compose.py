"""docker-compose.yml and the Dockerfile agree with the real command line.

Docker cannot run here, so these tests read the files and check every command against
the click commands it would run: each flag exists and parses, the environment variables
are the ones the commands read, and the ports and health checks line up.
"""

from __future__ import annotations

import re
from pathlib import Path

import click
import pytest
import yaml

from pgqueue.cli import main as pgqueue_cli
from pgqueue_api.cli import api as api_command

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def compose() -> dict:
    return yaml.safe_load((ROOT / "docker-compose.yml").read_text())


def click_command_for(argv: list[str]) -> tuple[click.Command, list[str]]:
    """The click command a container's argv runs, and the arguments it is given."""
    program, *args = argv
    if program == "pgqueue-api":
        return api_command, args
    assert program == "pgqueue", f"unexpected program {program}"
    ctx = click.Context(pgqueue_cli)
    command = pgqueue_cli.get_command(ctx, args[0])
    assert command is not None, f"pgqueue has no command {args[0]!r}"
    return command, args[1:]


def parse(argv: list[str], env: dict[str, str], monkeypatch) -> dict:
    command, args = click_command_for(argv)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    ctx = command.make_context(command.name, list(args), resilient_parsing=False)
    return ctx.params


def envvars_of(command: click.Command) -> set[str]:
    names: set[str] = set()
    for param in command.params:
        envvar = getattr(param, "envvar", None)
        if isinstance(envvar, str):
            names.add(envvar)
        elif envvar:
            names.update(envvar)
    return names


def test_services_are_postgres_16_the_api_and_two_workers(compose):
    services = compose["services"]
    assert services["postgres"]["image"] == "postgres:16"
    workers = [
        name
        for name, svc in services.items()
        if svc.get("command", [])[:2] == ["pgqueue", "worker"]
    ]
    assert len(workers) == 2
    assert services["api"]["command"][0] == "pgqueue-api"


def test_every_command_parses_with_the_real_cli(compose, monkeypatch):
    for name, service in compose["services"].items():
        if "build" not in service:
            continue
        params = parse(service["command"], service.get("environment", {}), monkeypatch)
        assert params["database_url"] == service["environment"]["DATABASE_URL"], name
        assert params["schema"] == service["environment"]["PGQUEUE_SCHEMA"], name


def test_environment_variables_are_ones_the_commands_read(compose):
    for service in compose["services"].values():
        if "build" not in service:
            continue
        command, _ = click_command_for(service["command"])
        assert set(service["environment"]) <= envvars_of(command)


def test_the_database_url_points_at_the_postgres_service(compose):
    postgres = compose["services"]["postgres"]["environment"]
    for service in compose["services"].values():
        if "build" not in service:
            continue
        url = service["environment"]["DATABASE_URL"]
        expected = (
            f"postgresql://{postgres['POSTGRES_USER']}:{postgres['POSTGRES_PASSWORD']}"
            f"@postgres:5432/{postgres['POSTGRES_DB']}"
        )
        assert url == expected


def test_the_api_migrates_once_listens_on_8000_and_is_health_checked(compose, monkeypatch):
    api = compose["services"]["api"]
    params = parse(api["command"], api["environment"], monkeypatch)
    assert params["run_migrations"] is True
    assert params["host"] == "0.0.0.0"
    assert api["ports"] == [f"{params['port']}:{params['port']}"] == ["8000:8000"]
    assert f"127.0.0.1:{params['port']}/healthz" in " ".join(api["healthcheck"]["test"])
    workers = [
        s for s in compose["services"].values() if s.get("command", [])[:2] == ["pgqueue", "worker"]
    ]
    for worker in workers:
        # Workers start once the API has applied the migrations.
        assert worker["depends_on"]["api"]["condition"] == "service_healthy"
        assert not parse(worker["command"], worker["environment"], monkeypatch).get(
            "run_migrations"
        )
    assert api["depends_on"]["postgres"]["condition"] == "service_healthy"


def test_the_dockerfile_installs_every_distribution_the_services_run():
    dockerfile = (ROOT / "Dockerfile").read_text()
    installed = set(re.findall(r"\./(packages|plugins)/([\w-]+)", dockerfile))
    assert {
        ("packages", "pgqueue-core"),
        ("packages", "pgqueue-worker"),
        ("packages", "pgqueue-api"),
        ("plugins", "pgqueue-examples"),
    } <= installed
    for folder, name in installed:
        assert (ROOT / folder / name / "pyproject.toml").exists()
