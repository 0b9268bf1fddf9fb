"""Parameter-efficient fine-tuning (finetune=lora): torchtitan's LoRAConverter wired through the
model spec (`lora`), the adapters saved by the workers (`adapter_save`), and the PEFT-format
adapter and merged model the launcher exports (`peft_format`, `export`)."""
