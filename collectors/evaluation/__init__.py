"""Evaluation: priced and wall-clock cells of the evaluate stage, and their tables."""
