"""Host primitives: syscalls ctypes lacks, the mount table, the helper programs caper runs."""
