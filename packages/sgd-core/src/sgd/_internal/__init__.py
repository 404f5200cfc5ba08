"""Machinery behind the public API; nothing here is a stable interface."""
