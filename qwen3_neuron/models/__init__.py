"""The models the three trainings build: torchtitan's Qwen3 flavours and the project's tiny ones
(`flavors`, `tiny`), Transformers models through torchtitan's HF backend (`hf/`), a reward model's
score head as a model converter (`score_head`), and per-token log-probabilities through the chunked
lm_head (`logprobs`).
Used by both sides; imports torchtitan (and transformers lazily), nothing of launch/ or worker/.
"""
