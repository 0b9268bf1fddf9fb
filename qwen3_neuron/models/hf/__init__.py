"""model=hf: a Transformers v5 model trained through torchtitan's modeling backend.

- `model_dir`: a local model dir (or cached Hub id) read and checked once, at plan time;
- `spec`: the `ModelSpec` torchtitan builds from it, and the trainer fields that follow;
- `runtime`: fixes to the backend's model as installed, applied when the workers build it;
- `state_dict`: HF <-> torchtitan key mapping for the MoE weights.
"""
