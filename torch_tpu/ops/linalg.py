"""Lowerings."""
