"""A local stand-in for the three model APIs the real agent CLIs speak, so
the tests can run Claude Code, Codex CLI and Gemini CLI themselves: the
"model" asks for one shell command per turn from a script, then ends the
turn, and the server keeps what the client told it (every request body,
and the tool results in order).

- Anthropic Messages (`POST /v1/messages`, SSE: message_start,
  content_block_start/delta/stop, message_delta with stop_reason,
  message_stop); https://docs.anthropic.com/en/api/messages-streaming
- OpenAI Responses (`POST /v1/responses`, SSE: response.created,
  response.output_item.done, response.completed);
  https://platform.openai.com/docs/api-reference/responses-streaming
- Gemini (`POST /v1beta/models/M:streamGenerateContent?alt=sse` and
  `:generateContent`, candidates[].content.parts[] with functionCall /
  functionResponse); https://ai.google.dev/api/generate-content

`script(results)` gives the next command to ask for (results: the tool
results the model has seen in this conversation), or None to end the turn;
a command is a string, or (string, more tool input) such as Claude Code's
Bash `timeout`.
A request that does not offer the shell tool (titles, summaries) is
answered with plain text.
"""
from __future__ import annotations

import json
import threading
import time
from typing import Callable

from helpers.http import JsonServer

SHELL_TOOLS = {"anthropic": "Bash", "openai": "exec_command", "gemini": "run_shell_command"}
DONE_TEXT = "Done."


def commands(*cmds: str) -> Callable[[list[str]], str | None]:
    """A script that asks for cmds one after the other."""
    return lambda results: cmds[len(results)] if len(results) < len(cmds) else None


def _text(content) -> str:
    """A tool result's text: a string, or text parts."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(_text(c.get("text", c.get("content", ""))) if isinstance(c, dict)
                         else str(c) for c in content)
    if isinstance(content, dict):
        return json.dumps(content)
    return str(content)


class ModelServer(JsonServer):
    http_version = "HTTP/1.1"

    def __init__(self, protocol: str, script: Callable[[list[str]], str | None]):
        assert protocol in SHELL_TOOLS
        self.protocol, self.script = protocol, script
        self.requests: list[tuple[str, dict]] = []     # (path, body) of every POST
        # (time.monotonic(), tool results so far) of each request offering the shell tool
        self.turns: list[tuple[float, int]] = []
        self.results: list[str] = []                    # tool results, latest conversation
        self.asked: list[str] = []                      # commands the model asked for
        self.lock = threading.Lock()
        super().__init__()

    def get(self, path: str) -> tuple:
        return 200, {"data": [], "models": []}

    def post(self, path: str, headers: dict, body: dict) -> tuple:
        with self.lock:
            self.requests.append((path, body))
            events, plain = self.respond(path, body)
        if events is None:
            return 200, plain
        return 200, "".join((f"event: {name}\n" if name else "") + f"data: {json.dumps(doc)}\n\n"
                            for name, doc in events).encode(), "text/event-stream"

    def call_times(self) -> list[float]:
        """Each shell call as the model sees it: from the answer asking for
        it to the request carrying its result."""
        first: dict[int, float] = {}                        # the first request with n results
        for t, n in self.turns:
            first.setdefault(n, t)
        return [first[n] - first[n - 1] for n in sorted(first) if n and n - 1 in first]

    # --- one turn ------------------------------------------------------------------------------

    def _next(self, results: list[str]) -> tuple[str, dict] | None:
        self.turns.append((time.monotonic(), len(results)))
        self.results = results
        cmd = self.script(results)
        if cmd is None:
            return None
        cmd, more = cmd if isinstance(cmd, tuple) else (cmd, {})
        self.asked.append(cmd)
        return cmd, more

    def respond(self, path: str, body: dict):
        """(SSE events or None, the JSON answer when not streamed)."""
        if self.protocol == "anthropic":
            return self._anthropic(path, body)
        if self.protocol == "openai":
            return self._openai(body)
        return self._gemini(path, body)

    def _anthropic(self, path: str, body: dict):
        if "count_tokens" in path:
            return None, {"input_tokens": 10}
        offered = any(t.get("name") == "Bash" for t in body.get("tools") or [])
        results = [_text(b.get("content")) for m in body.get("messages") or []
                   if m.get("role") == "user" and isinstance(m.get("content"), list)
                   for b in m["content"] if isinstance(b, dict) and b.get("type") == "tool_result"]
        cmd = self._next(results) if offered else None
        n = len(self.requests)
        if cmd is not None and "tool" in cmd[1]:      # another tool: ("label", {"tool", "input"})
            block = {"type": "tool_use", "id": f"toolu_{n:04d}", "name": cmd[1]["tool"],
                     "input": {}}
            delta = {"type": "input_json_delta", "partial_json": json.dumps(cmd[1]["input"])}
            stop = "tool_use"
        elif cmd is not None:
            block = {"type": "tool_use", "id": f"toolu_{n:04d}", "name": "Bash", "input": {}}
            delta = {"type": "input_json_delta", "partial_json": json.dumps(
                {"command": cmd[0], "description": "run it", **cmd[1]})}
            stop = "tool_use"
        else:
            block = {"type": "text", "text": ""}
            delta = {"type": "text_delta", "text": DONE_TEXT}
            stop = "end_turn"
        usage = {"input_tokens": 10, "output_tokens": 1}
        if not body.get("stream"):
            content = [{**block, "input": json.loads(delta["partial_json"])}] if cmd is not None \
                else [{"type": "text", "text": DONE_TEXT}]
            return None, {"id": f"msg_{n}", "type": "message", "role": "assistant",
                          "model": body.get("model", "m"), "content": content,
                          "stop_reason": stop, "stop_sequence": None, "usage": usage}
        return [("message_start", {"type": "message_start", "message": {
                    "id": f"msg_{n}", "type": "message", "role": "assistant",
                    "model": body.get("model", "m"), "content": [], "stop_reason": None,
                    "stop_sequence": None, "usage": usage}}),
                ("content_block_start", {"type": "content_block_start", "index": 0,
                                         "content_block": block}),
                ("content_block_delta", {"type": "content_block_delta", "index": 0,
                                         "delta": delta}),
                ("content_block_stop", {"type": "content_block_stop", "index": 0}),
                ("message_delta", {"type": "message_delta",
                                   "delta": {"stop_reason": stop, "stop_sequence": None},
                                   "usage": {"output_tokens": 5}}),
                ("message_stop", {"type": "message_stop"})], None

    def _openai(self, body: dict):
        items = body.get("input") or []
        offered = any(t.get("name") == "exec_command" for t in body.get("tools") or [])
        results = [_text(i.get("output")) for i in items
                   if isinstance(i, dict) and i.get("type") == "function_call_output"]
        cmd = self._next(results) if offered else None
        n = len(self.requests)
        if cmd is not None:
            item = {"type": "function_call", "id": f"fc_{n}", "call_id": f"call_{n}",
                    "name": "exec_command", "arguments": json.dumps({"cmd": cmd[0], **cmd[1]})}
        else:
            item = {"type": "message", "id": f"msg_{n}", "role": "assistant", "status": "completed",
                    "content": [{"type": "output_text", "text": DONE_TEXT, "annotations": []}]}
        resp = {"id": f"resp_{n}", "object": "response", "status": "completed",
                "model": body.get("model", "m"), "output": [item],
                "usage": {"input_tokens": 10, "input_tokens_details": {"cached_tokens": 0},
                          "output_tokens": 5, "output_tokens_details": {"reasoning_tokens": 0},
                          "total_tokens": 15}}
        return [("response.created", {"type": "response.created",
                                      "response": {**resp, "status": "in_progress",
                                                   "output": []}}),
                ("response.output_item.added", {"type": "response.output_item.added",
                                                "output_index": 0, "item": item}),
                ("response.output_item.done", {"type": "response.output_item.done",
                                               "output_index": 0, "item": item}),
                ("response.completed", {"type": "response.completed", "response": resp})], None

    def _gemini(self, path: str, body: dict):
        if ":countTokens" in path:
            return None, {"totalTokens": 10}
        offered = any(f.get("name") == "run_shell_command" for t in body.get("tools") or []
                      for f in t.get("functionDeclarations") or [])
        results = [_text((p["functionResponse"].get("response") or {}).get(
                       "output", p["functionResponse"].get("response")))
                   for c in body.get("contents") or [] for p in c.get("parts") or []
                   if isinstance(p, dict) and "functionResponse" in p]
        cmd = self._next(results) if offered else None
        if cmd is not None and "tool" in cmd[1]:      # another tool: ("label", {"tool", "input"})
            part = {"functionCall": {"name": cmd[1]["tool"], "args": cmd[1]["input"]}}
        elif cmd is not None:
            part = {"functionCall": {"name": "run_shell_command",
                                     "args": {"command": cmd[0], **cmd[1]}}}
        elif "generationConfig" in body and \
                (body["generationConfig"].get("responseMimeType") == "application/json"):
            # Gemini's side questions (next speaker, routing) want JSON back.
            part = {"text": json.dumps({"next_speaker": "user", "reasoning": "done",
                                        "model_choice": "flash"})}
        else:
            part = {"text": DONE_TEXT}
        doc = {"candidates": [{"content": {"role": "model", "parts": [part]},
                               "finishReason": "STOP", "index": 0}],
               "usageMetadata": {"promptTokenCount": 10, "candidatesTokenCount": 5,
                                 "totalTokenCount": 15},
               "modelVersion": "gemini-2.5-flash"}
        if "streamGenerateContent" in path:
            return [(None, doc)], None
        return None, doc
