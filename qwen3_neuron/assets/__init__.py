"""The project's tiny generated assets (`build`: tokenizer, text data set, tiny Qwen3 and
Qwen3-MoE HF dirs; `python -m qwen3_neuron.assets`) and `atomic_dir` (build aside, rename in)."""
