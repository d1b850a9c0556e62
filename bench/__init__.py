"""The wschat benchmark: ``python -m bench`` (see bench/__main__.py)."""
