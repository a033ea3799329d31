"""caper: run an agent's shell command for real in a sandbox, watch what it
does at the syscall level, and let an independent approver decide whether the
run counts. This package is the Python side; the native core is caper_native."""
__version__ = "0.1.0"
