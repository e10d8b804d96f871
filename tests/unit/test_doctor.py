"""`hogwild doctor`: a report a user can act on, and an exit status tools can rely on."""

from __future__ import annotations

import collections

from hogwild.cli import doctor


def test_doctor_fails_with_the_reason_when_dev_shm_is_too_small(monkeypatch, capsys):
    usage = collections.namedtuple("usage", "total used free")
    monkeypatch.setattr(
        doctor.shutil, "disk_usage", lambda path: usage(2**20 * 10, 2**20 * 9, 2**20)
    )
    assert doctor.main([]) == 1
    out = capsys.readouterr().out
    assert "NOT READY" in out and "/dev/shm has only 1 MiB free" in out


def test_doctor_recommends_file_system_when_the_fd_limit_is_tiny(monkeypatch):
    monkeypatch.setattr(doctor.resource, "getrlimit", lambda which: (64, 64))
    report = doctor.examine()
    assert report["recommended"]["trainer.sharing_strategy"] == "file_system"
    assert report["ready"]  # file_system is there, so a run can still work
