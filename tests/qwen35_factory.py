"""A tiny random Qwen3.5 (hybrid Gated DeltaNet + gated attention) in Hugging Face layout.

`make_qwen35_model(dir, ...)` builds the model with transformers' own classes (Qwen3_5TextConfig +
Qwen3_5ForCausalLM, float32), overwrites every parameter with seeded random values scaled so the
logits are informative (std of a few units, top-1 varying across positions), and saves it the way
`save_pretrained` does (config.json, model.safetensors) with a byte-level BPE tokenizer trained on
the spot (tokenizer.json with Qwen3.5's split regex, tokenizer_config.json with a Qwen3.5-style
chat template).

Shape of the default model (small, but every converter trap is exercised):
- hidden 64, 4 layers with the default layer_types (GDN, GDN, GDN, full attention: one attention
  layer in the 3:1 pattern), ffn 128;
- attention: 2 query heads of head_dim 32 (q_proj holds query and gate, 2 x 32 rows per head),
  1 KV head, partial_rotary_factor 0.25 (rope on the first 8 dims), mrope_section [2, 1, 1];
- GDN: 2 key heads, 4 value heads (V != K, so the grouped -> tiled V-head reorder matters), key and
  value head dims 16, conv kernel 4;
- vocabulary: the tokenizer's tokens padded to a multiple of 16 rows (so both converters pad).

`layout="conditional"` saves the same language model as Qwen3_5ForConditionalGeneration stores it
(config.json with text_config / vision_config, tensors under model.language_model.*) plus a few
dummy vision (model.visual.*) and multi-token-prediction (mtp.*) tensors the text converter skips.

The returned dict holds the facts tests compare against, `model` (the transformers module, float32,
eval mode) and `tensors` (name -> float32 array, Hugging Face names of the CausalLM layout).
"""

from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path

import numpy as np

from model_factory import TRAINING_TEXT

# Qwen3.5's tokenizer.json split regex: Qwen2's with combining marks (\p{M}) kept inside words.
QWEN35_SPLIT_REGEX = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}|"
                      r" ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
QWEN35_SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|vision_start|>",
                   "<|vision_end|>", "<|image_pad|>", "<|video_pad|>"]
QWEN35_ADDED = ["<tool_call>", "</tool_call>", "<think>", "</think>", "<tool_response>",
                "</tool_response>"]

# A shortened Qwen3.5-style template: content rendered by a macro (strings or lists of parts), a
# namespace to find the last real user query walking the messages backwards, <think> blocks kept
# only after that query (reasoning_content or inline <think>...</think>), XML-style tool calls
# with one <parameter=...> per argument, tool responses grouped into one user turn, and a
# generation prompt that opens a <think> block (closed at once when enable_thinking is false).
QWEN35_CHAT_TEMPLATE = """\
{%- macro text_of(content) %}
    {%- if content is string %}
        {{- content }}
    {%- elif content is iterable and content is not mapping %}
        {%- for part in content %}
            {%- if 'image' in part or part.type == 'image' %}
                {{- '<|vision_start|><|image_pad|><|vision_end|>' }}
            {%- elif 'text' in part %}
                {{- part.text }}
            {%- else %}
                {{- raise_exception('Unexpected item type in content.') }}
            {%- endif %}
        {%- endfor %}
    {%- elif content is none or content is undefined %}
        {{- '' }}
    {%- else %}
        {{- raise_exception('Unexpected content type.') }}
    {%- endif %}
{%- endmacro %}
{%- if not messages %}
    {{- raise_exception('No messages provided.') }}
{%- endif %}
{%- if tools and tools is iterable and tools is not mapping %}
    {{- '<|im_start|>system\\n# Tools\\n\\nYou have access to the following functions:\\n\\n<tools>' }}
    {%- for tool in tools %}
        {{- '\\n' + (tool | tojson) }}
    {%- endfor %}
    {{- '\\n</tools>\\n\\nCall a function as <tool_call>\\n<function=NAME>\\n<parameter=ARG>\\nVALUE\\n</parameter>\\n</function>\\n</tool_call>' }}
    {%- if messages[0].role == 'system' %}
        {%- set sys = text_of(messages[0].content)|trim %}
        {%- if sys %}
            {{- '\\n\\n' + sys }}
        {%- endif %}
    {%- endif %}
    {{- '<|im_end|>\\n' }}
{%- elif messages[0].role == 'system' %}
    {{- '<|im_start|>system\\n' + (text_of(messages[0].content)|trim) + '<|im_end|>\\n' }}
{%- endif %}
{%- set ns = namespace(multi_step_tool=true, last_query_index=messages|length - 1) %}
{%- for message in messages[::-1] %}
    {%- set index = (messages|length - 1) - loop.index0 %}
    {%- if ns.multi_step_tool and message.role == 'user' %}
        {%- set text = text_of(message.content)|trim %}
        {%- if not (text.startswith('<tool_response>') and text.endswith('</tool_response>')) %}
            {%- set ns.multi_step_tool = false %}
            {%- set ns.last_query_index = index %}
        {%- endif %}
    {%- endif %}
{%- endfor %}
{%- if ns.multi_step_tool %}
    {{- raise_exception('No user query found in messages.') }}
{%- endif %}
{%- for message in messages %}
    {%- set content = text_of(message.content)|trim %}
    {%- if message.role == 'system' %}
        {%- if not loop.first %}
            {{- raise_exception('System message must be at the beginning.') }}
        {%- endif %}
    {%- elif message.role == 'user' %}
        {{- '<|im_start|>user\\n' + content + '<|im_end|>\\n' }}
    {%- elif message.role == 'assistant' %}
        {%- set reasoning = '' %}
        {%- if message.reasoning_content is string %}
            {%- set reasoning = message.reasoning_content %}
        {%- elif '</think>' in content %}
            {%- set reasoning = content.split('</think>')[0].rstrip('\\n').split('<think>')[-1].lstrip('\\n') %}
            {%- set content = content.split('</think>')[-1].lstrip('\\n') %}
        {%- endif %}
        {%- if loop.index0 > ns.last_query_index %}
            {{- '<|im_start|>assistant\\n<think>\\n' + (reasoning|trim) + '\\n</think>\\n\\n' + content }}
        {%- else %}
            {{- '<|im_start|>assistant\\n' + content }}
        {%- endif %}
        {%- if message.tool_calls and message.tool_calls is iterable and message.tool_calls is not mapping %}
            {%- for call in message.tool_calls %}
                {%- if call.function is defined %}
                    {%- set call = call.function %}
                {%- endif %}
                {%- if not loop.first or content|trim %}
                    {{- '\\n' if not loop.first else '\\n\\n' }}
                {%- endif %}
                {{- '<tool_call>\\n<function=' + call.name + '>\\n' }}
                {%- for arg, value in (call.arguments or {})|items %}
                    {{- '<parameter=' + arg + '>\\n' }}
                    {{- (value | tojson) if value is mapping or (value is sequence and value is not string) else (value | string) }}
                    {{- '\\n</parameter>\\n' }}
                {%- endfor %}
                {{- '</function>\\n</tool_call>' }}
            {%- endfor %}
        {%- endif %}
        {{- '<|im_end|>\\n' }}
    {%- elif message.role == 'tool' %}
        {%- if loop.previtem and loop.previtem.role != 'tool' %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\\n<tool_response>\\n' + content + '\\n</tool_response>' }}
        {%- if loop.last or loop.nextitem.role != 'tool' %}
            {{- '<|im_end|>\\n' }}
        {%- endif %}
    {%- else %}
        {{- raise_exception('Unexpected message role.') }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\\n' }}
    {%- if enable_thinking is defined and enable_thinking is false %}
        {{- '<think>\\n\\n</think>\\n\\n' }}
    {%- else %}
        {{- '<think>\\n' }}
    {%- endif %}
{%- endif %}
"""

TEXT_CONFIG = dict(
    hidden_size=64, intermediate_size=128, num_hidden_layers=4, num_attention_heads=2,
    num_key_value_heads=1, head_dim=32, linear_num_key_heads=2, linear_num_value_heads=4,
    linear_key_head_dim=16, linear_value_head_dim=16, linear_conv_kernel_dim=4,
    max_position_embeddings=4096, rms_norm_eps=1e-6,
    rope_parameters={"rope_type": "default", "rope_theta": 10000000.0,
                     "partial_rotary_factor": 0.25, "mrope_section": [2, 1, 1],
                     "mrope_interleaved": True})


@lru_cache(maxsize=None)
def qwen35_tokenizer_json(vocab_size: int = 320) -> str:
    """A byte-level BPE with Qwen3.5's split regex and special / added tokens."""
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers, \
        processors, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN35_SPLIT_REGEX), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(TRAINING_TEXT * 4, trainer)
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in QWEN35_SPECIALS])
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in QWEN35_ADDED])
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    return tok.to_str()


def write_qwen35_tokenizer(d: Path) -> dict:
    text = qwen35_tokenizer_json()
    (d / "tokenizer.json").write_text(text, encoding="utf-8")
    tj = json.loads(text)
    ids = {a["content"]: a["id"] for a in tj["added_tokens"]}
    decoder = {str(a["id"]): {"content": a["content"], "special": a["special"], "lstrip": False,
                              "rstrip": False, "normalized": False, "single_word": False}
               for a in tj["added_tokens"]}
    cfg = {"add_bos_token": False, "add_prefix_space": False, "added_tokens_decoder": decoder,
           "bos_token": None, "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>",
           "unk_token": None, "tokenizer_class": "Qwen2Tokenizer", "model_max_length": 262144,
           "split_special_tokens": False, "chat_template": QWEN35_CHAT_TEMPLATE}
    (d / "tokenizer_config.json").write_text(json.dumps(cfg, indent=2), encoding="utf-8")
    n = max(max(tj["model"]["vocab"].values()), max(ids.values())) + 1
    return {"n_tokens": n, "eos": ids["<|im_end|>"], "pad": ids["<|endoftext|>"], "ids": ids}


def _randomize(model, rng) -> None:
    """Seeded values for every parameter, scaled so activations and logits stay O(1)."""
    import torch

    def normal(shape, std):
        return torch.from_numpy((rng.standard_normal(shape) * std).astype(np.float32))

    with torch.no_grad():
        for name, p in model.named_parameters():
            shape = tuple(p.shape)
            if name.endswith("embed_tokens.weight"):    # small: a tied head must not echo the input
                v = normal(shape, 0.25)
            elif name == "lm_head.weight":
                v = normal(shape, 2.0 / np.sqrt(shape[1]))
            elif name.endswith("linear_attn.norm.weight"):        # plain weight (x * w)
                v = 1.0 + normal(shape, 0.1)
            elif name.endswith("norm.weight"):                     # zero-centred (x * (1 + w))
                v = normal(shape, 0.1)
            elif name.endswith(".A_log"):
                v = torch.from_numpy(np.log(rng.uniform(0.5, 4.0, shape)).astype(np.float32))
            elif name.endswith(".dt_bias"):
                v = normal(shape, 0.5)
            elif name.endswith("conv1d.weight"):                   # [conv_dim, 1, kernel]
                v = normal(shape, 0.5)
            elif p.ndim == 2:                                      # linear [out, in]
                v = normal(shape, 1.0 / np.sqrt(shape[1]))
            else:
                raise AssertionError(f"unexpected parameter {name} {shape}")
            p.copy_(v)


def make_qwen35_model(d, tied: bool = False, layout: str = "causal", seed: int = 0,
                      **overrides) -> dict:
    """Writes a tiny random Qwen3.5 into directory `d`; returns the facts tests check."""
    import torch
    from transformers import Qwen3_5ForCausalLM, Qwen3_5TextConfig

    if layout not in ("causal", "conditional"):
        raise ValueError(f"unknown layout {layout!r}")
    d = Path(d)
    d.mkdir(parents=True, exist_ok=True)
    tok = write_qwen35_tokenizer(d)
    n_vocab = -(-tok["n_tokens"] // 16) * 16
    kw = {**TEXT_CONFIG, **overrides}
    cfg = Qwen3_5TextConfig(vocab_size=n_vocab, tie_word_embeddings=tied,
                            eos_token_id=tok["eos"], pad_token_id=tok["pad"], **kw)
    torch.manual_seed(seed)
    model = Qwen3_5ForCausalLM(cfg).eval().float()
    _randomize(model, np.random.default_rng(seed))
    if tied:
        model.tie_weights()
    tensors = {n: t.detach().numpy().copy() for n, t in model.state_dict().items()}
    if tied:
        tensors.pop("lm_head.weight", None)
    if layout == "causal":
        model.save_pretrained(d, safe_serialization=True)
    else:
        _save_conditional(d, cfg, tensors, np.random.default_rng(seed + 1))
    config = json.loads((d / "config.json").read_text(encoding="utf-8"))
    return {"dir": d, "config": config, "text_config": cfg.to_dict(), "model": model,
            "tensors": tensors, "n_vocab": n_vocab, "tokens": tok, "tied": tied,
            "layout": layout, "layer_types": list(cfg.layer_types)}


# Dummy tensors of the parts a text converter skips (shapes are small stand-ins).
_VISUAL = {"model.visual.patch_embed.proj.weight": (32, 3, 2, 4, 4),
           "model.visual.blocks.0.attn.qkv.weight": (96, 32),
           "model.visual.blocks.0.norm1.weight": (32,),
           "model.visual.merger.linear_fc1.weight": (64, 128)}
_MTP = {"mtp.fc.weight": (64, 128),
        "mtp.pre_fc_norm_embedding.weight": (64,),
        "mtp.pre_fc_norm_hidden.weight": (64,),
        "mtp.layers.0.input_layernorm.weight": (64,),
        "mtp.layers.0.mlp.down_proj.weight": (64, 128),
        "mtp.norm.weight": (64,)}


def _save_conditional(d: Path, cfg, tensors: dict, rng) -> None:
    """Qwen3_5ForConditionalGeneration's layout: language model under model.language_model.*."""
    from safetensors.numpy import save_file

    text = cfg.to_dict()
    text.pop("transformers_version", None)
    text["mtp_num_hidden_layers"] = 1
    text["mtp_use_dedicated_embeddings"] = False
    config = {"architectures": ["Qwen3_5ForConditionalGeneration"], "model_type": "qwen3_5",
              "text_config": text,
              "vision_config": {"model_type": "qwen3_5", "depth": 1, "hidden_size": 32,
                                "num_heads": 2, "intermediate_size": 128, "out_hidden_size": 64,
                                "patch_size": 4, "spatial_merge_size": 2,
                                "temporal_patch_size": 2, "in_channels": 3},
              "image_token_id": 0, "video_token_id": 0, "vision_start_token_id": 0,
              "vision_end_token_id": 0, "tie_word_embeddings": cfg.tie_word_embeddings,
              "transformers_version": "5.24.0"}
    (d / "config.json").write_text(json.dumps(config, indent=2), encoding="utf-8")
    out = {}
    for name, x in tensors.items():
        out[name.replace("model.", "model.language_model.", 1) if name.startswith("model.")
            else name] = x
    for name, shape in {**_VISUAL, **_MTP}.items():
        out[name] = (rng.standard_normal(shape) * 0.1).astype(np.float32)
    save_file({k: np.ascontiguousarray(v) for k, v in out.items()}, str(d / "model.safetensors"),
              metadata={"format": "pt"})


def skipped_tensor_names() -> list[str]:
    """The vision and MTP tensor names the conditional layout adds."""
    return sorted({**_VISUAL, **_MTP})
