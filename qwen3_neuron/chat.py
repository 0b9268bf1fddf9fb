"""`python -m qwen3_neuron.chat <export dir or run dir>`: talk to a trained model (hf_io.chat_command)."""

from qwen3_neuron.hf_io.chat_command import main

if __name__ == "__main__":
    raise SystemExit(main())
