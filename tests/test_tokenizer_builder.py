"""The project's own byte-level BPE tokenizer: exact vocabulary size per shape, round trips, decoding of any
id, chat templates, determinism and build time."""

from __future__ import annotations

import json
import random
import time

import pytest

from kog_backend.tools.fixtures import shapes, tokenizer_builder as tb

# One spec per distinct tokenizer layout among the shapes.
SPECS = {}
for _name, _cfg in shapes.SHAPES.items():
    SPECS.setdefault(tb.spec_for_config(_cfg), _name)

TEXTS = [
    "Hello world, the quick brown fox jumps over 12345 lazy dogs.",
    "  indented\n\n\tcode(x) -> x**2  # comment\r\n",
    "Unicode: naïve café, Привет мир, 你好，世界, emoji 🙂👍🏽, math ∑∫√.",
    "<|begin_of_text|> looks special but arrives as text in the middle",
    "",
    "a",
    "1234567890 3.14159 -42",
]


@pytest.fixture(scope="module", params=list(SPECS), ids=[SPECS[s] for s in SPECS])
def built(request):
    spec = request.param
    return spec, tb.build_tokenizer(spec)


def test_spec_layout_per_shape():
    s = tb.spec_for_config(shapes.SHAPES["llama-3.2-1b"])
    assert (s.vocab_size, s.first_special_id, s.family) == (128256, 128000, "llama3")
    assert s.token_id("<|begin_of_text|>") == 128000 and s.token_id("<|end_of_text|>") == 128001
    assert s.token_id("<|start_header_id|>") == 128006 and s.token_id("<|eot_id|>") == 128009
    assert s.special_tokens[-1] == "<|reserved_special_token_247|>"  # as in Llama 3: 248 reserved tokens
    q = tb.spec_for_config(shapes.SHAPES["qwen3-1.7b"])
    assert (q.vocab_size, q.first_special_id, q.family) == (151936, 151643, "qwen")
    assert q.token_id("<|endoftext|>") == 151643 and q.token_id("<|im_end|>") == 151645
    bad = dict(shapes.SHAPES["tiny-llama"], eos_token_id=5)
    with pytest.raises(ValueError, match="eos_token_id"):
        tb.spec_for_config(bad)


def test_exact_vocab_size_and_contiguous_ids(built):
    spec, tok = built
    assert tok.get_vocab_size(with_added_tokens=True) == spec.vocab_size
    vocab = tok.get_vocab(with_added_tokens=True)
    assert len(vocab) == spec.vocab_size
    assert sorted(vocab.values()) == list(range(spec.vocab_size))
    for i, t in enumerate(spec.special_tokens):
        assert vocab[t] == spec.first_special_id + i
    assert tok.id_to_token(spec.vocab_size - 1) is not None
    assert tok.id_to_token(spec.vocab_size) is None


def test_merges_are_valid(built):
    spec, tok = built
    model = json.loads(tok.to_str())["model"]
    vocab = model["vocab"]
    assert len(vocab) == spec.first_special_id
    assert len(model["merges"]) == spec.first_special_id - 256  # every non-byte token is produced by a merge
    for a, b in model["merges"]:
        assert a in vocab and b in vocab and a + b in vocab


def test_text_round_trip(built):
    spec, tok = built
    for text in TEXTS:
        enc = tok.encode(text, add_special_tokens=False)
        assert tok.decode(enc.ids, skip_special_tokens=False) == text
    ids = tok.encode("hi", add_special_tokens=True).ids
    assert (ids[0] == spec.first_special_id) == spec.add_bos


def test_merges_compress_english(built):
    _, tok = built
    text = "the people of the world think that water is a good thing for every animal"
    assert len(tok.encode(text, add_special_tokens=False).ids) <= len(text.split()) + 2


def test_decode_any_id(built):
    spec, tok = built
    rng = random.Random(0)
    ids = [0, 255, 256, spec.first_special_id - 1, spec.first_special_id, spec.vocab_size - 1]
    ids += [rng.randrange(spec.vocab_size) for _ in range(2000)]
    for i in ids:
        assert isinstance(tok.decode([i], skip_special_tokens=False), str)
        assert isinstance(tok.decode([i], skip_special_tokens=True), str)
    assert isinstance(tok.decode(ids, skip_special_tokens=False), str)


def test_incremental_decode_of_random_ids(built):
    """vLLM's fast detokenizer steps a tokenizers DecodeStream one id at a time."""
    from tokenizers.decoders import DecodeStream

    spec, tok = built
    rng = random.Random(1)
    ids = [rng.randrange(spec.vocab_size) for _ in range(500)] + [spec.vocab_size - 1]
    for skip in (False, True):
        stream = DecodeStream(skip_special_tokens=skip)
        pieces = [stream.step(tok, i) for i in ids]
        assert all(p is None or isinstance(p, str) for p in pieces)
    text_ids = tok.encode(TEXTS[2], add_special_tokens=False).ids
    stream = DecodeStream(skip_special_tokens=False)
    assert "".join(p or "" for p in (stream.step(tok, i) for i in text_ids)) == TEXTS[2]


def test_deterministic_across_builds():
    spec = tb.spec_for_config(shapes.SHAPES["tiny-qwen3"])
    assert tb.build_tokenizer(spec).to_str() == tb.build_tokenizer(spec).to_str()
    big = tb.spec_for_config(shapes.SHAPES["llama-3.2-1b"])
    v1, m1 = tb.build_vocab_and_merges(big.first_special_id)
    v2, m2 = tb.build_vocab_and_merges(big.first_special_id)
    assert v1 == v2 and m1 == m2


def test_build_time_of_largest_vocab():
    spec = tb.spec_for_config(shapes.SHAPES["qwen3-1.7b"])
    t0 = time.perf_counter()
    tb.build_tokenizer(spec)
    dt = time.perf_counter() - t0
    assert dt < 15.0, f"building a 151936-entry tokenizer took {dt:.1f} s"  # ~0.6 s on the 2-core CI machine


@pytest.mark.parametrize("shape", ["tiny-llama", "tiny-qwen3"])
def test_saved_files_load_in_transformers_with_chat_template(tmp_path, shape):
    from transformers import AutoTokenizer

    cfg = shapes.SHAPES[shape]
    spec = tb.spec_for_config(cfg)
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    tb.save_tokenizer(spec, str(tmp_path))
    tok = AutoTokenizer.from_pretrained(str(tmp_path))
    assert len(tok) == cfg["vocab_size"]
    assert tok.eos_token_id == cfg["eos_token_id"]
    assert tok.bos_token_id == (cfg["bos_token_id"] if spec.add_bos else None)
    assert tok.decode(tok(TEXTS[0], add_special_tokens=False).input_ids) == TEXTS[0]

    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi there"}]
    text = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    if spec.family == "llama3":
        assert text == ("<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nBe brief.<|eot_id|>"
                        "<|start_header_id|>user<|end_header_id|>\n\nHi there<|eot_id|>"
                        "<|start_header_id|>assistant<|end_header_id|>\n\n")
    else:
        assert text == ("<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi there<|im_end|>\n"
                        "<|im_start|>assistant\n")
    ids = tok.apply_chat_template(messages, tokenize=True, add_generation_prompt=True)
    ids = ids["input_ids"] if isinstance(ids, dict) or hasattr(ids, "keys") else ids
    header = "<|start_header_id|>" if spec.family == "llama3" else "<|im_start|>"
    assert ids.count(spec.token_id(header)) == 3
    assert tok.decode(ids) == text

    gen = tb.generation_config(spec)
    assert cfg["eos_token_id"] in gen["eos_token_id"]
    assert set(gen) == {"bos_token_id", "eos_token_id"}  # the ids; sampling defaults: shapes.generation_config
    assert {k: v for k, v in shapes.generation_config(shape).items() if k in gen} == gen
