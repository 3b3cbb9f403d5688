"""Benchmarks: each script prints one JSON object (docs/benchmarks.md has the figures and their commands)."""
