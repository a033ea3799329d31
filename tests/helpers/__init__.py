"""Helpers the test files share (imported as `from helpers.<module> import ...`)."""
