"""MCP: `caper mcp` is a stdio MCP server (the official `mcp` SDK) with one
tool, `run_command`, that runs a shell command through the gate and returns
its output, or the block reason and the effect card.

Client configuration (Claude Desktop, Cursor, any MCP host):

    {"mcpServers": {"caper": {"command": "caper", "args": ["mcp"]}}}

The server process is one agent session: its approver sees the history of
the commands it ran, and its circuit breaker counts their blocks.
"""
from __future__ import annotations

import os
import sys

from caper.display import escape

INSTRUCTIONS = (
    "Run shell commands with run_command. Each command runs once in a sandbox; its effects "
    "(file changes, network attempts, credential reads) are judged against the task you give, "
    "and kept only if approved. Always pass the user's request as `task`. A blocked command "
    "changed nothing: read the reason and the effect card, and do not retry it unchanged.")


def build_server():
    from mcp.server.mcpserver import MCPServer

    from caper.api import Gate

    server = MCPServer(name="caper", instructions=INSTRUCTIONS)
    gate = Gate(session=f"mcp-{os.getpid()}")

    @server.tool(description="Run a shell command once, in caper's sandbox; keep its effects "
                             "only if they fit the task. Returns the output, or why it was "
                             "blocked and what it would have done.")
    async def run_command(command: str, task: str = "", cwd: str = "") -> str:
        where = os.path.abspath(cwd) if cwd else os.getcwd()
        try:
            out = await gate.arun(command, task=task or None, cwd=where)
        except Exception as e:   # a failure of caper's is a block, said plainly
            return f"caper blocked this command: caper failed ({escape(str(e))}). " \
                   "Nothing was changed."
        # Run-derived text, escaped: the host may show it to its human.
        if out.committed:
            return f"exit status {out.exit_code}\n{escape(out.output, keep_lines=True)}"
        card = out.report.card() if out.report is not None else ""
        return (f"caper blocked this command; nothing was changed.\nreason: "
                f"{escape(out.reason)}\n\n{escape(card, keep_lines=True)}")

    return server


def main() -> int:
    try:
        import mcp.server.mcpserver  # noqa: F401  (the optional extra)
    except ImportError as e:
        print(f"caper: caper mcp needs the MCP SDK, which is not installed ({e}): "
              "pip install 'caper[mcp]'", file=sys.stderr)
        return 1
    build_server().run("stdio")
    return 0
