"""qwen3-neuron: a declarative Hydra experiment framework for training Qwen3 with torchtitan."""
