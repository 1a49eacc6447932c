"""deploy/kubernetes/ validated offline: the built-in kinds against Kubernetes' own JSON
schemas (kubernetes-validate's strict copies, which refuse unknown fields), KEDA's
ScaledObject against the models generated from KEDA's CRD (cloudcoil-models-keda; a
round trip through them shows any field they do not know), and every command, port,
probe and grace period against the real command line."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import uuid
from pathlib import Path

import click
import httpx
import kubernetes_validate
import psycopg
import pytest
import yaml
from cloudcoil.models.keda.v1alpha1 import ScaledObject
from packaging_support import ROOT, distributions
from prometheus_client.parser import text_string_to_metric_families
from psycopg import sql
from serving import serve

from pgqueue import migrate
from pgqueue.cli import main as pgqueue_cli
from pgqueue_api import ApiSettings, create_app
from pgqueue_api.cli import api as api_command

MANIFESTS = ROOT / "deploy" / "kubernetes"
# The oldest Kubernetes still in wide use, and the newest the validator knows.
KUBERNETES_VERSIONS = ["1.29.0", kubernetes_validate.latest_version()]
VERSION = distributions()[0].version


def documents() -> list[tuple[str, dict]]:
    found = []
    for path in sorted(MANIFESTS.glob("*.yaml")):
        if path.name == "kustomization.yaml":
            continue
        for doc in yaml.safe_load_all(path.read_text()):
            found.append((path.name, doc))
    return found


DOCUMENTS = documents()
BUILT_IN = [(name, doc) for name, doc in DOCUMENTS if doc["apiVersion"] != "keda.sh/v1alpha1"]


def one(kind: str, name: str) -> dict:
    (doc,) = [d for _, d in DOCUMENTS if d["kind"] == kind and d["metadata"]["name"] == name]
    return doc


def pod_spec(doc: dict) -> dict:
    return doc["spec"]["template"]["spec"]


def container(doc: dict, name: str) -> dict:
    (found,) = [c for c in pod_spec(doc)["containers"] if c["name"] == name]
    return found


def cli_params(argv: list[str], monkeypatch) -> dict:
    """The parameters the real command line makes of a container's command."""
    program, *args = argv
    if program == "pgqueue-api":
        command = api_command
    else:
        assert program == "pgqueue"
        command = pgqueue_cli.get_command(click.Context(pgqueue_cli), args[0])
        assert command is not None, args[0]
        args = args[1:]
    monkeypatch.setenv("DATABASE_URL", "postgresql://placeholder/pgqueue")
    return command.make_context(command.name, list(args)).params


def test_the_kustomization_lists_every_manifest_and_pins_the_image():
    kustomization = yaml.safe_load((MANIFESTS / "kustomization.yaml").read_text())
    listed = set(kustomization["resources"])
    assert listed == {p.name for p in MANIFESTS.glob("*.yaml")} - {"kustomization.yaml"}
    (image,) = kustomization["images"]
    # The image is tagged with pgqueue's version, which moves with the distributions'.
    assert (image["name"], image["newTag"]) == ("pgqueue", VERSION)
    for _, doc in DOCUMENTS:
        if "template" in doc.get("spec", {}):
            spec = pod_spec(doc)
            for c in spec["containers"] + spec.get("initContainers", []):
                assert c["image"] == f"pgqueue:{VERSION}"


def test_the_kinds_are_the_ones_a_deployment_needs():
    kinds = sorted((doc["kind"], doc["metadata"]["name"]) for _, doc in DOCUMENTS)
    assert kinds == [
        ("Deployment", "pgqueue-api"),
        ("Deployment", "pgqueue-worker"),
        ("Job", "pgqueue-migrate"),
        ("ScaledObject", "pgqueue-worker"),
        ("Service", "pgqueue-api"),
    ]


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
@pytest.mark.parametrize(("file", "doc"), BUILT_IN, ids=[f for f, _ in BUILT_IN])
def test_the_built_in_kinds_match_kubernetes_schemas(file, doc, version):
    kubernetes_validate.validate(doc, version, strict=True)


def test_the_schema_check_refuses_a_misspelt_field():
    broken = yaml.safe_load(yaml.safe_dump(one("Deployment", "pgqueue-worker")))
    broken["spec"]["template"]["spec"]["terminationGracePeriodSecond"] = 45
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, KUBERNETES_VERSIONS[-1], strict=True)


def test_the_scaled_object_matches_kedas_crd():
    doc = one("ScaledObject", "pgqueue-worker")
    model = ScaledObject.model_validate(doc)
    # Fields the CRD does not know would be dropped on the way through: none may be.
    assert model.model_dump(by_alias=True, exclude_unset=True, mode="json") == doc


def test_the_crd_check_refuses_a_misspelt_field():
    broken = yaml.safe_load(yaml.safe_dump(one("ScaledObject", "pgqueue-worker")))
    broken["spec"]["maxReplicas"] = 20
    dumped = ScaledObject.model_validate(broken).model_dump(
        by_alias=True, exclude_unset=True, mode="json"
    )
    assert dumped != broken


def test_workers_scale_on_their_queues_queued_jobs_from_prometheus(monkeypatch):
    scaled = one("ScaledObject", "pgqueue-worker")["spec"]
    worker = one("Deployment", "pgqueue-worker")
    assert scaled["scaleTargetRef"]["name"] == worker["metadata"]["name"]
    assert scaled["scaleTargetRef"].get("kind", "Deployment") == "Deployment"
    # KEDA owns the number of workers: a `replicas` here would be reset by every apply.
    assert "replicas" not in worker["spec"]
    # At least one: workers also reap crashed workers' leases and prune old jobs.
    assert 1 <= scaled["minReplicaCount"] <= scaled["maxReplicaCount"]
    (trigger,) = scaled["triggers"]
    assert trigger["type"] == "prometheus"
    metadata = trigger["metadata"]
    # KEDA's prometheus scaler: serverAddress, query and threshold are required, and
    # trigger metadata are strings.
    assert {"serverAddress", "query", "threshold"} <= set(metadata)
    assert all(isinstance(v, str) for v in metadata.values())
    assert float(metadata["threshold"]) > 0
    query = metadata["query"]
    selector = re.fullmatch(r"max\(pgqueue_jobs\{(.*)\}\)", query.replace(" ", ""))
    assert selector, f"{query}: every API pod reports the same count, so not a sum"
    labels = dict(re.findall(r'(\w+)="([^"]*)"', selector[1]))
    served = cli_params(container(worker, "worker")["command"], monkeypatch)["queues"]
    assert labels == {"state": "queued", "queue": served[0]} and len(served) == 1


def test_the_metric_and_its_labels_are_ones_the_api_exports(database_url, schema, queue):
    # The query's series, as the real API serves it: one queued job in queue "default".
    queue.enqueue("echo", {})
    app = create_app(ApiSettings(database_url=database_url, schema=schema))
    with serve(app) as url:
        text = httpx.get(f"{url}/metrics", timeout=60).text
    samples = [
        sample
        for family in text_string_to_metric_families(text)
        if family.name == "pgqueue_jobs"
        for sample in family.samples
    ]
    queued = [s.value for s in samples if s.labels == {"queue": "default", "state": "queued"}]
    assert queued == [1.0]


def test_the_worker_gets_longer_than_its_shutdown_timeout(monkeypatch):
    worker = one("Deployment", "pgqueue-worker")
    params = cli_params(container(worker, "worker")["command"], monkeypatch)
    # SIGTERM, then --shutdown-timeout for running jobs, then the last acks; only then
    # may the kubelet SIGKILL.
    assert pod_spec(worker)["terminationGracePeriodSeconds"] >= params["shutdown_timeout"] + 10


def test_the_api_is_ready_on_healthz_and_alive_while_it_listens(monkeypatch):
    api = one("Deployment", "pgqueue-api")
    main = container(api, "api")
    params = cli_params(main["command"], monkeypatch)
    assert params["host"] == "0.0.0.0"
    ports = {p["name"]: p["containerPort"] for p in main["ports"]}
    assert ports == {"http": params["port"]}
    assert main["readinessProbe"]["httpGet"] == {"path": "/healthz", "port": "http"}
    # Not /healthz: a database outage makes the API unready, it must not restart it.
    assert main["livenessProbe"]["tcpSocket"] == {"port": "http"}


def test_the_service_reaches_the_api_pods():
    service = one("Service", "pgqueue-api")["spec"]
    api = one("Deployment", "pgqueue-api")
    labels = api["spec"]["template"]["metadata"]["labels"]
    assert service["selector"].items() <= labels.items()
    assert api["spec"]["selector"]["matchLabels"] == service["selector"]
    assert service["ports"][0]["targetPort"] == "http"
    assert service["type"] == "ClusterIP"


def test_the_migration_job_migrates_and_the_others_wait_for_it(monkeypatch):
    job = one("Job", "pgqueue-migrate")
    (migrate,) = pod_spec(job)["containers"]
    assert migrate["command"] == ["pgqueue", "migrate"]
    assert pod_spec(job)["restartPolicy"] == "Never"
    for name in ("pgqueue-api", "pgqueue-worker"):
        (wait,) = pod_spec(one("Deployment", name))["initContainers"]
        # `pgqueue status` fails until every migration is applied (see below).
        assert "until pgqueue status" in " ".join(wait["command"]), name
    for _, doc in DOCUMENTS:
        if "template" in doc.get("spec", {}):
            for c in pod_spec(doc)["containers"]:
                if c["command"][0] == "pgqueue" and c["command"][1] != "migrate":
                    assert not cli_params(c["command"], monkeypatch).get("run_migrations")


def test_pgqueue_status_fails_until_the_schema_is_migrated(database_url):
    schema = f"k8s_{uuid.uuid4().hex[:12]}"
    status = [str(Path(sys.executable).parent / "pgqueue"), "status", "--schema", schema]
    env = {**os.environ, "DATABASE_URL": database_url}
    try:
        before = subprocess.run(status, env=env, capture_output=True, text=True, timeout=60)
        assert before.returncode == 1
        assert f"schema {schema} is not migrated" in before.stderr
        migrate(database_url, schema)
        after = subprocess.run(status, env=env, capture_output=True, text=True, timeout=60)
        assert after.returncode == 0, after.stderr
    finally:
        with psycopg.connect(database_url, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema)))


def test_every_pod_runs_as_the_images_non_root_user():
    dockerfile = (ROOT / "Dockerfile").read_text()
    uid = int(re.findall(r"^USER (\d+)", dockerfile, re.M)[-1])
    for _, doc in DOCUMENTS:
        if "template" not in doc.get("spec", {}):
            continue
        spec = pod_spec(doc)
        assert spec["securityContext"]["runAsNonRoot"] is True
        assert spec["securityContext"]["runAsUser"] == uid
        for c in spec["containers"] + spec.get("initContainers", []):
            assert c["securityContext"]["allowPrivilegeEscalation"] is False
            assert c["securityContext"]["readOnlyRootFilesystem"] is True


def test_every_pod_reads_the_database_url_from_the_secret():
    for _, doc in DOCUMENTS:
        if "template" not in doc.get("spec", {}):
            continue
        spec = pod_spec(doc)
        for c in spec["containers"] + spec.get("initContainers", []):
            env = {e["name"]: e for e in c["env"]}
            assert env["DATABASE_URL"]["valueFrom"]["secretKeyRef"] == {
                "name": "pgqueue-database",
                "key": "url",
            }
            assert env["PGQUEUE_SCHEMA"]["value"] == "pgqueue"


def test_the_readme_names_every_manifest():
    readme = (MANIFESTS / "README.md").read_text()
    for path in MANIFESTS.glob("*.yaml"):
        assert path.name in readme, path.name
    assert Path(ROOT / "Dockerfile").exists()
