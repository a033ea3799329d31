"""The bounded effect report: what a command did, small enough to judge."""
