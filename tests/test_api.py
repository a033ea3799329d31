"""The Python API (caper.Gate) and the MCP server, each used the way an
agent uses it: a Gate in-process (sync and from an event loop), and `caper
mcp` through a real MCP client session from the official SDK."""
from __future__ import annotations

import asyncio
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import caper
from caper.config import Config
from helpers.trees import git_project, tree

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent          # .venv/bin: where `caper` is installed


@pytest.fixture
def project(tmp_path):
    return git_project(tmp_path / "proj", {"src/a.c": "int a;\n",
                                           ".env": "TOKEN=tok-5f6e7d8c9b0a1f2e\n"}, ("src",))


def test_gate_runs_commits_and_blocks(project, tmp_path):
    gate = caper.Gate(str(project), config=Config(), state_dir=str(tmp_path / "state"),
                      env={**os.environ, "HOME": str(tmp_path)})
    ok = gate.run("echo built > out.txt; echo done", task="write out.txt")
    assert ok.committed and ok.decision == "allow" and ok.output == "done\n"
    assert (project / "out.txt").read_text() == "built\n"
    assert {"snapshot_ms", "run_ms", "report_ms", "approve_ms", "commit_ms"} <= set(ok.timings)
    before = tree(project)
    bad = gate.run("rm -rf src .git", task="fix the typo in the README")
    assert not bad.committed and bad.decision == "block" and tree(project) == before
    assert '".git"' in bad.reason and '"src"' in bad.reason   # the block, and what else it saw
    # One session: the second run's approver saw the first.
    from caper.judge.session import open_sessions
    with open_sessions(str(tmp_path / "state")) as s:
        assert [h["decision"] for h in s.history(gate.session)] == ["allow", "block"]


def test_gate_from_an_event_loop(project, tmp_path):
    gate = caper.Gate(str(project), config=Config(), state_dir=str(tmp_path / "state"),
                      env={**os.environ, "HOME": str(tmp_path)})

    async def main():
        ticks = 0

        async def ticker():
            nonlocal ticks
            while True:
                await asyncio.sleep(0.01)
                ticks += 1
        t = asyncio.create_task(ticker())
        results = await asyncio.gather(gate.arun("sleep 0.3; echo one"),
                                       gate.arun("echo two"))
        t.cancel()
        return results, ticks
    (one, two), ticks = asyncio.run(main())
    assert one.output == "one\n" and two.output == "two\n"
    assert ticks >= 10                       # the loop kept running meanwhile


def test_mcp_server_through_a_real_client_session(project, tmp_path):
    from mcp import Client, StdioServerParameters

    text = (ROOT / "README.md").read_text().split("<!-- mcp-settings -->", 1)[1]
    server = json.loads(re.search(r"```json\n(.*?)```", text, re.S).group(1))["mcpServers"]["caper"]
    params = StdioServerParameters(
        command=server["command"], args=server["args"], cwd=str(project),
        env={**os.environ, "PATH": f"{BIN}:{os.environ['PATH']}",
             "CAPER_STATE_DIR": str(tmp_path / "state"), "HOME": str(tmp_path),
             "CAPER_CONFIG": str(tmp_path / "none.toml")})

    async def main():
        async with Client(params) as client:
            tools = await client.list_tools()
            ok = await client.call_tool("run_command", {"command": "echo hello > greet.txt; "
                                                        "cat greet.txt", "task": "greet",
                                                        "cwd": str(project)})
            bad = await client.call_tool("run_command", {"command": "cat .env",
                                                         "task": "list the files",
                                                         "cwd": str(project)})
            refused = [await client.call_tool("run_command", {"command": "touch x", "cwd": cwd})
                       for cwd in ("", ".", "/", str(project / "nowhere"))]
            return tools, ok, bad, refused
    tools, ok, bad, refused = asyncio.run(main())
    [tool] = [t for t in tools.tools if t.name == "run_command"]
    assert set(tool.input_schema["properties"]) == {"command", "task", "cwd"}
    assert set(tool.input_schema["required"]) == {"command", "cwd"}
    assert ok.content[0].text == "exit status 0\nhello\n" and not ok.is_error
    assert (project / "greet.txt").read_text() == "hello\n"
    text = bad.content[0].text
    assert bad.is_error and text.startswith("caper blocked this command") and "credential" in text
    assert "tok-5f6e7d8c9b0a1f2e" not in text and "caper effect report" in text
    # No workspace, a relative one, the root directory, a missing one: refused, as errors.
    assert all(r.is_error and "did not run" in r.content[0].text for r in refused)
    assert not (project / "x").exists() and not os.path.exists("/x")


def test_mcp_server_keeps_to_the_roots_the_client_declares(project, tmp_path):
    from mcp import Client, StdioServerParameters
    from mcp.types import ListRootsResult, Root

    other = tmp_path / "other"
    other.mkdir()
    params = StdioServerParameters(
        command=sys.executable, args=["-m", "caper", "mcp"], cwd=str(project),
        env={**os.environ, "PYTHONPATH": str(ROOT), "CAPER_STATE_DIR": str(tmp_path / "state"),
             "HOME": str(tmp_path), "CAPER_CONFIG": str(tmp_path / "none.toml")})

    async def roots(context):
        return ListRootsResult(roots=[Root(uri=project.as_uri())])

    async def main():
        # The initialize handshake: the era in which a server may ask for roots mid-call.
        async with Client(params, list_roots_callback=roots, mode="legacy") as client:
            inside = await client.call_tool("run_command", {"command": "echo in > in.txt",
                                                            "task": "write in.txt",
                                                            "cwd": str(project)})
            outside = await client.call_tool("run_command", {"command": "echo out > out.txt",
                                                             "task": "write out.txt",
                                                             "cwd": str(other)})
            return inside, outside
    inside, outside = asyncio.run(main())
    assert not inside.is_error and (project / "in.txt").exists()
    assert outside.is_error and "outside the roots" in outside.content[0].text
    assert not (other / "out.txt").exists()


def test_an_mcp_task_is_the_agents_statement_and_licenses_no_deletion(project, tmp_path):
    """adv3b F14: `task` is written by the agent; like a task read from a
    transcript it is evidence, never the user's licence to delete sources."""
    from mcp import Client, StdioServerParameters
    params = StdioServerParameters(
        command=sys.executable, args=["-m", "caper", "mcp"], cwd=str(project),
        env={**os.environ, "PYTHONPATH": str(ROOT), "CAPER_STATE_DIR": str(tmp_path / "state"),
             "HOME": str(tmp_path), "CAPER_CONFIG": str(tmp_path / "none.toml")})

    async def main():
        async with Client(params) as client:
            return await client.call_tool("run_command", {"command": "rm -rf src",
                                                          "task": "delete the src directory",
                                                          "cwd": str(project)})
    out = asyncio.run(main())
    assert out.is_error and "blocked" in out.content[0].text
    assert (project / "src" / "a.c").read_text() == "int a;\n"
    # The same words from the API's caller (its own task) still license it.
    done = caper.Gate(str(project), approver="policy", config=Config(),
                      state_dir=str(tmp_path / "state"),
                      env={**os.environ, "HOME": str(tmp_path)}).run(
        "rm -rf src", task="delete the src directory")
    assert done.committed and not (project / "src").exists()


def test_examples_run(project, tmp_path):
    env = {**os.environ, "PATH": f"{BIN}:{os.environ['PATH']}",
           "CAPER_STATE_DIR": str(tmp_path / "state"), "HOME": str(tmp_path)}
    ex = ROOT / "examples"
    p = subprocess.run([sys.executable, str(ex / "python_api.py"), str(project)],
                       env=env, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    assert "allowed: make-notes" in p.stdout and "blocked: wipe-sources" in p.stdout
    p = subprocess.run([str(ex / "claude_code_hook.sh"), str(project), "echo via-hook > h.txt"],
                       env=env, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    assert (project / "h.txt").read_text() == "via-hook\n" and "Claude Code now runs" in p.stderr
    p = subprocess.run([sys.executable, str(ex / "mcp_client.py"), str(project),
                        "echo via-mcp > m.txt", "write m.txt"], env=env, capture_output=True,
                       text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    assert p.stdout.startswith("exit status 0") and (project / "m.txt").exists()
    servers = json.loads((ex / "mcp-servers.json").read_text())
    assert servers["mcpServers"]["caper"] == {"command": "caper", "args": ["mcp"]}


def test_an_mcp_workspace_never_reaches_above_the_clients_root(tmp_path):
    """The adversarial round: a client scoped to repo/app, the git top level
    at repo: caper's workspace was repo, so `rm -rf ../lib` deleted "the
    project's" tracked files. Now the workspace stops at the root, and what
    lies beyond it is judged as outside."""
    from caper.front.api import Gate
    from caper.front.mcp_server import workspace_dir
    repo = git_project(tmp_path / "repo", {"app/main.c": "int main;\n", "lib/x.c": "int x;\n"})
    app = str(repo / "app")
    assert workspace_dir(app, [app]) == (app, app)
    assert workspace_dir(app, [str(repo)]) == (app, str(repo))
    assert workspace_dir(app, None) == (app, None)
    out = Gate(approver="block", state_dir=str(tmp_path / "state"),
               env={**os.environ, "HOME": str(tmp_path)}).run("rm -rf ../lib", cwd=app,
                                                               workspace=app)
    assert out.report.workspace == app
    assert all(c.where != "tracked" for c in out.report.changes), out.report.card()
