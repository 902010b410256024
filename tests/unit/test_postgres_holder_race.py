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
