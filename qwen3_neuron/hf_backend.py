"""The name of torchtitan's Transformers backend (model=hf): its module, and its ModelSpec's name.

Below models/, finetune/, hf_io/ and worker/, which all tell a model=hf spec by it.
"""

HF_BACKEND_NAME = "transformers_modeling_backend"
