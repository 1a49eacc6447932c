"""The pgqueue-api wheel carries the dashboard's templates and every asset its pages and
``/docs`` load (nothing comes from a CDN), with the vendored files' licenses."""

from __future__ import annotations

import subprocess
import zipfile

import pytest
from packaging_support import ROOT, uv

pytestmark = pytest.mark.packaging

EXPECTED = {
    "pgqueue_api/ui/templates/base.html",
    "pgqueue_api/ui/templates/queues.html",
    "pgqueue_api/ui/templates/jobs.html",
    "pgqueue_api/ui/templates/job.html",
    "pgqueue_api/ui/templates/login.html",
    "pgqueue_api/ui/static/htmx.min.js",
    "pgqueue_api/ui/static/htmx.LICENSE",
    "pgqueue_api/ui/static/dashboard.css",
    "pgqueue_api/static/swagger-ui/swagger-ui-bundle.js",
    "pgqueue_api/static/swagger-ui/swagger-ui.css",
    "pgqueue_api/static/swagger-ui/LICENSE",
    "pgqueue_api/static/swagger-ui/NOTICE",
}


def test_the_api_wheel_ships_the_dashboard_and_the_docs_assets(tmp_path):
    # From the sdist, as `nox -s build` does: a file the sdist drops is missing here too.
    subprocess.run(
        [uv(), "build", "--quiet", "--out-dir", str(tmp_path), str(ROOT / "packages/pgqueue-api")],
        check=True,
        timeout=300,
    )
    (wheel,) = tmp_path.glob("*.whl")
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
        assert names >= EXPECTED, sorted(EXPECTED - names)
        assert archive.read("pgqueue_api/ui/static/htmx.min.js").startswith(b"var htmx=")
