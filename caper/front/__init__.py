"""The front doors: the CLI, the resident gate, the Python API, the agents' hooks, MCP, the demo."""
