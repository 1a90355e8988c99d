"""CHANGELOG.md records every release, newest first, and its newest is this tree's version; the
release before it names a commit of this history whose pyproject.toml says that release's version
(the upgrade test builds it from there: tests/integration/test_upgrade.py)."""

import re
import subprocess
import tomllib

import pytest

from runplane import __version__
from tests.releases import CHANGELOG, previous_release, releases

ROOT = CHANGELOG.parent


def _version(text: str) -> tuple[int, ...]:
    return tuple(int(part) for part in text.split("."))


def test_the_newest_release_is_this_trees_version_and_the_releases_go_newest_first():
    listed = releases(CHANGELOG.read_text())
    assert listed[0].version == __version__
    versions = [_version(release.version) for release in listed]
    assert versions == sorted(versions, reverse=True) and len(set(versions)) == len(versions)
    assert [release.date for release in listed] == sorted((release.date for release in listed), reverse=True)
    assert all(release.commit is not None for release in listed[1:]), "only the newest may await its commit"


def test_the_previous_release_is_built_from_a_commit_of_this_history_that_has_its_version():
    release = previous_release(CHANGELOG.read_text())
    assert release.commit is not None
    ancestor = subprocess.run(["git", "-C", str(ROOT), "merge-base", "--is-ancestor", release.commit, "HEAD"])
    assert ancestor.returncode == 0, f"{release.commit} is not in this clone's history"
    pyproject = subprocess.run(
        ["git", "-C", str(ROOT), "show", f"{release.commit}:pyproject.toml"], capture_output=True, check=True
    ).stdout
    assert tomllib.loads(pyproject.decode())["project"]["version"] == release.version


@pytest.mark.parametrize(
    ("text", "error"),
    [
        ("## 0.2.0 — 2026-11-28\n- commit: (when tagged)\n", "no release before the newest"),
        ("## 0.2.0 — 2026-11-28\n- commit: (when tagged)\n## 0.1.0 — 2026-11-27\n- commit: 92e77a0\n", "40 hex"),
        ("## 0.3.0 — 2026-12-01\n## 0.2.0 — 2026-11-28\n## 0.1.0 — 2026-11-27\n- commit: " + "a" * 40, "0.2.0 names"),
    ],
)
def test_a_changelog_without_a_usable_previous_commit_is_refused_with_the_reason(text, error):
    with pytest.raises(ValueError, match=re.escape(error)):
        previous_release(text)


def test_the_newest_release_needs_no_commit_line_and_only_the_previous_ones_is_read():
    text = "## 0.3.0 — 2026-12-01\n- notes\n## 0.2.0 — 2026-11-28\n- commit: " + "b" * 40 + "\n## 0.1.0 — 2026-11-27\n"
    with pytest.raises(ValueError, match=re.escape("0.1.0 names no commit")):
        releases(text)
    text += "- commit: (lost)\n"
    assert [release.commit for release in releases(text)] == [None, "b" * 40, None]
    assert previous_release(text).version == "0.2.0"
