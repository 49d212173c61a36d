"""The table of vLLM releases and their behaviours, and the model and harness scheduler following it.

Nothing here needs vLLM: the semantics are given by name, and the watched files are read from a folder
laid out like the ``vllm`` package.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from kvcheck.targets.kvcore_target import KvcoreTarget
from kvcheck.vllm_releases import (
    RELEASES,
    WATCHED_FILES,
    UnsupportedRelease,
    changed_files,
    nearest_known,
    semantics_for,
    watched_digests,
)
from kvmodel.config import TargetConfig
from kvmodel.group_spec import GroupSpec
from kvmodel.manager.in_flight import caches_after_sync_output
from kvmodel.manager_model import ManagerModel
from kvmodel.ops import AddRequest, Finish, Schedule
from kvmodel.semantics import BEHAVIOURS, KNOWN_VERSIONS, NEWEST, SYNC_MAMBA_OUTPUT_CACHING, Semantics, release_key

MAMBA_BESIDE_FULL = TargetConfig(
    num_blocks=16,
    block_size=4,
    groups=(GroupSpec(kind="full"), GroupSpec(kind="mamba_align")),
    enable_caching=True,
    num_hash_lookahead_tokens=1,
).validate()
"""Full attention beside an align-mode Mamba group, block hashes looking one token ahead."""


def test_every_behaviour_cites_vllm_for_each_known_release_that_has_it() -> None:
    """A row arrives in a known release and cites the file and line deciding it in every release that has
    it; releases are listed oldest first, each with a digest of every watched file."""
    assert list(KNOWN_VERSIONS) == sorted(KNOWN_VERSIONS, key=release_key)
    assert KNOWN_VERSIONS[-1] == NEWEST
    for row in BEHAVIOURS:
        assert row.since in KNOWN_VERSIONS, row.name
        for version in KNOWN_VERSIONS:
            if Semantics(version).has(row.name):
                assert row.sources.get(version, "").startswith("vllm/"), (row.name, version)
        for where in row.sources.values():
            path, _, line = where.rpartition(":")
            assert path.endswith(".py") and int(line) > 0, where
    for known in RELEASES:
        assert set(known.watched) == set(WATCHED_FILES), known.version


def test_a_behaviour_is_in_force_from_its_release_on() -> None:
    """The output-time caching beside Mamba layers arrived in 0.34.0."""
    assert not Semantics("0.33.0").has(SYNC_MAMBA_OUTPUT_CACHING)
    assert Semantics("0.34.0").has(SYNC_MAMBA_OUTPUT_CACHING)
    with pytest.raises(ValueError, match=r"'0\.2\.0' is not a known vLLM release"):
        Semantics("0.2.0")


@pytest.mark.parametrize(
    ("installed", "nearest"),
    [
        ("0.33.0", "0.33.0"),
        ("0.34.0", "0.34.0"),
        ("0.33.1", "0.33.0"),
        ("0.35.0.dev12+g1a2b3c", "0.34.0"),
        ("1.0", "0.34.0"),
    ],
)
def test_an_installed_version_runs_on_the_nearest_lower_known_release(installed: str, nearest: str) -> None:
    """Patch releases, development builds of main and later releases take the newest known release not
    newer than them."""
    assert nearest_known(installed) == nearest


def test_a_version_older_than_every_known_release_is_refused() -> None:
    with pytest.raises(UnsupportedRelease, match=r"vLLM 0\.32\.9 is older than every release kvcheck knows"):
        nearest_known("0.32.9")
    with pytest.raises(ValueError, match=r"does not start with major\.minor"):
        release_key("main")


def _package_like(root: Path, version: str) -> Path:
    """A folder holding files whose digests are the watched files of ``version`` (the files' bytes are
    unknown here, so the digests are taken from the folder and compared after a write)."""
    for name in WATCHED_FILES:
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(f"# {name} of a vLLM {version} stand-in\n")
    return root


def test_watched_files_that_differ_from_the_release_leave_its_semantics_unconfirmed(tmp_path: Path) -> None:
    """A package whose watched files differ from the reviewed release's (a fork, a patched copy) runs on
    that release's semantics, flagged with the files that differ; a newer version is flagged as unknown."""
    package = _package_like(tmp_path, "0.34.0")
    assert changed_files("0.34.0", package) == list(WATCHED_FILES)
    (package / "v1/request.py").unlink()
    assert watched_digests(package)["v1/request.py"] == "missing"
    semantics = semantics_for("0.34.0", package)
    assert semantics.release == "0.34.0"
    assert semantics.verdict_note() is not None
    assert "semantics unconfirmed for vLLM 0.34.0: watched files differ from the reviewed vLLM 0.34.0" in (
        semantics.verdict_note() or ""
    )
    assert semantics_for("0.34.0", None).unconfirmed is None
    newer = semantics_for("0.35.0", None)
    assert newer.release == "0.34.0"
    assert newer.unconfirmed == "vLLM 0.35.0 is not a release kvcheck knows; running on 0.34.0's"


def test_output_time_caching_needs_mamba_layers_prefix_caching_and_synchronous_steps() -> None:
    """vLLM 0.34.0 adds the call only beside Mamba layers, with prefix caching, under synchronous scheduling."""
    on = Semantics("0.34.0")
    assert caches_after_sync_output(MAMBA_BESIDE_FULL, on)
    assert not caches_after_sync_output(MAMBA_BESIDE_FULL, Semantics("0.33.0"))
    full_only = TargetConfig(
        num_blocks=16, block_size=4, groups=(GroupSpec(kind="full"),), enable_caching=True, num_hash_lookahead_tokens=1
    )
    assert not caches_after_sync_output(full_only, on)
    assert not caches_after_sync_output(
        TargetConfig(
            num_blocks=16, block_size=4, groups=(GroupSpec(kind="full"), GroupSpec(kind="mamba")), enable_caching=False
        ),
        on,
    )


def _next_hit(driver: ManagerModel | KvcoreTarget) -> int | None:
    """A 4-token prompt finishes after its first sampled token; the hit of a request sharing it."""
    driver.apply(AddRequest("r0", (1, 2, 3, 4)))
    driver.apply(Schedule("r0", 4, 0, sampled_token=5))
    driver.apply(Finish("r0"))
    driver.apply(AddRequest("r1", (1, 2, 3, 4, 5, 6, 7)))
    return driver.apply(Schedule("r1", 7, 0)).hit_length


@pytest.mark.parametrize(("release", "hit"), [("0.33.0", 0), ("0.34.0", 4)])
def test_the_output_time_call_decides_the_next_requests_hit(release: str, hit: int) -> None:
    """With hashes looking one token ahead, the prompt's block is hashed only once its first sampled token
    exists: vLLM 0.34.0's scheduler caches it at that output (the next request hits its 4 tokens); vLLM
    0.33.0's does not (it hits none).  The model and kvcore's scheduler-driven target agree on each."""
    semantics = Semantics(release)
    assert _next_hit(ManagerModel(MAMBA_BESIDE_FULL, semantics)) == hit
    assert _next_hit(KvcoreTarget(MAMBA_BESIDE_FULL, semantics=semantics)) == hit
