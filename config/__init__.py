"""config: the bottom layer, parameters (imports nothing of the project)."""
