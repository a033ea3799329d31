"""Apply an approved run's changes to the real tree, journaled, or undo them; recover after a crash."""
