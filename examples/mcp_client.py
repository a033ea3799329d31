"""An MCP client (the official SDK) that runs commands through `caper mcp`.

    python3 examples/mcp_client.py /path/to/project 'echo hi > hi.txt' 'write hi.txt'
"""
import asyncio
import os
import sys

from mcp import Client, StdioServerParameters


async def main(project: str, command: str, task: str) -> None:
    server = StdioServerParameters(command="caper", args=["mcp"], cwd=project)
    async with Client(server) as client:
        result = await client.call_tool("run_command", {"command": command, "task": task,
                                                        "cwd": os.path.abspath(project)})
        print(result.content[0].text)


if __name__ == "__main__":
    asyncio.run(main(*sys.argv[1:4]))
