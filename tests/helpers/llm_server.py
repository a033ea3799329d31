"""A local HTTP server that speaks the two LLM protocols caper uses:
OpenAI-compatible chat completions and Anthropic messages. The only stand-in
the project allows: no model is reachable from here. Each test sets what the
"model" answers (`behaviour`), and reads the requests it received.

Shapes follow the public API references: OpenAI chat completions
(https://platform.openai.com/docs/api-reference/chat/create: choices[0].message
.content / .refusal, response_format json_schema) and Anthropic messages
(https://docs.anthropic.com/en/api/messages: content[] with type tool_use,
stop_reason, tool_choice {"type": "tool"})."""
from __future__ import annotations

import json
import time

from helpers.http import JsonServer

GOOD = {"decision": "block", "confidence": 0.9, "risk_level": "high",
        "reason": "deletes tracked sources the task did not ask for",
        "boundary": "destroying tracked files"}


class LlmServer(JsonServer):
    def __init__(self):
        self.requests: list[tuple[str, dict, dict]] = []   # path, headers, body
        self.behaviour = "good"
        self.answer = dict(GOOD)
        self.delay = 0.0
        super().__init__()

    def post(self, path: str, headers: dict, body: dict) -> tuple:
        self.requests.append((path, headers, body))
        if self.delay:
            time.sleep(self.delay)
        return self.respond(path, body)

    def respond(self, path: str, body: dict) -> tuple[int, dict | bytes]:
        b = self.behaviour
        if b == "http500":
            return 500, {"error": {"message": "internal"}}
        if path.endswith("/chat/completions"):
            fmt = body.get("response_format", {}).get("type")
            if b == "no-json-schema" and fmt == "json_schema":   # llama.cpp's server
                return 500, {"error": {"message": "json_schema unsupported"}}
            content = json.dumps(self.answer)
            if b == "garbage":
                content = "I think this is fine, go ahead!"
            elif b == "truncated":
                content = content[: len(content) // 2]
            elif b == "fenced":
                content = "```json\n" + content + "\n```"
            msg = {"role": "assistant", "content": content}
            if b == "refusal":
                msg = {"role": "assistant", "content": None, "refusal": "I can't help with that."}
            if b == "not-json-body":
                return 200, b"<html>proxy error</html>"
            return 200, {"id": "x", "object": "chat.completion",
                         "choices": [{"index": 0, "message": msg, "finish_reason": "stop"}]}
        if path.endswith("/v1/messages"):
            if b == "refusal":
                return 200, {"type": "message", "content": [], "stop_reason": "refusal"}
            if b == "no-tool":
                return 200, {"type": "message", "stop_reason": "end_turn",
                             "content": [{"type": "text", "text": "allow"}]}
            return 200, {"type": "message", "stop_reason": "tool_use", "content": [
                {"type": "text", "text": "Recording."},
                {"type": "tool_use", "id": "t1", "name": "record_verdict", "input": self.answer}]}
        return 404, {"error": "not found"}
