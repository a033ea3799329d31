from setuptools import setup

# bin/caper, not a [project.scripts] entry point: pip's generated console
# script starts Python without -E, and would import a caper/ from PYTHONPATH.
setup(cffi_modules=["caper_native/build.py:ffi"], scripts=["bin/caper"])
