"""Collecting: all 2^D schedules per report, by replay or execution, locally or on Ray."""
