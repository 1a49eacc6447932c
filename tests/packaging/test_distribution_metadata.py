"""Every distribution carries what an index and an installer need, and they all move
together: one version, sibling dependencies that accept that version's compatible
releases, the same license and project links."""

from __future__ import annotations

import re
import subprocess

import pytest
from packaging.requirements import Requirement
from packaging.version import Version
from packaging_support import ROOT, distributions

DISTRIBUTIONS = distributions()
NAMES = {dist.name for dist in DISTRIBUTIONS}
EXPECTED = {
    "pgqueue-core",
    "pgqueue-worker",
    "pgqueue-api",
    "pgqueue-bench",
    "pytest-pgqueue",
    "pgqueue-examples",
}


def ids(dists=DISTRIBUTIONS):
    return [dist.name for dist in dists]


def test_the_six_distributions_are_found():
    assert NAMES == EXPECTED


def test_every_distribution_has_the_same_version():
    versions = {dist.name: dist.version for dist in DISTRIBUTIONS}
    assert len(set(versions.values())) == 1, f"versions disagree: {versions}"
    Version(next(iter(versions.values())))  # a valid PEP 440 version


@pytest.mark.parametrize("dist", DISTRIBUTIONS, ids=ids())
def test_sibling_dependencies_accept_exactly_the_compatible_releases(dist):
    version = Version(dist.version)
    floor = Version(f"{version.major}.{version.minor}")
    ceiling = Version(f"{version.major}.{version.minor + 1}")
    siblings = [Requirement(r) for r in dist.project.get("dependencies", [])]
    siblings = [r for r in siblings if r.name in NAMES]
    for requirement in siblings:
        # ">=0.1,<0.2": any bug-fix release of the same minor version, no other.
        assert {str(s) for s in requirement.specifier} == {f">={floor}", f"<{ceiling}"}, (
            f"{dist.name} requires {requirement}"
        )
        assert requirement.specifier.contains(version)
        assert not requirement.specifier.contains(ceiling)
    if dist.name != "pgqueue-core":
        assert any(r.name == "pgqueue-core" for r in siblings), dist.name


def pythons_ci_runs() -> set[str]:
    """The Python versions CI runs the suite on: the noxfile's, and the newest one
    that .ci/run forces for its second leg. The classifiers claim these and no other."""
    noxfile = (ROOT / "noxfile.py").read_text()
    default = re.search(r'^PYTHON = "(3\.\d+)"$', noxfile, re.MULTILINE)
    assert default is not None
    forced = re.findall(r"--force-python (3\.\d+)", (ROOT / ".ci" / "run").read_text())
    assert forced, "the CI runs the suite on one Python only"
    return {default[1], *forced}


@pytest.mark.parametrize("dist", DISTRIBUTIONS, ids=ids())
def test_every_distribution_has_a_readme_license_classifiers_and_links(dist):
    project = dist.project
    readme = dist.folder / project["readme"]
    assert readme.is_file() and readme.read_text().startswith(f"# {dist.name}\n")
    assert project["license"] == "MIT"
    assert project["license-files"] == ["LICENSE"]
    # The license text ships in every wheel and sdist: each folder has the repo's copy.
    assert (dist.folder / "LICENSE").read_text() == (ROOT / "LICENSE").read_text()
    classifiers = project["classifiers"]
    versions = {
        c.rpartition(" :: ")[2]
        for c in classifiers
        if re.fullmatch(r"Programming Language :: Python :: 3\.\d+", c)
    }
    assert versions == pythons_ci_runs(), dist.name
    assert any(c.startswith("Development Status :: ") for c in classifiers)
    # PEP 639: the license is the SPDX expression above, never a classifier as well.
    assert not any(c.startswith("License :: ") for c in classifiers)
    assert project["requires-python"] == ">=3.11"
    assert project["description"]


def test_every_distribution_has_the_same_project_links():
    links = {dist.name: dist.project["urls"] for dist in DISTRIBUTIONS}
    first = next(iter(links.values()))
    assert {"Homepage", "Source", "Issues", "Documentation"} <= set(first)
    assert all(urls == first for urls in links.values()), links
    assert all(url.startswith("https://") for url in first.values())


def test_requirements_dev_installs_every_distribution_editable():
    lines = (ROOT / "requirements-dev.txt").read_text().splitlines()
    editable = {
        re.sub(r"\[.*\]$", "", line.split()[-1]) for line in lines if line.startswith("-e ")
    }
    assert editable == {f"./{dist.folder.relative_to(ROOT)}" for dist in DISTRIBUTIONS}


def test_build_output_is_not_tracked_by_git():
    ignored = subprocess.run(
        ["git", "check-ignore", "--no-index", "dist/pgqueue_core-0.1.0-py3-none-any.whl"],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert ignored.returncode == 0, "dist/ must be git-ignored"
