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


def test_gemini_hooks_turned_off_in_any_layer_fail_the_check(tmp_path):
    """adv6b 07: the project's .gemini/settings.json with hooksConfig.enabled
    false turns off the user-level hook that holds caper's entry."""
    import json
    user, project = tmp_path / "user.json", tmp_path / "project.json"
    user.write_text(json.dumps({"hooks": {}}))
    project.write_text(json.dumps({"hooksConfig": {"enabled": False}}))
    files = {"user": str(user), "project": str(project)}
    checks = doctor._active_gemini("gemini", {"user": ["caper hook gemini"]}, files, str(tmp_path),
                                   None)
    assert checks[0].status == doctor.FAIL and str(project) in checks[0].what
    project.write_text("{}")
    checks = doctor._active_gemini("gemini", {"user": ["caper hook gemini"]}, files, str(tmp_path),
                                   None)
    assert checks[0].status == doctor.OK
