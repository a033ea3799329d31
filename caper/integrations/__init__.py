"""Adapters that put caper in front of the agents people use. Each is thin:
it turns the agent's hook input into one `caper run` and caper's verdict
into the agent's answer, and fails closed (a broken hook denies)."""
