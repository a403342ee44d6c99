"""A real MCP server over streamable HTTP for the kernel's tests, on the
official Python SDK (PyPI `mcp`): tools with and without structured
output, one that raises, a resource and a prompt. It binds 127.0.0.1:0,
prints the port on its first line, and exits when its stdin closes."""

import asyncio
import os
import socket
import sys
import threading

import uvicorn
from pydantic import BaseModel

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError

app = MCPServer("gsv-test", instructions="Arithmetic and echo tools for gsv's tests.")


class Sum(BaseModel):
    sum: int


@app.tool(structured_output=False)
def echo(message: str) -> str:
    """Returns the message."""
    return message


@app.tool(name="get-sum")
def get_sum(a: int, b: int) -> Sum:
    """Adds two integers."""
    return Sum(sum=a + b)


@app.tool()
def explode(reason: str) -> str:
    """Always fails (ToolError: its message reaches the client)."""
    raise ToolError(f"exploded: {reason}")


@app.resource("test://greeting")
def greeting() -> str:
    return "hello"


@app.prompt()
def ask(topic: str) -> str:
    return f"Tell me about {topic}."


def exit_when_stdin_closes() -> None:
    sys.stdin.read()
    os._exit(0)


async def main() -> None:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    sock.listen(64)
    print(sock.getsockname()[1], flush=True)
    config = uvicorn.Config(app.streamable_http_app(), log_level="warning")
    await uvicorn.Server(config).serve(sockets=[sock])


if __name__ == "__main__":
    threading.Thread(target=exit_when_stdin_closes, daemon=True).start()
    asyncio.run(main())
