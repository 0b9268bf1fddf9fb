"""Hugging Face model dirs out of a run: `export` (a complete, atomic HF dir from torchtitan's
HF save) and `verify` (does a dir load into Transformers as it is)."""
