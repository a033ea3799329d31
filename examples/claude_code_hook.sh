#!/bin/sh
# What Claude Code does with caper's PreToolUse hook, by hand: feed the hook
# the JSON Claude Code sends for a Bash call, then run the command it hands
# back. Usage: examples/claude_code_hook.sh /path/to/a/git/project 'make clean && make'
set -eu
project=$1
command=$2
cd "$project"
input=$(python3 -c 'import json, sys; print(json.dumps({
    "session_id": "example-session", "transcript_path": None, "cwd": sys.argv[1],
    "permission_mode": "default", "hook_event_name": "PreToolUse", "tool_name": "Bash",
    "tool_input": {"command": sys.argv[2], "description": "example"},
    "tool_use_id": "toolu_example"}))' "$project" "$command")
answer=$(printf '%s' "$input" | caper hook claude-code)
echo "hook answered: $answer" >&2
rewritten=$(printf '%s' "$answer" | python3 -c 'import json, sys
spec = json.load(sys.stdin)["hookSpecificOutput"]
if spec["permissionDecision"] != "allow":
    sys.exit("denied: " + spec["permissionDecisionReason"])
print(spec["updatedInput"]["command"])')
echo "Claude Code now runs: $rewritten" >&2
exec bash -c "$rewritten"
