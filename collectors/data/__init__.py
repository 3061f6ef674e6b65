"""Data: the embedded default's datasets from pinned packages, and question files."""
