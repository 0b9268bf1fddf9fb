"""The models the three trainings build: torchtitan's Qwen3 flavours and the project's tiny ones
(`flavors`, `tiny`), and Transformers models through torchtitan's HF backend (`hf/`).
Used by both sides; imports torchtitan (and transformers lazily), nothing of launch/ or worker/.
"""
