"""One run's options (caper.request.RunRequest): defaults in one place, a
bad option refused with its name before anything runs, and the gate's wire
form round-trips. No sandbox: this is the request alone."""
from __future__ import annotations

import inspect
import os

import pytest

from caper.errors import BadRequest, ConfigError
from caper.judge import AllowApprover
from caper.request import DEFAULT_TIMEOUT_S, OPTIONS, RunRequest
from caper.sandbox.inherit import Caller
from caper.sandbox.trace import Trace


def test_an_option_left_out_or_none_takes_its_default():
    left_out, none = RunRequest("true"), RunRequest("true", timeout=None, approver=None)
    for r in (left_out, none):
        assert (r.approver, r.backend, r.timeout, r.task_from_transcript) == \
            ("auto", "auto", DEFAULT_TIMEOUT_S, False)
        assert r.task is r.session is r.on_unsure is r.max_memory is r.caller is None


def test_the_runs_time_limit_is_one_default_from_the_front_door_to_the_sandbox():
    assert inspect.signature(Trace).parameters["timeout"].default is DEFAULT_TIMEOUT_S


@pytest.mark.parametrize("option, value, message", [
    ("backend", "zfs", "unknown backend 'zfs'"),
    ("approver", "maybe", "unknown approver 'maybe'"),
    ("approver", 3, "approver:"),
    ("on_unsure", "shrug", "on_unsure must be one of block, allow, ask"),
    ("timeout", 0, "timeout must be a positive number"),
    ("timeout", True, "timeout must be a positive number"),
    ("max_memory", "plenty", "max_memory: not a size"),
    ("max_memory", -5, "max_memory: a size must be positive"),
    ("session", "a\nb", "bad session id"),
    ("task", 7, "task: a string"),
    ("task_from_transcript", "no", "task_from_transcript: true or false"),
    ("env", {"A": 1}, "env: not a mapping of strings"),
    ("caller", {"cwd": "/"}, "caller: a caper.sandbox.inherit.Caller"),
    ("no_such_option", 1, "unknown run option(s): no_such_option"),
])
def test_a_bad_option_is_a_bad_request_that_names_it(option, value, message):
    with pytest.raises(BadRequest) as e:
        RunRequest("true", **{option: value})
    assert message in str(e.value) and isinstance(e.value, ConfigError)


def test_a_command_is_a_string_or_a_list_of_strings():
    assert RunRequest(("echo", "a")).command == ["echo", "a"]
    assert RunRequest(["echo", "a b"]).text == "echo a b"
    for bad in (None, 5, ["echo", 5]):
        with pytest.raises(BadRequest, match="command"):
            RunRequest(bad)


def test_sizes_and_paths_are_normalised(tmp_path):
    r = RunRequest("true", max_memory="4G", timeout=5, cwd=tmp_path, workspace=tmp_path)
    assert (r.max_memory, r.timeout, r.cwd, r.workspace) == (4 << 30, 5.0, str(tmp_path),
                                                             str(tmp_path))


def test_the_wire_form_round_trips_with_the_callers_context(tmp_path):
    caller = Caller.here(cwd=str(tmp_path), env={"PATH": "/usr/bin", "X": "1"}, shell="/bin/bash")
    sent = RunRequest("make", task="build it", approver="policy", backend="overlay", timeout=9,
                      workspace="sub", session="s1", on_unsure="ask", max_memory=1 << 30,
                      caller=caller)
    wire = sent.to_wire()
    assert wire["workspace"] == os.path.join(str(tmp_path), "sub")   # the gate's cwd is /
    assert "cwd" not in wire and "env" not in wire                   # they travel in caller
    got = RunRequest.from_wire({**wire, "build": "b", "token": "t"})
    for name in OPTIONS:
        if name not in ("caller", "workspace", "cwd", "env"):
            assert getattr(got, name) == getattr(sent, name), name
    assert (got.cwd, got.env, got.caller.shell) == (str(tmp_path), caller.env, "/bin/bash")


def test_a_wire_request_that_does_not_say_where_its_task_came_from_is_the_doubtful_kind():
    wire = RunRequest("true", task="t", caller=Caller.here()).to_wire()
    del wire["task_from_transcript"]
    assert RunRequest.from_wire(wire).task_from_transcript is True


@pytest.mark.parametrize("doc, message", [
    ([], "a request is a JSON object"),
    ({"command": "true"}, "no caller"),
    ({"command": "true", "caller": {"cwd": "/"}}, "caller:"),
    ({"command": "true", "caller": "x", "cwd": "/"}, "unknown field(s): cwd"),
])
def test_a_malformed_wire_request_is_a_bad_request(doc, message):
    with pytest.raises(BadRequest) as e:
        RunRequest.from_wire(doc)
    assert message in str(e.value)


def test_an_approver_object_stays_in_its_process():
    r = RunRequest("true", approver=AllowApprover())
    with pytest.raises(BadRequest, match="cannot be sent to the gate"):
        r.to_wire()


def test_replace_changes_options_and_checks_them_again():
    r = RunRequest("true", timeout=5).replace(backend="overlay")
    assert (r.timeout, r.backend) == (5.0, "overlay")
    with pytest.raises(BadRequest):
        r.replace(backend="zfs")
