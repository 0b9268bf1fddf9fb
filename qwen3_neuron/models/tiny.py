"""The project's own tiny Qwen3 architectures, in Hugging Face config terms.

One source for both sides: the native `tiny` flavours (torchtitan modules) and the generated
tiny HF model dirs (Transformers) are built from these numbers, so weights move between them.
"""

TINY_VOCAB_SIZE = 2048
QWEN3_VOCAB_SIZE = 151_936  # every published Qwen3's embedding rows (its tokenizer has 151,669)

TINY_DENSE = dict(
    vocab_size=TINY_VOCAB_SIZE,
    hidden_size=256,
    num_hidden_layers=4,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=64,
    intermediate_size=768,
    tie_word_embeddings=True,
    rms_norm_eps=1e-6,
    rope_theta=1_000_000.0,
    max_position_embeddings=2048,
)

# TINY_DENSE with its own output projection: pipeline parallelism cannot cut tied embeddings
# across stages, so this is the tiny model PP trains (a tied dir's embedding copied to lm_head
# loads into it as the same function).
TINY_DENSE_UNTIED = {**TINY_DENSE, "tie_word_embeddings": False}

# TINY_DENSE at Qwen3's real vocabulary (42 M parameters): the logits, not the layers, decide
# whether a step fits, as in the runs people train; the memory benchmark and its test use it.
TINY_DENSE_REAL_VOCAB = {**TINY_DENSE, "vocab_size": QWEN3_VOCAB_SIZE}

TINY_MOE = dict(
    vocab_size=TINY_VOCAB_SIZE,
    hidden_size=256,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=64,
    intermediate_size=768,
    moe_intermediate_size=256,
    num_experts=8,
    num_experts_per_tok=2,
    norm_topk_prob=True,
    tie_word_embeddings=False,
    rms_norm_eps=1e-6,
    rope_theta=1_000_000.0,
    max_position_embeddings=2048,
)
