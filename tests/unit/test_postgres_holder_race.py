"""The e2e harness's PostgreSQL folder survives another worker's clean-up at the worst moment.

As root the data dir lives in a holder folder of the system temp dir, kept by a lock; ``remove_stale`` of
another pytest-xdist worker removes holders whose lock it can take. A .ci/run lost a whole matrix file to
that race (BlockingIOError at the flock): the clean-up took the lock between the file's creation and its flock.
"""

from __future__ import annotations

import fcntl
import os
import shutil
from pathlib import Path
from typing import Any

import pytest

from tests.e2e import harness


def test_a_clean_up_between_the_lock_files_creation_and_its_flock_leaves_the_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real_flock = fcntl.flock
    cleaned: list[bool] = []

    def clean_up_first(fd: Any, operation: int) -> None:
        if not cleaned:  # another worker's start, at the worst moment: just before this one takes its lock
            cleaned.append(True)
            harness.Postgres.remove_stale()
        real_flock(fd, operation)

    monkeypatch.setattr(harness.fcntl, "flock", clean_up_first)
    postgres = harness.Postgres(tmp_path)
    try:
        if os.geteuid() != 0:  # not root: the data dir is under pytest's own folder, with no holder to race for
            assert postgres.holder is None and postgres.dir == tmp_path / "pgdata"
            return
        assert cleaned and postgres.holder is not None
        assert postgres.holder.is_dir() and (postgres.holder / "lock").is_file(), "the live holder was removed"
        with open(postgres.holder / "lock") as other, pytest.raises(BlockingIOError):
            real_flock(other, fcntl.LOCK_EX | fcntl.LOCK_NB)  # still held by this run
    finally:
        if postgres.holder is not None:
            postgres._lock.close()
            shutil.rmtree(postgres.holder, ignore_errors=True)


def test_a_holder_abandoned_before_its_lock_is_removed_once_old_and_unheld(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A run killed between mkdtemp and its lock's rename left a folder that no lock ever guarded."""
    monkeypatch.setattr(harness.tempfile, "tempdir", str(tmp_path))
    prefix = harness.Postgres.PREFIX
    old_empty, old_unheld, old_held, young = (tmp_path / f"{prefix}{n}" for n in ("a", "b", "c", "d"))
    for folder in (old_empty, old_unheld, old_held, young):
        folder.mkdir()
    (old_unheld / "lock.new").write_text("")
    (old_held / "lock.new").write_text("")
    held = open(old_held / "lock.new")  # noqa: SIM115 - a live run's lock, held during the clean-up
    fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
    hour_ago = os.stat(tmp_path).st_mtime - 3600
    for folder in (old_empty, old_unheld, old_held):
        os.utime(folder, (hour_ago, hour_ago))
    try:
        harness.Postgres.remove_stale()
    finally:
        held.close()
    assert not old_empty.exists() and not old_unheld.exists()
    assert old_held.is_dir() and young.is_dir()
