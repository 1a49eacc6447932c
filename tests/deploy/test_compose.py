"""docker-compose.yml, the Dockerfile and .dockerignore, as a team would ship them.

Docker cannot run here, so these tests read the files: the compose files are validated
against the Compose Specification's JSON schema (the copy check-jsonschema vendors),
every command is parsed by the click command it would run (each flag exists and
parses, the environment variables are the ones the commands read), the build context
is computed with docker-py's implementation of .dockerignore, and the rest (pinned
images, health checks, start order, ports, users, signals) is checked point by point.
"""

from __future__ import annotations

import json
import re
from importlib import resources
from pathlib import Path

import click
import jsonschema
import pytest
import yaml
from docker.utils.build import exclude_paths

from pgqueue.cli import main as pgqueue_cli
from pgqueue_api import settings as api_settings
from pgqueue_api.cli import api as api_command

ROOT = Path(__file__).resolve().parents[2]
PUBLIC = ROOT / "deploy" / "docker-compose.public.yml"
# PostgreSQL majors the suite runs on: the embedded server's and CI's service.
TESTED_MAJORS = {15, 18}
DIGEST = r"@sha256:[0-9a-f]{64}"
DISTRIBUTIONS = {
    ("packages", "pgqueue-core"),
    ("packages", "pgqueue-worker"),
    ("packages", "pgqueue-api"),
    ("plugins", "pgqueue-examples"),
}


class ComposeLoader(yaml.SafeLoader):
    """YAML as Docker Compose reads it, with its ``!override``/``!reset`` merge tags
    kept as plain values."""


for _tag in ("!override", "!reset"):
    ComposeLoader.add_constructor(
        _tag,
        lambda loader, node: (
            loader.construct_sequence(node)
            if isinstance(node, yaml.SequenceNode)
            else loader.construct_mapping(node)
            if isinstance(node, yaml.MappingNode)
            else loader.construct_scalar(node)
        ),
    )


def load(path: Path) -> dict:
    return yaml.load(path.read_text(), Loader=ComposeLoader)


@pytest.fixture(scope="module")
def compose() -> dict:
    return load(ROOT / "docker-compose.yml")


@pytest.fixture(scope="module")
def compose_schema() -> dict:
    vendored = resources.files("check_jsonschema.builtin_schemas.vendor")
    return json.loads(vendored.joinpath("compose-spec.json").read_text())


def pgqueue_services(compose: dict) -> dict[str, dict]:
    """The services that run the pgqueue image (all but PostgreSQL)."""
    return {name: s for name, s in compose["services"].items() if name != "postgres"}


def long_running(compose: dict) -> dict[str, dict]:
    return {n: s for n, s in pgqueue_services(compose).items() if n != "migrate"}


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


def interpolate(value: str, env: dict[str, str] | None = None) -> str:
    """Compose's ``${VAR:-default}`` interpolation, with the given variables set."""
    env = env or {}
    return re.sub(
        r"\$\{(\w+):-([^}]*)\}", lambda m: env.get(m[1]) or m[2], re.sub(r"\$\$", "$", value)
    )


def envvars_of(command: click.Command) -> set[str]:
    names: set[str] = set()
    for param in command.params:
        envvar = getattr(param, "envvar", None)
        if isinstance(envvar, str):
            names.add(envvar)
        elif envvar:
            names.update(envvar)
    return names


def seconds(duration: str) -> float:
    units = {"ms": 0.001, "s": 1, "m": 60, "h": 3600}
    parts = re.findall(r"(\d+(?:\.\d+)?)(ms|s|m|h)", duration)
    assert parts and "".join(n + u for n, u in parts) == duration, duration
    return sum(float(n) * units[u] for n, u in parts)


# --- the compose files are valid Compose --------------------------------------------


@pytest.mark.parametrize("path", [ROOT / "docker-compose.yml", PUBLIC], ids=lambda p: p.name)
def test_the_compose_files_follow_the_compose_specification(path, compose_schema):
    validator = jsonschema.validators.validator_for(compose_schema)(compose_schema)
    errors = [
        f"{'/'.join(map(str, e.absolute_path))}: {e.message}"
        for e in validator.iter_errors(load(path))
    ]
    assert errors == []


def test_the_schema_check_catches_a_misspelt_key(compose, compose_schema):
    broken = json.loads(json.dumps(compose))
    broken["services"]["worker"]["stop_grace_periode"] = "45s"
    assert not jsonschema.validators.validator_for(compose_schema)(compose_schema).is_valid(broken)


# --- one image, built once, started in order -----------------------------------------


def test_one_image_is_built_once_and_run_by_every_pgqueue_service(compose):
    services = pgqueue_services(compose)
    builders = [name for name, s in services.items() if "build" in s]
    assert builders == ["migrate"]
    images = {s["image"] for s in services.values()}
    assert len(images) == 1
    for name, service in services.items():
        if "build" not in service:
            # Never pulled: an image of that name elsewhere would be someone else's.
            assert service["pull_policy"] == "never", name


def test_the_migration_runs_once_before_the_api_and_the_workers(compose, monkeypatch):
    migrate = compose["services"]["migrate"]
    command, _ = click_command_for(migrate["command"])
    assert command.name == "migrate"
    parse(migrate["command"], migrate["environment"], monkeypatch)
    assert migrate["restart"] == "no"
    assert migrate["depends_on"]["postgres"]["condition"] == "service_healthy"
    for name, service in long_running(compose).items():
        assert service["depends_on"] == {
            "postgres": {"condition": "service_healthy"},
            "migrate": {"condition": "service_completed_successfully"},
        }, name
        # Nobody else migrates.
        assert not parse(service["command"], service["environment"], monkeypatch).get(
            "run_migrations"
        ), name


def test_services_are_postgres_the_migration_the_api_and_two_workers(compose):
    assert set(compose["services"]) == {"postgres", "migrate", "api", "worker"}
    worker = compose["services"]["worker"]
    assert worker["command"][:2] == ["pgqueue", "worker"]
    assert worker["deploy"]["replicas"] == 2
    assert compose["services"]["api"]["command"][0] == "pgqueue-api"


# --- PostgreSQL ------------------------------------------------------------------------


def test_postgres_is_a_tested_major_pinned_by_version_and_digest(compose):
    image = compose["services"]["postgres"]["image"]
    match = re.fullmatch(rf"postgres:(\d+)\.(\d+)-(bookworm|trixie){DIGEST}", image)
    assert match, f"{image} is not pinned to an exact version and a digest"
    assert int(match[1]) in TESTED_MAJORS
    # 18's image keeps its cluster under /var/lib/postgresql/18/docker and declares
    # /var/lib/postgresql the volume; older ones use /var/lib/postgresql/data.
    mount = "/var/lib/postgresql" if int(match[1]) >= 18 else "/var/lib/postgresql/data"
    assert compose["services"]["postgres"]["volumes"] == [f"pgdata:{mount}"]


def test_postgres_is_healthy_only_once_it_answers_over_tcp(compose):
    # During initialisation the image runs a temporary server that listens on the unix
    # socket only; pg_isready over TCP does not count it as ready.
    check = compose["services"]["postgres"]["healthcheck"]
    test = check["test"]
    assert test[:2] == ["CMD", "pg_isready"]
    assert "--host=127.0.0.1" in test or (
        "-h" in test and test[test.index("-h") + 1] == "127.0.0.1"
    )
    env = compose["services"]["postgres"]["environment"]
    assert f"--username={env['POSTGRES_USER']}" in test
    assert f"--dbname={env['POSTGRES_DB']}" in test


def test_the_database_url_points_at_the_postgres_service(compose):
    postgres = compose["services"]["postgres"]["environment"]
    expected = (
        f"postgresql://{postgres['POSTGRES_USER']}:{interpolate(postgres['POSTGRES_PASSWORD'])}"
        f"@postgres:5432/{postgres['POSTGRES_DB']}"
    )
    for name, service in pgqueue_services(compose).items():
        assert interpolate(service["environment"]["DATABASE_URL"]) == expected, name
        password = "s3cret"
        url = interpolate(service["environment"]["DATABASE_URL"], {"POSTGRES_PASSWORD": password})
        assert f":{password}@" in url
    assert interpolate(postgres["POSTGRES_PASSWORD"], {"POSTGRES_PASSWORD": "x"}) == "x"


# --- the commands ----------------------------------------------------------------------


def test_every_command_parses_with_the_real_cli(compose, monkeypatch):
    for name, service in pgqueue_services(compose).items():
        env = {k: interpolate(v) for k, v in service["environment"].items()}
        params = parse(service["command"], env, monkeypatch)
        assert params["database_url"] == env["DATABASE_URL"], name
        assert params["schema"] == env["PGQUEUE_SCHEMA"], name


def test_environment_variables_are_ones_the_commands_read(compose):
    # The API's settings are read from the environment by its worker processes too.
    api_reads = {getattr(api_settings, n) for n in dir(api_settings) if n.startswith("ENV_")}
    for name, service in pgqueue_services(compose).items():
        command, _ = click_command_for(service["command"])
        read = envvars_of(command) | (api_reads if command is api_command else set())
        assert set(service["environment"]) <= read, name


# --- the API ---------------------------------------------------------------------------


def test_the_api_is_published_on_the_hosts_loopback_only(compose, monkeypatch):
    api = compose["services"]["api"]
    params = parse(
        api["command"], {k: interpolate(v) for k, v in api["environment"].items()}, monkeypatch
    )
    # Inside its container it must listen beyond the container's own loopback...
    assert params["host"] == "0.0.0.0"
    # ...and on the host only 127.0.0.1 reaches it, since it has no tokens by default.
    assert (
        api["ports"] == [f"127.0.0.1:{params['port']}:{params['port']}"] == ["127.0.0.1:8000:8000"]
    )
    assert interpolate(api["environment"]["PGQUEUE_API_TOKENS"]) == ""


def test_publishing_the_api_on_every_interface_requires_tokens():
    public = load(PUBLIC)["services"]["api"]
    assert public["ports"] == ["8000:8000"]
    assert "ports: !override" in PUBLIC.read_text()
    tokens = public["environment"]["PGQUEUE_API_TOKENS"]
    # ${VAR:?message}: Compose refuses to start when the variable is unset or empty.
    assert re.fullmatch(r"\$\{PGQUEUE_API_TOKENS:\?[^}]+\}", tokens)


def test_the_api_is_health_checked_on_healthz(compose, monkeypatch):
    api = compose["services"]["api"]
    params = parse(
        api["command"], {k: interpolate(v) for k, v in api["environment"].items()}, monkeypatch
    )
    assert f"http://127.0.0.1:{params['port']}/healthz" in " ".join(api["healthcheck"]["test"])
    assert api["healthcheck"]["test"][0] == "CMD"


# --- the workers stop gracefully -------------------------------------------------------


def test_sigterm_reaches_the_worker_and_it_has_time_to_finish(compose, monkeypatch):
    worker = compose["services"]["worker"]
    params = parse(
        worker["command"],
        {k: interpolate(v) for k, v in worker["environment"].items()},
        monkeypatch,
    )
    assert worker.get("stop_signal", "SIGTERM") == "SIGTERM"
    # Running jobs get --shutdown-timeout; compose must not SIGKILL before, and leaves a
    # margin for the last acks and closing the pool.
    assert seconds(worker["stop_grace_period"]) >= params["shutdown_timeout"] + 10
    # An argv list, not a string a shell would run (and keep SIGTERM from).
    assert isinstance(worker["command"], list)
    for name, service in pgqueue_services(compose).items():
        assert isinstance(service["command"], list), name
        assert "entrypoint" not in service, name


def test_the_pgqueue_containers_are_locked_down(compose):
    for name, service in pgqueue_services(compose).items():
        assert service["read_only"] is True, name
        assert service["cap_drop"] == ["ALL"], name
        assert "no-new-privileges:true" in service["security_opt"], name


# --- the Dockerfile ---------------------------------------------------------------------


def dockerfile_instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) of the Dockerfile, continuation lines joined."""
    text = re.sub(r"\\\n", " ", (ROOT / "Dockerfile").read_text())
    instructions = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            keyword, _, rest = line.partition(" ")
            instructions.append((keyword.upper(), rest.strip()))
    return instructions


def test_the_base_image_is_pinned_by_exact_version_and_digest():
    stages = set()
    for keyword, args in dockerfile_instructions():
        if keyword != "FROM":
            continue
        image = args.split()[0]
        if image in stages:  # a stage of this file
            continue
        assert re.fullmatch(rf"python:3\.11\.\d+-slim-(bookworm|trixie){DIGEST}", image), image
        if " AS " in args.upper():
            stages.add(args.split()[-1])


def test_the_image_runs_as_a_numeric_non_root_user():
    users = [args for keyword, args in dockerfile_instructions() if keyword == "USER"]
    assert users, "no USER: the processes would run as root"
    uid = users[-1].split(":")[0]
    assert uid.isdigit() and int(uid) != 0


def test_the_command_is_exec_form_so_it_receives_sigterm():
    for keyword, args in dockerfile_instructions():
        if keyword in {"CMD", "ENTRYPOINT"}:
            assert isinstance(json.loads(args), list), f"{keyword} {args} is shell form"


def test_the_dockerfile_installs_every_distribution_the_services_run():
    dockerfile = (ROOT / "Dockerfile").read_text()
    installed = set(re.findall(r"\./(packages|plugins)/([\w-]+)", dockerfile))
    assert installed == DISTRIBUTIONS
    assert " -e " not in dockerfile and "--editable" not in dockerfile
    for folder, name in installed:
        assert (ROOT / folder / name / "pyproject.toml").exists()


# --- the build context ------------------------------------------------------------------


@pytest.fixture(scope="module")
def build_context(tmp_path_factory) -> set[str]:
    """What .dockerignore lets into the build context of a checkout holding everything a
    developer's has (virtualenvs, databases, build output, results)."""
    root = tmp_path_factory.mktemp("checkout")
    for path in [
        "Dockerfile",
        "LICENSE",
        ".git/HEAD",
        ".venv/bin/python",
        ".nox/tests/bin/python",
        ".pgdata/PG_VERSION",
        "packages/pgqueue-core/.pgdata/PG_VERSION",
        "dist/pgqueue_core-0.1.0-py3-none-any.whl",
        "packages/pgqueue-core/dist/pgqueue_core-0.1.0.tar.gz",
        "results/throughput.json",
        "packages/pgqueue-core/src/pgqueue/__pycache__/cli.cpython-311.pyc",
        "packages/pgqueue-core/src/pgqueue_core.egg-info/PKG-INFO",
        *(f"{folder}/{name}/pyproject.toml" for folder, name in DISTRIBUTIONS),
        "packages/pgqueue-core/src/pgqueue/cli.py",
        "packages/pgqueue-core/src/pgqueue/sql/statements/claiming.sql",
        "packages/pgqueue-core/src/pgqueue-core.pth",
        "plugins/pgqueue-examples/src/pgqueue_examples/__init__.py",
    ]:
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        (root / path).touch()
    patterns = [
        line.strip()
        for line in (ROOT / ".dockerignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    return set(exclude_paths(str(root), patterns, dockerfile="Dockerfile"))


LOCAL_STATE = [
    ".git",
    ".venv",
    ".nox",
    ".pgdata",
    "dist",
    "results",
    "packages/pgqueue-core/.pgdata",
    "packages/pgqueue-core/dist",
    "packages/pgqueue-core/src/pgqueue/__pycache__",
    "packages/pgqueue-core/src/pgqueue_core.egg-info",
]


@pytest.mark.parametrize("left_out", LOCAL_STATE)
def test_the_build_context_leaves_out_local_state(build_context, left_out):
    assert not any(p == left_out or p.startswith(f"{left_out}/") for p in build_context)


def test_the_build_context_has_what_the_dockerfile_copies(build_context):
    for folder, name in DISTRIBUTIONS:
        assert f"{folder}/{name}/pyproject.toml" in build_context
    assert "packages/pgqueue-core/src/pgqueue/sql/statements/claiming.sql" in build_context
    assert "packages/pgqueue-core/src/pgqueue-core.pth" in build_context
    copied = [args.split()[0] for k, args in dockerfile_instructions() if k == "COPY"]
    for source in copied:
        if source.startswith("--from="):
            continue
        assert any(p.startswith(source.rstrip("/")) for p in build_context), source
