"""cffi build of caper's native core (API mode, out of line).

The cdef is csrc/caper.h itself, read from disk: the one header the C files
include is the one Python sees, so the boundary cannot drift.
"""
import os
import shlex
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

from cffi import FFI

ROOT = Path(__file__).resolve().parent.parent
CSRC = ROOT / "csrc"
SOURCES = ["run.c", "ns.c", "mount.c", "seccomp.c", "sysent.c", "trace.c", "emit.c",
           "paths.c", "output.c", "unixsock.c", "names.c",
           "credstop.c"]



def _check_toolchain() -> None:
    """Building needs a C compiler and Python's headers, which a Debian/Ubuntu
    host has only with gcc and python3-dev: say so before setuptools fails on
    a missing file."""
    cc = shlex.split(os.environ.get("CC") or sysconfig.get_config_var("CC") or "cc")[0]
    header = Path(sysconfig.get_paths()["include"]) / "Python.h"
    missing = [what for what, ok in ((f"a C compiler ({cc})", shutil.which(cc)),
                                     (f"Python's headers ({header})", header.is_file())) if not ok]
    if missing:
        raise SystemExit(f"caper's native core cannot be built: {' and '.join(missing)} "
                         "missing (on Debian/Ubuntu: apt-get install gcc python3-dev)")


_check_toolchain()
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

CLIENT = ROOT / "caper_native" / "caper-client"


def build_client() -> None:
    """csrc/client.c -> caper_native/caper-client, the exec-cheap `caper hook`
    and `caper run` (caper.front.hooks.caper_command), with this Python baked
    in for what it hands to the Python CLI; caper-client.python names that
    Python, so that only a caper running under it uses this client."""
    cc = shlex.split(os.environ.get("CC") or sysconfig.get_config_var("CC") or "cc")
    tmp = CLIENT.with_name(f"caper-client.{os.getpid()}.tmp")
    cmd = [*cc, "-std=gnu11", "-O2", "-Wall", "-Wextra", "-Wno-unused-parameter",
           f"-DCAPER_PYTHON={json_c_string(sys.executable)}", "-o", str(tmp),
           str(CSRC / "client.c")]
    print(" ".join(shlex.quote(c) for c in cmd))
    subprocess.run(cmd, check=True)
    os.replace(tmp, CLIENT)
    CLIENT.with_name("caper-client.python").write_text(sys.executable + "\n")


def json_c_string(s: str) -> str:
    """s as a C string literal (a JSON string is one, for a path)."""
    import json
    return json.dumps(s)


if __name__ == "__main__":
    ffi.compile(verbose=True)
    build_client()
