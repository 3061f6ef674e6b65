"""Files the runtime reads and writes: atomic writes, SHA-256 of files, checked JSON manifests."""
