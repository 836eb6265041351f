"""Where an embedded job's published weights go: tmpfs when it has room (pure, on a temp dir)."""

from __future__ import annotations

import shutil

from launcher.ram_weights import ram_weights_dir


def test_room_for_the_kept_versions_plus_one_decides(tmp_path):
    free = shutil.disk_usage(tmp_path).free
    run = tmp_path / "runs" / "a"
    got = ram_weights_dir(run, free // 4, keep=2, shm=tmp_path)
    assert got is not None and got.parent == tmp_path
    assert got == ram_weights_dir(run, 1, keep=2, shm=tmp_path), "the same run finds the same place"
    assert got != ram_weights_dir(tmp_path / "runs" / "b", 1, keep=2, shm=tmp_path)
    assert ram_weights_dir(run, free // 2, keep=2, shm=tmp_path) is None, "three versions do not fit"
    assert ram_weights_dir(run, 1, keep=2, shm=tmp_path / "missing") is None
