from setuptools import setup

setup(cffi_modules=["caper_native/build.py:ffi"])
