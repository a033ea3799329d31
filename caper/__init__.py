"""caper: run an agent's shell command for real in a sandbox, watch what it
does at the syscall level, and let an independent approver decide whether the
run counts. This package is the Python side; the native core is caper_native."""
from caper.version import VERSION as __version__


def __getattr__(name: str):
    # caper.run without importing the transaction machinery at `import caper`.
    if name == "run":
        from caper.transaction import run
        return run
    if name == "Gate":
        from caper.front.api import Gate
        return Gate
    raise AttributeError(f"module 'caper' has no attribute {name!r}")
