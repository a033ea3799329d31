"""The run's copy-on-write view of the machine: overlay layers, or a btrfs snapshot of the workspace."""
