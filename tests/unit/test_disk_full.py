"""A result written to a full filesystem: a DiskFullError naming the file and the space it
needed, and the trial's folder exactly as it was (an earlier checkpoint there whole, no
half-written file, no tmp file). The sweep-level behaviour on a real full tmpfs is a fault
test (tests/faults/test_disk_full.py)."""

from __future__ import annotations

import errno
import os

import pytest

from orchestrator.config.errors import DiskFullError
from orchestrator.metrics.result import PointResult, TrialResult, load_result, save_result


def _result(points: int) -> TrialResult:
    return TrialResult(
        trial_hash="d" * 16,
        experiment="x",
        spec={},
        status="FINISHED" if points == 2 else "FAILED",  # a checkpoint is written as FAILED until the end
        started_at=0.0,
        ended_at=1.0,
        points=[PointResult(index=i, label=f"c{i}", setting={}) for i in range(points)],
        records_parquet=b"PAR1" + bytes(1000 * points),
        server_log="log\n" * points,
    )


def test_a_full_disk_leaves_the_earlier_checkpoint_whole(tmp_path, monkeypatch):
    d = save_result(_result(1), tmp_path / "trial")  # a checkpoint after the first point
    before = {p.name: p.read_bytes() for p in d.iterdir()}
    real_fsync, calls = os.fsync, []

    def fsync_fills_the_disk(fd):
        calls.append(fd)
        if len(calls) == 2:  # the second file of the final result does not fit
            raise OSError(errno.ENOSPC, "No space left on device")
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync_fills_the_disk)
    with pytest.raises(DiskFullError, match=r"no space left to write .*telemetry.parquet: it needs 500 bytes") as e:
        save_result(_result(2).model_copy(update={"telemetry_parquet": b"T" * 500}), d)
    assert e.value.needed_bytes == 500 and e.value.free_bytes is not None and e.value.free_bytes > 0
    assert "run the same command again" in str(e.value)
    assert {p.name: p.read_bytes() for p in d.iterdir()} == before  # untouched: no tmp, no new file
    assert len(load_result(d).points) == 1


def test_other_write_errors_are_not_called_a_full_disk(tmp_path, monkeypatch):
    def fsync_fails(fd):
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(os, "fsync", fsync_fails)
    with pytest.raises(OSError, match="Input/output error") as e:
        save_result(_result(2), tmp_path / "trial")
    assert not isinstance(e.value, DiskFullError)
    assert not list((tmp_path / "trial").iterdir())
