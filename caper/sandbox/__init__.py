"""Run a command in the sandbox and stream what it does: the native core, its events, its limits."""
