"""The only module that touches the cffi objects of the native core."""
from caper_native._caper import ffi, lib

__all__ = ["ffi", "lib"]
