"""The package's metadata: what a package index shows, and what a release carries.

The README is the long description, shown away from the repository, so its links must
be absolute. The version has one source. Extras pin compatible ranges, never one version.
(``.ci/sdist-tests.sh`` checks the built sdist itself and runs tests from it.)
"""

from __future__ import annotations

import importlib.metadata
import re
import tomllib
from pathlib import Path

from packaging.requirements import Requirement

import gym_harness

ROOT = Path(__file__).resolve().parents[2]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
PROJECT = PYPROJECT["project"]
#: A Markdown link or image target: ``[text](target)``.
_LINK = re.compile(r"\]\(([^)\s]+)\)")


def test_every_readme_link_is_absolute_and_ours_point_at_the_source() -> None:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    links = _LINK.findall(text)
    assert links, "the README has links; the pattern must see them"
    relative = [link for link in links if not link.startswith(("https://", "http://"))]
    assert relative == []  # a relative link (or a bare #anchor) breaks on a package index
    source = PROJECT["urls"]["Source"]
    ours = [link for link in links if "gym_harness" in link]
    assert ours and all(link.startswith(source) for link in ours), ours


def test_the_version_has_one_source() -> None:
    assert PROJECT["dynamic"] == ["version"]
    dynamic = PYPROJECT["tool"]["setuptools"]["dynamic"]["version"]
    assert dynamic == {"attr": "gym_harness.__version__"}
    assert importlib.metadata.version("gym_harness") == gym_harness.__version__
    changelog = (ROOT / "CHANGELOG.md").read_text(encoding="utf-8")
    assert "## [Unreleased]" in changelog and "keepachangelog.com" in changelog


def test_the_metadata_says_who_what_where_and_under_which_license() -> None:
    assert PROJECT["license"] == "MIT" and PROJECT["license-files"] == ["LICENSE"]
    assert (ROOT / "LICENSE").read_text().startswith("MIT License")
    assert PROJECT["authors"] and len(PROJECT["keywords"]) >= 5
    classifiers = set(PROJECT["classifiers"])
    assert {"Operating System :: POSIX :: Linux", "Typing :: Typed"} <= classifiers
    python = f"Programming Language :: Python :: {PROJECT['requires-python'].lstrip('>=')}"
    assert python in classifiers
    assert not [c for c in classifiers if c.startswith("License ::")]  # the expression says it
    assert {"Homepage", "Documentation", "Source", "Changelog", "Issues"} <= set(PROJECT["urls"])


def test_extras_pin_compatible_ranges_never_one_version() -> None:
    for extra, requirements in PROJECT["optional-dependencies"].items():
        for line in requirements:
            requirement = Requirement(line)
            operators = {spec.operator for spec in requirement.specifier}
            assert "==" not in operators and "===" not in operators, (extra, line)
            assert ">=" in operators and "<" in operators, (extra, line)  # tested .. next major


def test_the_notebooks_extra_can_open_the_notebooks() -> None:
    names = {Requirement(line).name for line in PROJECT["optional-dependencies"]["notebooks"]}
    assert "notebook" in names


def test_the_sdist_manifest_carries_what_the_tests_read() -> None:
    lines = set((ROOT / "MANIFEST.in").read_text().splitlines())
    assert {"graft tests", "graft docs", "graft notebooks", "graft .ci"} <= lines
    assert "include LICENSE CHANGELOG.md README.md mkdocs.yml" in lines
