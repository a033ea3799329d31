"""cffi build of caper's native core (API mode, out of line).

The cdef is csrc/caper.h itself, read from disk: the one header the C files
include is the one Python sees, so the boundary cannot drift.
"""
from pathlib import Path

from cffi import FFI

ROOT = Path(__file__).resolve().parent.parent
CSRC = ROOT / "csrc"
SOURCES = ["run.c", "ns.c", "mount.c", "seccomp.c", "sysent.c", "trace.c", "emit.c",
           "paths.c", "output.c"]

ffi = FFI()
ffi.cdef((CSRC / "caper.h").read_text())
ffi.set_source(
    "caper_native._caper",
    '#include "internal.h"\n',
    sources=[str((CSRC / name).relative_to(ROOT)) for name in SOURCES],
    include_dirs=[str(CSRC.relative_to(ROOT))],
    extra_compile_args=["-std=gnu11", "-O2", "-Wall", "-Wextra", "-Wno-unused-parameter",
                        "-Wno-missing-field-initializers"],
    libraries=["pthread"],
)

if __name__ == "__main__":
    ffi.compile(verbose=True)
