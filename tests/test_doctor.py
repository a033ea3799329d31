"""`caper doctor`'s machine checks (its agent checks run against the real
clients in tests/test_real_agents.py)."""
from __future__ import annotations

from caper.front import doctor


def test_the_machine_checks_pass_here_and_the_pipeline_runs_once(tmp_path, monkeypatch):
    monkeypatch.setenv("CAPER_STATE_DIR", str(tmp_path / "state"))
    checks = doctor.run(str(tmp_path), agents=[])
    text, status = doctor.report(checks)
    for what in ("state directory", "kernel: overlayfs", "kernel: seccomp", "kernel: openat2",
                 "a sandboxed `true` ran in this process"):
        assert any(c.status == doctor.OK and what in c.what for c in checks), text
    assert status == 0, text


def test_an_unusable_state_directory_fails_with_its_fix(tmp_path, monkeypatch):
    (tmp_path / "file").write_text("")
    monkeypatch.setenv("CAPER_STATE_DIR", str(tmp_path / "file" / "state"))
    text, status = doctor.report(doctor.check_state_dir())
    assert status == 1 and "FAIL" in text and "fix: set CAPER_STATE_DIR" in text


def test_doctor_never_runs_an_agent_binary_of_the_project(tmp_path, monkeypatch):
    """The adversarial round's repro: PATH=/usr/bin:/bin: (an empty entry, the
    cwd) and a ./claude in the project. Doctor does not run it."""
    project = tmp_path / "proj"
    project.mkdir()
    fake = project / "claude"
    fake.write_text("#!/bin/sh\nid > PWNED-by-doctor\necho 1.0.0\n")
    fake.chmod(0o755)
    monkeypatch.chdir(project)
    monkeypatch.setenv("PATH", "/usr/bin:/bin:")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    for path in ("/usr/bin:/bin:", f"/usr/bin:{project}", ".:/usr/bin"):
        monkeypatch.setenv("PATH", path)
        checks = doctor.check_agent("claude-code", str(project))
        assert not (project / "PWNED-by-doctor").exists()
        assert not any("1.0.0" in c.what for c in checks), checks
