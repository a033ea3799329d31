"""MCP: `caper mcp` is a stdio MCP server (the official `mcp` SDK) with one
tool, `run_command`, that runs a shell command through the gate and returns
its output, or, as a tool error (isError), the block reason and the effect
card, or caper's own failure.

Client configuration (Claude Desktop, Cursor, any MCP host):

    {"mcpServers": {"caper": {"command": "caper", "args": ["mcp"]}}}

The server process is one agent session: its approver sees the history of
the commands it ran, and its circuit breaker counts their blocks. Each call
names its workspace (`cwd`, absolute, existing, not `/`); a client that
declares roots keeps the server inside them.
"""

import importlib
import os
import sys
from urllib.parse import unquote, urlparse

from caper.display import escape

INSTRUCTIONS = (
    "Run shell commands with run_command. Each command runs once in a sandbox; its effects "
    "(file changes, network attempts, credential reads) are judged against the task you give, "
    "and kept only if approved. Always pass the user's request as `task` and the project's "
    "absolute path as `cwd`. A blocked command changed nothing: read the reason and the effect "
    "card, and do not retry it unchanged.")


def root_paths(roots) -> list[str]:
    """The local directories of a roots/list answer (file:// URIs only)."""
    out = []
    for r in roots:
        uri = urlparse(str(r.uri))
        if uri.scheme == "file" and uri.netloc in ("", "localhost"):
            out.append(os.path.realpath(unquote(uri.path)))
    return out


def workspace_dir(cwd: str, roots: list[str] | None) -> tuple[str, str | None]:
    """The directory a call runs in: absolute, existing, not the root
    directory, and inside one of the client's roots when it declared any;
    ValueError (its text for the model) otherwise. And its workspace: the
    git top level above it, but never above the root it lies in (a client
    scoped to one package of a monorepo): what lies beyond the root is
    outside, and judged so. None: caper finds it."""
    if not cwd or not os.path.isabs(cwd):
        raise ValueError(f"cwd must be the absolute path of the project, not {cwd!r}")
    real = os.path.realpath(cwd)
    if not os.path.isdir(real):
        raise ValueError(f"cwd {cwd!r} is not an existing directory")
    if real == "/":
        raise ValueError("cwd is the root directory: name the project's directory")
    if roots is not None and not any(real == r or real.startswith(r.rstrip("/") + "/")
                                     for r in roots):
        raise ValueError(f"cwd {cwd!r} is outside the roots this client declared "
                      f"({', '.join(roots) or 'none'})")
    if roots is None:
        return real, None
    from caper.report.workspace import find_workspace
    root = max((r for r in roots if real == r or real.startswith(r.rstrip("/") + "/")), key=len)
    top = find_workspace(real)
    return real, top if top == root or top.startswith(root.rstrip("/") + "/") else root


def build_server():
    from mcp.server.mcpserver import Context, MCPServer
    from mcp.shared.exceptions import NoBackChannelError
    from mcp.types import CallToolResult, ClientCapabilities, RootsCapability, TextContent

    from caper.front.api import Gate

    server = MCPServer(name="caper", instructions=INSTRUCTIONS)
    gate = Gate(session=f"mcp-{os.getpid()}")

    def result(text: str, error: bool) -> CallToolResult:
        return CallToolResult(content=[TextContent(type="text", text=text)], is_error=error)

    async def client_roots(ctx: Context) -> list[str] | None:
        """The client's roots; None if it declares none, or cannot be asked
        during a call (a 2026-07-28 connection without a back-channel)."""
        session = ctx.session
        if not session.check_client_capability(ClientCapabilities(roots=RootsCapability())):
            return None
        try:
            return root_paths((await session.list_roots()).roots)
        except NoBackChannelError:
            return None

    @server.tool(description="Run a shell command once, in caper's sandbox, in the project at "
                             "`cwd` (an absolute path); keep its effects only if they fit the "
                             "task. Returns the output, or (as an error) why it was blocked and "
                             "what it would have done.")
    async def run_command(command: str, cwd: str, ctx: Context, task: str = "") -> CallToolResult:
        try:
            roots = await client_roots(ctx)
        except Exception as e:   # the roots could not be read: their limits are unknown
            return result(f"caper did not run this command: the client's roots could not be "
                          f"read ({e})", True)
        try:
            where, workspace = workspace_dir(cwd, roots)
        except ValueError as e:
            return result(f"caper did not run this command: {e}", True)
        try:
            out = await gate.arun(command, task=task or None, cwd=where, workspace=workspace,
                                  task_from_agent=True)
        except Exception as e:   # a failure of caper's is a block, said plainly
            return result(f"caper blocked this command: caper failed ({escape(str(e))}). "
                          "Nothing was changed.", True)
        # Run-derived text, escaped: the host may show it to its human.
        if out.committed:
            return result(f"exit status {out.exit_code}\n{escape(out.output, keep_lines=True)}",
                          False)
        return result(f"caper blocked this command; nothing was changed.\nreason: "
                      f"{escape(out.agent_reason)}\n\n{escape(out.card() or '', keep_lines=True)}",
                      True)

    return server


def main() -> int:
    try:
        importlib.import_module("mcp.server.mcpserver")   # the optional extra
    except ImportError as e:
        print(f"caper: caper mcp needs the MCP SDK, which is not installed ({e}): "
              "pip install 'caper[mcp]'", file=sys.stderr)
        return 1
    build_server().run("stdio")
    return 0
