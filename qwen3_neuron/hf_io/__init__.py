"""Hugging Face model dirs out of a run: `run_export` (what global rank 0 exports after training),
`export` (a complete, atomic HF dir from torchtitan's HF save), `adapter_export` (LoRA: the PEFT
adapter and the merged model), `reward_model_export` (trainer=reward_model: a sequence-classification
dir), `generation` (a chat model's generation config stops at the end
of its turn), `verify` (does a dir load into Transformers as it is) and `chat_command` (talk to it:
`python -m qwen3_neuron.chat`)."""
