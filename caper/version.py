"""caper's version, for `caper --version` and the package's metadata."""
VERSION = "0.1.0"
