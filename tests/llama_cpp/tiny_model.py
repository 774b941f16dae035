"""A tiny llama with random weights, written as GGUF, so that a real engine can serve it.

Its tokenizer is copied from a vocab-only GGUF that the llama.cpp source ships, so prompts are
tokenized as a real llama would; the weights are random, so the text it writes is nonsense. Two
layers of width 64 make a file of a few megabytes that loads in well under a second.
"""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np

WIDTH = 64
LAYERS = 2
HEADS = 4
FEED_FORWARD = 128
CONTEXT = 16384
# ChatML, spelled out, so that the server's chat endpoint needs no template of its own.
CHAT_TEMPLATE = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + "
    "message['content'] + '<|im_end|>\\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)

_TOKENIZER_ARRAYS = ("tokenizer.ggml.tokens", "tokenizer.ggml.scores", "tokenizer.ggml.token_type")
_TOKEN_IDS = ("bos", "eos", "unknown")


def write_tiny_llama(vocab_file: Path, target: Path, seed: int = 0) -> Path:
    vocab = gguf.GGUFReader(vocab_file)
    tokens = _array(vocab, "tokenizer.ggml.tokens")
    rng = np.random.default_rng(seed)

    writer = gguf.GGUFWriter(str(target), "llama")
    writer.add_name("gpufleet-tiny-llama")
    writer.add_context_length(CONTEXT)
    writer.add_embedding_length(WIDTH)
    writer.add_block_count(LAYERS)
    writer.add_feed_forward_length(FEED_FORWARD)
    writer.add_head_count(HEADS)
    writer.add_head_count_kv(HEADS)
    writer.add_rope_dimension_count(WIDTH // HEADS)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_vocab_size(len(tokens))
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)

    writer.add_tokenizer_model(_scalar(vocab, "tokenizer.ggml.model"))
    for key in _TOKENIZER_ARRAYS:
        writer.add_array(key, _array(vocab, key))
    for name in _TOKEN_IDS:
        key = f"tokenizer.ggml.{name}_token_id"
        if key in vocab.fields:
            writer.add_uint32(key, int(_scalar(vocab, key)))
    writer.add_chat_template(CHAT_TEMPLATE)

    for name, shape in _tensor_shapes(len(tokens)).items():
        if name.endswith("norm.weight"):
            values = np.ones(shape, dtype=np.float32)
        else:
            values = rng.normal(0.0, 0.02, size=shape).astype(np.float32)
        writer.add_tensor(name, values)

    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return target


def _tensor_shapes(vocab_size: int) -> dict[str, tuple[int, ...]]:
    """numpy shapes, which list GGML's dimensions in reverse order."""
    shapes = {
        "token_embd.weight": (vocab_size, WIDTH),
        "output_norm.weight": (WIDTH,),
        "output.weight": (vocab_size, WIDTH),
    }
    for layer in range(LAYERS):
        block = f"blk.{layer}."
        shapes |= {
            block + "attn_norm.weight": (WIDTH,),
            block + "attn_q.weight": (WIDTH, WIDTH),
            block + "attn_k.weight": (WIDTH, WIDTH),
            block + "attn_v.weight": (WIDTH, WIDTH),
            block + "attn_output.weight": (WIDTH, WIDTH),
            block + "ffn_norm.weight": (WIDTH,),
            block + "ffn_gate.weight": (FEED_FORWARD, WIDTH),
            block + "ffn_up.weight": (FEED_FORWARD, WIDTH),
            block + "ffn_down.weight": (WIDTH, FEED_FORWARD),
        }
    return shapes


def _field(reader: gguf.GGUFReader, key: str):
    field = reader.fields.get(key)
    if field is None:
        raise LookupError(f"{key} is missing from the vocab file")
    return field


def _array(reader: gguf.GGUFReader, key: str) -> list:
    field = _field(reader, key)
    if field.types[1:] == [gguf.GGUFValueType.STRING]:
        return [bytes(field.parts[i]).decode("utf-8") for i in field.data]
    return [field.parts[i][0].item() for i in field.data]


def _scalar(reader: gguf.GGUFReader, key: str):
    field = _field(reader, key)
    value = field.parts[field.data[0]]
    if field.types[0] == gguf.GGUFValueType.STRING:
        return bytes(value).decode("utf-8")
    return value[0]


if __name__ == "__main__":
    import sys

    from tests.llama_cpp.build import Build, pinned_version

    if len(sys.argv) != 2:
        sys.exit("usage: python -m tests.llama_cpp.tiny_model OUT.gguf")
    vocab = Build(pinned_version()).vocab
    if not vocab.is_file():
        sys.exit(f"{vocab} is missing: run `python -m tests.llama_cpp.build` first")
    target = Path(sys.argv[1])
    target.parent.mkdir(parents=True, exist_ok=True)
    print(write_tiny_llama(vocab, target))
