"""Loading a model pair: stock Hugging Face checkpoints by local path (pair), their prompt templates,
checked checkpoint digests, devices, oneDNN linears and the CPU allocator setting."""
