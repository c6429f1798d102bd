"""Model backends, chosen per tier by name (see registry.py)."""
