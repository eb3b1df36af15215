"""Hugging Face transformers models, unmodified, on tpu: small random-init configs (nothing is
downloaded) of ten families (decoders, an encoder, an encoder-decoder), forward logits, three
training steps and greedy generate() against CPU."""

from __future__ import annotations

import copy
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # no hub access: models come from configs

import pytest
import torch
import transformers

import torch_tpu
from tests.helpers import assert_no_fallbacks, native_only, platform_tol
from torch_tpu.testing.models import TINY_LLAMA

VOCAB = 128


def _llama() -> transformers.PreTrainedModel:
    return transformers.LlamaForCausalLM(transformers.LlamaConfig(**TINY_LLAMA))


def _qwen2() -> transformers.PreTrainedModel:
    return transformers.Qwen2ForCausalLM(transformers.Qwen2Config(**TINY_LLAMA, tie_word_embeddings=True))


def _gpt2() -> transformers.PreTrainedModel:
    # No dropout: tpu's random streams differ from CPU's, so training runs compare only without it.
    no_dropout = dict(resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    config = transformers.GPT2Config(
        vocab_size=VOCAB, n_embd=64, n_layer=2, n_head=4, n_positions=64, bos_token_id=0, eos_token_id=0, **no_dropout
    )
    return transformers.GPT2LMHeadModel(config)


def _mixtral() -> transformers.PreTrainedModel:
    # Sparse MoE: torch._grouped_mm over 4 experts; router logits make the loss count experts with
    # an int32 histc (the aux loss).
    config = transformers.MixtralConfig(
        **{**TINY_LLAMA, "num_hidden_layers": 1},
        num_local_experts=4,
        num_experts_per_tok=2,
        output_router_logits=True,
        router_aux_loss_coef=0.01,
    )
    return transformers.MixtralForCausalLM(config)


def _qwen3() -> transformers.PreTrainedModel:
    return transformers.Qwen3ForCausalLM(transformers.Qwen3Config(**TINY_LLAMA, head_dim=16))


def _mistral() -> transformers.PreTrainedModel:
    return transformers.MistralForCausalLM(transformers.MistralConfig(**TINY_LLAMA, sliding_window=None))


def _gemma() -> transformers.PreTrainedModel:
    return transformers.GemmaForCausalLM(transformers.GemmaConfig(**TINY_LLAMA, head_dim=16))


def _gemma2() -> transformers.PreTrainedModel:
    # Soft-capped logits and attention scores, alternating sliding-window layers: an explicit
    # mask, so SDPA takes the math path.
    config = transformers.Gemma2Config(**TINY_LLAMA, head_dim=16, sliding_window=8)
    return transformers.Gemma2ForCausalLM(config)


def _bert() -> transformers.PreTrainedModel:
    config = transformers.BertConfig(
        vocab_size=VOCAB,
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=128,
        max_position_embeddings=64,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
    )
    return transformers.BertForMaskedLM(config)


def _t5() -> transformers.PreTrainedModel:
    config = transformers.T5Config(
        vocab_size=VOCAB,
        d_model=64,
        d_kv=16,
        d_ff=128,
        num_layers=2,
        num_heads=4,
        dropout_rate=0.0,
        decoder_start_token_id=0,
        pad_token_id=0,
        eos_token_id=1,
    )
    return transformers.T5ForConditionalGeneration(config)


MODELS = {
    "llama": _llama,
    "qwen2": _qwen2,
    "qwen3": _qwen3,
    "gpt2": _gpt2,
    "mistral": _mistral,
    "gemma": _gemma,
    "gemma2": _gemma2,
    "mixtral": _mixtral,
    "bert": _bert,
    "t5": _t5,
}
GENERATIVE = sorted(set(MODELS) - {"bert"})  # BERT is an encoder: logits and training only


def _pair(name: str):
    """The same random-init model on CPU and on tpu, in eval mode."""
    torch.manual_seed(0)
    cpu_model = MODELS[name]().eval()
    tpu_model = copy.deepcopy(cpu_model).to("tpu")
    return cpu_model, tpu_model


@pytest.fixture(params=sorted(MODELS))
def models(request):
    return _pair(request.param)


@pytest.fixture(params=GENERATIVE)
def generative_models(request):
    return _pair(request.param)


def _inputs(model, ids: torch.Tensor) -> dict:
    """A forward call's inputs: an encoder-decoder also gets decoder inputs (the ids shifted)."""
    if model.config.is_encoder_decoder:
        return dict(input_ids=ids, decoder_input_ids=torch.roll(ids, 1, dims=1))
    return dict(input_ids=ids)


def _ids(batch: int, length: int, seed: int = 0) -> torch.Tensor:
    return torch.randint(0, VOCAB, (batch, length), generator=torch.Generator().manual_seed(seed))


def test_forward_logits_match_cpu(models):
    cpu_model, tpu_model = models
    ids = _ids(2, 16)
    with torch.no_grad():
        expected = cpu_model(**_inputs(cpu_model, ids)).logits
        logits = native_only(lambda: tpu_model(**_inputs(tpu_model, ids.to("tpu"))).logits)
    assert logits.device.type == "tpu"
    torch.testing.assert_close(logits.cpu(), expected, **platform_tol({"rtol": 1e-4, "atol": 1e-4}))


def test_three_training_steps_match_cpu(models):
    losses = []
    for model, device in zip(models, ("cpu", "tpu")):
        torch_tpu.metrics.reset()
        model.train()
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
        run = []
        for step in range(3):
            ids = _ids(2, 16, seed=step).to(device)
            loss = model(**_inputs(model, ids), labels=ids).loss
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            run.append(loss.item())
        losses.append(run)
    assert_no_fallbacks()  # of the tpu run
    torch.testing.assert_close(losses[1], losses[0], **platform_tol({"rtol": 1e-4, "atol": 1e-5}))
    # On a TPU the parameters get more room than the losses: AdamW's first steps move a parameter
    # by about +-lr whatever its gradient's size, so a gradient near zero whose sign the TPU's
    # rounding flips moves it 2 lr the other way (up to 6e-3 over three steps at lr 1e-3).
    tol = {"rtol": 1e-4, "atol": 6e-3} if torch_tpu.platform() == "tpu" else {"rtol": 1e-4, "atol": 1e-4}
    for (name, p_cpu), p_tpu in zip(models[0].named_parameters(), models[1].parameters()):
        torch.testing.assert_close(
            p_tpu.detach().cpu(), p_cpu.detach(), **tol, msg=lambda text, name=name: f"{name}: {text}"
        )


def test_generate_matches_cpu(generative_models):
    cpu_model, tpu_model = generative_models
    prompt = _ids(1, 4)
    settings = dict(max_new_tokens=8, min_new_tokens=8, do_sample=False, pad_token_id=0)
    expected = cpu_model.generate(prompt, **settings)
    tokens = native_only(lambda: tpu_model.generate(prompt.to("tpu"), **settings))
    assert tokens.shape == expected.shape == ((1, 9) if cpu_model.config.is_encoder_decoder else (1, 12))
    torch.testing.assert_close(tokens.cpu(), expected, rtol=0, atol=0)


def test_mixtral_compiles_in_float32(fresh_dynamo):
    """torch._grouped_mm traced in float32 (torch's meta function takes bfloat16 only)."""
    torch.manual_seed(0)
    cpu_model = _mixtral().eval()
    tpu_model = copy.deepcopy(cpu_model).to("tpu")
    compiled = torch.compile(tpu_model, backend="tpu")
    ids = _ids(2, 16)
    with torch.no_grad():
        expected = cpu_model(ids).logits
        logits = compiled(ids.to("tpu")).logits
    assert logits.dtype == torch.float32
    torch.testing.assert_close(logits.cpu(), expected, rtol=1e-4, atol=1e-4)
