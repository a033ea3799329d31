"""The user's own words, from an agent's transcript: the hooks' fallback when
no prompt event recorded them (caper.front.tasks).

Only what the human typed counts. Each agent also stores, as "user"
messages, text the human never wrote, and a repository controls some of it:

- Claude Code (JSON lines {"type": "user", "message": {"role", "content"}}):
  meta messages (`isMeta`), compaction summaries (`isCompactSummary`),
  sub-agent conversations (`isSidechain`), tool results, slash-command and
  `!` shell blocks (`<command-name>`, `<local-command-stdout>`,
  `<bash-input>` ...), `<system-reminder>` parts.
- Codex (rollout JSON lines): `response_item` user messages carry AGENTS.md
  (`# AGENTS.md instructions for ...`, `<user_instructions>`),
  `<environment_context>`, skills, sub-agent notifications and compaction
  summaries; the `event_msg` of type `user_message` holds only what the
  human typed, so where a rollout has those, only those count.
- Gemini CLI (JSON lines of message records {"id", "type": "user",
  "content", "displayContent"}, `{"$rewindTo": id}` records that drop the
  messages from id on; older versions: one JSON document with "messages"):
  `/` and `?` commands, `<session_context>` and `<hook_context>` blocks;
  `displayContent` (what the user typed, before @file expansion) is
  preferred.

The whole file is read (a tool result of any size cannot push the user's
words out of view), up to MAX_TRANSCRIPT; no user text at all is None,
which the approver treats as the strictest case.
"""
from __future__ import annotations

import json

from caper.front.tasks import task_text

MAX_TRANSCRIPT = 256 << 20
# Text the agents inject as a "user" message (compared after strip()).
INJECTED = ("<environment_context>", "<user_instructions>", "# AGENTS.md instructions",
            "<INSTRUCTIONS>", "<skill", "<subagent", "<turn_aborted>", "<user_shell_command>",
            "<system-reminder>", "<command-name>", "<command-message>", "<command-args>",
            "<local-command-", "Caveat: The messages below were generated", "<bash-input>",
            "<bash-stdout>", "<bash-stderr>", "<session_context>", "<hook_context>",
            "This session is being continued from a previous conversation",
            "Another language model started to solve this problem", "<user-memory-input>",
            "<user-prompt-submit-hook>", "<session-start-hook>")
_CLAUDE_NOT_TYPED = ("isMeta", "isCompactSummary", "isSidechain", "isVisibleInTranscriptOnly")


def _typed(text: object) -> str | None:
    if not isinstance(text, str):
        return None
    t = text.strip()
    if not t or t.startswith(INJECTED):
        return None
    return t


def _parts(content: object) -> str | None:
    """Text of a message's content: a string, or text parts (tool results and
    injected parts dropped)."""
    if isinstance(content, str):
        return _typed(content)
    if isinstance(content, dict):
        content = [content]
    if not isinstance(content, list):
        return None
    texts = [_typed(b.get("text")) for b in content if isinstance(b, dict)
             and b.get("type", "text") in ("text", "input_text")]
    return "\n".join(t for t in texts if t) or None


class _Reader:
    def __init__(self) -> None:
        self.events: list[str] = []          # Codex user_message events
        self.items: dict[object, str] = {}   # other user messages, in order, by id

    def entry(self, e: object, n: int) -> None:
        if not isinstance(e, dict):
            return
        if isinstance(e.get("$rewindTo"), str):          # Gemini: drop from that id on
            ids = list(self.items)
            cut = ids.index(e["$rewindTo"]) if e["$rewindTo"] in ids else 0
            for k in ids[cut:]:
                del self.items[k]
            return
        payload = e.get("payload")
        if e.get("type") == "event_msg" and isinstance(payload, dict):
            if payload.get("type") == "user_message":
                t = _typed(payload.get("message"))
                if t:
                    self.events.append(t)
            return
        if e.get("type") == "response_item" and isinstance(payload, dict):
            if payload.get("type") == "message" and payload.get("role") == "user":
                self._add(n, _parts(payload.get("content")))
            return
        msg = e.get("message")
        if isinstance(msg, dict):                          # Claude Code
            if e.get("type") == "user" and msg.get("role") == "user" and \
                    not any(e.get(k) for k in _CLAUDE_NOT_TYPED):
                self._add(n, _parts(msg.get("content")))
            return
        if e.get("type") == "user":                        # Gemini
            shown = e.get("displayContent")
            text = _parts(shown if shown else e.get("content"))
            # Gemini's own rule (isIgnoredUserContent): / and ? lines are its commands
            self._add(e.get("id", n), None if text and text.startswith(("/", "?")) else text)

    def _add(self, key: object, text: str | None) -> None:
        if text:
            self.items.pop(key, None)
            self.items[key] = text

    def prompts(self) -> list[str]:
        return self.events or list(self.items.values())


def task_from_transcript(path: str | None) -> str | None:
    """The user's latest words in the transcript at path, or None."""
    if not path:
        return None
    try:
        with open(path, "rb") as f:
            data = f.read(MAX_TRANSCRIPT + 1)
    except OSError:
        return None
    if len(data) > MAX_TRANSCRIPT:
        return None
    r = _Reader()
    try:
        doc = json.loads(data)    # JSON lines fail at once, after their first line
    except ValueError:
        doc = None
    if isinstance(doc, list) or isinstance(doc, dict) and isinstance(doc.get("messages"), list):
        for n, e in enumerate(doc if isinstance(doc, list) else doc["messages"]):
            r.entry(e, n)         # one JSON document (Gemini CLI before JSON lines)
        return task_text(r.prompts())
    for n, line in enumerate(data.split(b"\n")):
        # Only lines that can hold a user message or a rewind are parsed.
        if b'"user' not in line and b"$rewindTo" not in line:
            continue
        try:
            r.entry(json.loads(line), n)
        except ValueError:
            continue     # a line being written, or not JSON: not the user's words
    return task_text(r.prompts())
