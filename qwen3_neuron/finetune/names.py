"""The names `finetune.target_modules` takes on every backend: Qwen3's projections as Hugging Face
calls them (and PEFT's `target_modules` for Qwen3ForCausalLM); and the adapters' own names."""

HF_PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")

# torchtitan's LoRALinear: its adapters' child modules, so the `.lora_a.` / `.lora_b.` in their keys
ADAPTER_MODULES = ("lora_a", "lora_b")

# trained whole beside the adapters (PEFT's `modules_to_save`): trainer=reward_model's score head
# (Transformers' `score`), kept in finetune=lora's adapter-only checkpoints
MODULES_TO_SAVE = ("score",)
