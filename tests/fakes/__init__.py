"""Test doubles that stand in for real parts: an engine that replies from a script."""
