"""Run a command in the sandbox and stream what it does: the native core, its events, its limits."""

# A run's time limit unless the caller says: the one definition, for the
# sandbox (trace) and for the run's options (caper.request), which reads it
# here because this package's __init__ imports nothing.
DEFAULT_TIMEOUT_S = 600.0
