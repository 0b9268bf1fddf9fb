"""The chunked per-token log-probabilities equal the full ones, values and gradients."""

from __future__ import annotations

import pytest
import torch
from torchtitan.components.loss import IGNORE_INDEX

from qwen3_neuron.models.logprobs import chunked_token_logps, token_logps


def _tiny_hf_qwen3(vocab_size: int = 1000):
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(0)
    config = Qwen3Config(vocab_size=vocab_size, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, head_dim=16, tie_word_embeddings=False)  # fmt: skip
    return Qwen3ForCausalLM(config).float()


def _inputs(vocab_size: int, batch: int = 2, seq_len: int = 37):
    generator = torch.Generator().manual_seed(1)
    ids = torch.randint(0, vocab_size, (batch, seq_len), generator=generator)
    labels = torch.randint(0, vocab_size, (batch, seq_len), generator=generator)
    labels[0, :5] = IGNORE_INDEX  # a prompt without a loss
    labels[1, -3:] = IGNORE_INDEX
    return ids, labels


def _logps_and_grads(model, ids, labels, chunks: int | None):
    model.zero_grad()
    hidden = model.model(ids).last_hidden_state
    if chunks is None:
        logps = token_logps(model.lm_head(hidden), labels)
    else:
        logps = chunked_token_logps(hidden, model.lm_head, labels, chunks)
    weights = torch.linspace(-1.0, 2.0, logps.numel()).reshape(logps.shape)  # a loss that weighs every token
    (logps * weights).sum().backward()
    return logps.detach(), {name: p.grad.clone() for name, p in model.named_parameters()}


@pytest.mark.numerics
@pytest.mark.parametrize("chunks", [1, 4, 8])  # 37 positions: 8 chunks leave a short last one
def test_chunked_log_probs_and_gradients_equal_the_full_ones(chunks):
    model = _tiny_hf_qwen3()
    ids, labels = _inputs(model.config.vocab_size)
    full, full_grads = _logps_and_grads(model, ids, labels, None)
    chunked, chunked_grads = _logps_and_grads(model, ids, labels, chunks)
    reference = torch.log_softmax(model(ids).logits.float(), -1).gather(-1, labels.clamp(min=0)[..., None])[..., 0]
    # float32, the same logits: log_softmax's sum of vocab exp terms rounds by at most vocab x 2^-24 of
    # itself, so log p by that much absolutely (6e-5; measured: equal)
    torch.testing.assert_close(full, reference.masked_fill(labels == IGNORE_INDEX, 0.0), rtol=0,
                               atol=model.config.vocab_size * 2**-24)
    assert (full[labels == IGNORE_INDEX] == 0).all()
    torch.testing.assert_close(chunked, full, rtol=0, atol=1e-6)  # each row the same 64-term sums: 2 ulps at |log p| 7
    assert full_grads.keys() == chunked_grads.keys()
    for name, grad in full_grads.items():  # float32 sums in another order: within 1e-5 of the largest entry
        assert (chunked_grads[name] - grad).abs().max() <= 1e-5 * grad.abs().max(), name


@pytest.mark.numerics
def test_a_sampling_temperature_divides_the_logits_as_trls_log_probs_do():
    """GRPO's log-probabilities are those of the distribution it sampled from: softmax(logits / T)."""
    model = _tiny_hf_qwen3()
    ids, labels = _inputs(model.config.vocab_size)
    with torch.no_grad():
        hidden = model.model(ids).last_hidden_state
        logits = model.lm_head(hidden).float()
        at_07 = chunked_token_logps(hidden, model.lm_head, labels, 4, temperature=0.7)
        at_1 = chunked_token_logps(hidden, model.lm_head, labels, 4)
    reference = torch.log_softmax(logits / 0.7, -1).gather(-1, labels.clamp(min=0)[..., None])[..., 0]
    # float32, the same logits divided alike: the bound of the test above
    torch.testing.assert_close(at_07, reference.masked_fill(labels == IGNORE_INDEX, 0.0), rtol=0,
                               atol=model.config.vocab_size * 2**-24)
    assert (at_07 - at_1).abs().max() > 0.01  # a temperature that changes what is trained


def test_chunked_log_probs_keep_one_chunk_of_logits_alive():
    """Saved for backward: the hidden states, never the [B, S, V] logits or their log-softmax."""
    model = _tiny_hf_qwen3(vocab_size=4096)
    ids, labels = _inputs(model.config.vocab_size, seq_len=64)
    hidden = model.model(ids).last_hidden_state
    saved: list[torch.Tensor] = []

    def pack(tensor):
        saved.append(tensor)
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        chunked_token_logps(hidden, model.lm_head, labels, 8)
    vocab_sized = [t for t in saved if t.shape[-1] == 4096 and t.dim() == 3]
    assert vocab_sized == []
    saved.clear()
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        token_logps(model.lm_head(hidden), labels)  # the full path holds them (what this guards against)
    assert any(t.shape[-1] == 4096 and t.dim() == 3 for t in saved)
