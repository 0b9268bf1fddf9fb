"""Parameter-efficient fine-tuning (finetune=lora): torchtitan's LoRAConverter wired through the
model spec, or for model=hf onto the Transformers model's Linear layers (`lora`, with the
adapters' dropout), each step's dropout masks seeded from the step (`step_seed`), the frozen base
kept frozen (`frozen_base`), adapter-only checkpoints (`checkpoint`), the adapters saved by the
workers (`adapter_save`), and their PEFT format (`peft_format`) for rank 0's export.
"""
