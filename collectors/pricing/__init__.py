"""Profiling and pricing: a pair's measured latency profile and what a round costs under it."""
