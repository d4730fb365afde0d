"""A byte-level BPE tokenizer with exactly a model's vocab_size entries, built here with no downloads.

Layout (ids):  [0, 256)                 the 256 byte tokens (GPT-2 byte -> printable-character map)
               [256, first_special)     merged tokens: first a small BPE trained on an embedded, rank-weighted
                                        English word list (plus digit groups and whitespace runs), then
                                        filler merges (stem + letter, breadth first) up to the count
               [first_special, vocab)   special tokens, the named ones of the model family then reserved ones
Every id decodes (random weights emit any id), text round-trips (byte level), and two builds are identical:
every ordering below is by explicit keys, never by hash or dict-iteration order of unordered input.

Two families, matching the real models' special-token ids and chat formats:
  llama3: <|begin_of_text|> = first special (BOS, prepended on encode), <|end_of_text|> = EOS, Llama 3 header
          chat tokens; pre-tokenizer regex splits digits in groups of up to 3.
  qwen:   <|endoftext|> = first special, <|im_start|>, <|im_end|> = EOS; no BOS on encode; single digits.

Module-level imports are standard library only; `tokenizers` is imported where the tokenizer is built.
"""

from __future__ import annotations

import dataclasses
import heapq
import json
import os
from collections import deque
from typing import Any, Mapping

# Pre-tokenizer regexes of the two families (Llama 3: digits in groups of <= 3; Qwen2/3: single digits).
_SPLIT_REGEX = {
    "llama3": r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",
    "qwen": r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",
}

# Named special tokens in id order from first_special; the rest of the range is reserved tokens.
_LLAMA3_SPECIALS = (
    "<|begin_of_text|>", "<|end_of_text|>", "<|reserved_special_token_0|>", "<|reserved_special_token_1|>",
    "<|finetune_right_pad_id|>", "<|reserved_special_token_2|>", "<|start_header_id|>", "<|end_header_id|>",
    "<|eom_id|>", "<|eot_id|>", "<|python_tag|>",
)
_LLAMA3_RESERVED_FIRST = 3  # next reserved index after the named block
_QWEN_SPECIALS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")

# Chat templates (jinja, rendered by transformers and by vLLM's chat endpoint). Content is a string; vLLM
# flattens OpenAI content parts for templates that do not iterate over them.
_LLAMA3_CHAT_TEMPLATE = (
    "{{- bos_token }}"
    "{%- for message in messages %}"
    "{{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n' + (message['content'] | trim) + '<|eot_id|>' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{%- endif %}"
)
_QWEN_CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)

# Common English words, most frequent first (rank weights the BPE pair counts).
_WORDS = """
the of and to a in is it you that he was for on are with as i his they be at one have this from or had by
not word but what some we can out other were all there when up use your how said an each she which do
their time if will way about many then them write would like so these her long make thing see him two has
look more day could go come did number sound no most people my over know water than call first who may down
side been now find any new work part take get place made live where after back little only round man year
came show every good me give our under name very through just form sentence great think say help low line
differ turn cause much mean before move right boy old too same tell does set three want air well also play
small end put home read hand port large spell add even land here must big high such follow act why ask men
change went light kind off need house picture try us again animal point mother world near build self earth
father head stand own page should country found answer school grow study still learn plant cover food sun
four between state keep eye never last let thought city tree cross farm hard start might story saw far sea
draw left late run while press close night real life few north open seem together next white children begin
got walk example ease paper group always music those both mark often letter until mile river car feet care
second book carry took science eat room friend began idea fish mountain stop once base hear horse cut sure
watch color face wood main enough plain girl usual young ready above ever red list though feel talk bird
soon body dog family direct pose leave song measure door product black short numeral class wind question
happen complete ship area half rock order fire south problem piece told knew pass since top whole king space
heard best hour better true during hundred five remember step early hold west ground interest reach fast
verb sing listen six table travel less morning ten simple several vowel toward war lay against pattern slow
center love person money serve appear road map rain rule govern pull cold notice voice unit power town fine
certain fly fall lead cry dark machine note wait plan figure star box noun field rest correct able pound
done beauty drive stood contain front teach week final gave green quick develop ocean warm free minute strong
special mind behind clear tail produce fact street inch multiply nothing course stay wheel full force blue
object decide surface deep moon island foot system busy test record boat common gold possible plane stead
dry wonder laugh thousand ago ran check game shape equate hot miss brought heat snow tire bring yes distant
fill east paint language among model token server request decode memory kernel layer tensor batch
""".split()

_SPACE = "\u0120"  # byte-level symbol of b" "
_NEWLINE = "\u010a"  # of b"\n"
_TAB = "\u0109"  # of b"\t"


@dataclasses.dataclass(frozen=True)
class TokenizerSpec:
    vocab_size: int  # total entries, equal to the model's vocab_size
    first_special_id: int  # = number of BPE tokens; specials fill [first_special_id, vocab_size)
    family: str  # "llama3" | "qwen"
    model_max_length: int = 131072

    def __post_init__(self) -> None:
        if self.family not in _SPLIT_REGEX:
            raise ValueError(f"unknown tokenizer family {self.family!r}")
        if not 256 + 64 <= self.first_special_id < self.vocab_size:
            raise ValueError(f"first_special_id {self.first_special_id} outside [320, {self.vocab_size})")
        if self.vocab_size - self.first_special_id < len(self.named_specials):
            raise ValueError(f"{self.vocab_size - self.first_special_id} special ids cannot hold {self.named_specials}")

    @property
    def named_specials(self) -> tuple[str, ...]:
        return _LLAMA3_SPECIALS if self.family == "llama3" else _QWEN_SPECIALS

    @property
    def special_tokens(self) -> list[str]:
        """All special tokens in id order from first_special_id."""
        n = self.vocab_size - self.first_special_id
        named = list(self.named_specials)
        if self.family == "llama3":
            start = _LLAMA3_RESERVED_FIRST
            return named + [f"<|reserved_special_token_{start + k}|>" for k in range(n - len(named))]
        return named + [f"<|extra_special_{k}|>" for k in range(n - len(named))]

    @property
    def bos_token(self) -> str:
        return self.named_specials[0]

    @property
    def eos_token(self) -> str:
        return "<|end_of_text|>" if self.family == "llama3" else "<|im_end|>"

    @property
    def chat_stop_tokens(self) -> list[str]:
        """Tokens that end a generation (generation_config eos ids): end of text and end of turn."""
        if self.family == "llama3":
            return ["<|end_of_text|>", "<|eom_id|>", "<|eot_id|>"]
        return ["<|im_end|>", "<|endoftext|>"]

    @property
    def add_bos(self) -> bool:
        return self.family == "llama3"

    @property
    def chat_template(self) -> str:
        return _LLAMA3_CHAT_TEMPLATE if self.family == "llama3" else _QWEN_CHAT_TEMPLATE

    def token_id(self, token: str) -> int:
        return self.first_special_id + self.special_tokens.index(token)


def spec_for_config(cfg: Mapping[str, Any]) -> TokenizerSpec:
    """The tokenizer layout of a shape config (see kog_backend.shapes): specials start at bos_token_id."""
    family = {"llama": "llama3", "qwen3": "qwen"}[cfg["model_type"]]
    spec = TokenizerSpec(
        vocab_size=int(cfg["vocab_size"]),
        first_special_id=int(cfg["bos_token_id"]),
        family=family,
        model_max_length=int(cfg["max_position_embeddings"]),
    )
    if spec.token_id(spec.eos_token) != cfg["eos_token_id"]:
        raise ValueError(f"config eos_token_id {cfg['eos_token_id']} != id of {spec.eos_token} in the tokenizer")
    return spec


def bytes_to_unicode() -> dict[int, str]:
    """Byte -> printable character, as byte-level BPE (GPT-2) maps them: printable Latin-1 bytes map to
    themselves, the other 68 to U+0100 onwards in byte order."""
    keep = [*range(ord("!"), ord("~") + 1), *range(ord("\u00a1"), ord("\u00ac") + 1), *range(ord("\u00ae"), ord("\u00ff") + 1)]
    out = {b: chr(b) for b in keep}
    extra = 0
    for b in range(256):
        if b not in out:
            out[b] = chr(256 + extra)
            extra += 1
    return out


def _to_symbols(text: str, byte_map: Mapping[int, str]) -> str:
    return "".join(byte_map[b] for b in text.encode("utf-8"))


def _word_corpus(byte_map: Mapping[int, str]) -> list[tuple[str, int]]:
    """(pre-token in byte symbols, count): each word with a leading space, bare, and capitalised, with
    Zipf-like counts by rank. Sorted, so the trainer sees the same input every time."""
    counts: dict[str, int] = {}
    for rank, w in enumerate(_WORDS):
        c = 1_000_000 // (rank + 10)
        for form, share in ((" " + w, 8), (w, 2), (" " + w.capitalize(), 1)):
            key = _to_symbols(form, byte_map)
            counts[key] = counts.get(key, 0) + c * share
    return sorted(counts.items())


def _train_bpe(corpus: list[tuple[str, int]], budget: int) -> list[tuple[str, str]]:
    """Classic BPE on a small corpus: repeatedly merge the most frequent adjacent pair (ties: smallest
    pair lexicographically), until `budget` merges or nothing is left to merge. Pair counts are kept
    incrementally; a lazy max-heap holds (-count, pair) entries, stale ones are skipped on pop."""
    words = [list(w) for w, _ in corpus]
    freqs = [c for _, c in corpus]
    pair_count: dict[tuple[str, str], int] = {}
    pair_words: dict[tuple[str, str], set[int]] = {}
    for wi, syms in enumerate(words):
        for p in zip(syms, syms[1:]):
            pair_count[p] = pair_count.get(p, 0) + freqs[wi]
            pair_words.setdefault(p, set()).add(wi)
    heap = [(-c, p) for p, c in pair_count.items()]
    heapq.heapify(heap)
    merges: list[tuple[str, str]] = []
    while heap and len(merges) < budget:
        negc, pair = heapq.heappop(heap)
        if pair_count.get(pair, 0) != -negc or negc == 0:
            continue
        merges.append(pair)
        merged = pair[0] + pair[1]
        touched: dict[tuple[str, str], None] = {}
        for wi in sorted(pair_words.pop(pair, ())):
            syms, f = words[wi], freqs[wi]
            for p in zip(syms, syms[1:]):
                pair_count[p] -= f
                touched[p] = None
            out, i = [], 0
            while i < len(syms):
                if i + 1 < len(syms) and (syms[i], syms[i + 1]) == pair:
                    out.append(merged)
                    i += 2
                else:
                    out.append(syms[i])
                    i += 1
            words[wi] = out
            for p in zip(out, out[1:]):
                pair_count[p] = pair_count.get(p, 0) + f
                pair_words.setdefault(p, set()).add(wi)
                touched[p] = None
        pair_count.pop(pair, None)
        for p in touched:
            c = pair_count.get(p, 0)
            if p != pair and c > 0:
                heapq.heappush(heap, (-c, p))
    return merges


def _chain_merges(pieces: list[str]) -> list[tuple[str, str]]:
    """Merges building each string left to right from its single symbols: ((a b) c) ..."""
    return [(s[:-1], s[-1]) for s in pieces]


def build_vocab_and_merges(num_bpe_tokens: int) -> tuple[dict[str, int], list[tuple[str, str]]]:
    """Exactly `num_bpe_tokens` BPE tokens (ids 0..n-1) and the merges that produce ids 256..n-1."""
    byte_map = bytes_to_unicode()
    vocab: dict[str, int] = {}
    merges: list[tuple[str, str]] = []

    def add(a: str, b: str) -> bool:
        if len(vocab) >= num_bpe_tokens or a + b in vocab:
            return False
        vocab[a + b] = len(vocab)
        merges.append((a, b))
        return True

    for b in range(256):
        vocab[byte_map[b]] = b
    # Whitespace runs (indentation) and digit groups (the llama3 pre-tokenizer keeps up to 3 digits together).
    runs = [ch * n for ch, top in ((_SPACE, 16), (_NEWLINE, 4), (_TAB, 4)) for n in range(2, top + 1)]
    digits = [f"{n:0{k}d}" for k in (2, 3) for n in range(10**k)]
    for a, b in _chain_merges(runs + digits):
        add(a, b)
    for a, b in _train_bpe(_word_corpus(byte_map), budget=max(0, num_bpe_tokens - len(vocab))):
        add(a, b)
    # Space + every letter, ranked after the words' merges (so those still apply), so that the filler stems
    # below cover word starts with any letter.
    for a, b in _chain_merges([_SPACE + chr(c) for c in (*range(ord("A"), ord("Z") + 1), *range(ord("a"), ord("z") + 1))]):
        add(a, b)
    # Filler: breadth first over stem + lowercase letter, stems being the letter-only tokens so far.
    letters = [chr(c) for c in range(ord("a"), ord("z") + 1)]
    queue = deque(t for t in vocab if t.lstrip(_SPACE).isascii() and t.lstrip(_SPACE).isalpha())
    while len(vocab) < num_bpe_tokens:
        stem = queue.popleft()
        for c in letters:
            if add(stem, c):
                queue.append(stem + c)
    assert len(vocab) == num_bpe_tokens, (len(vocab), num_bpe_tokens)
    return vocab, merges


def build_tokenizer(spec: TokenizerSpec):
    """A `tokenizers.Tokenizer` with exactly spec.vocab_size entries."""
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors

    vocab, merges = build_vocab_and_merges(spec.first_special_id)
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, dropout=None, fuse_unk=False, byte_fallback=False))
    if spec.family == "qwen":
        tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(_SPLIT_REGEX[spec.family]), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    byte_level = processors.ByteLevel(trim_offsets=False)
    if spec.add_bos:
        bos, bos_id = spec.bos_token, spec.first_special_id
        template = processors.TemplateProcessing(
            single=f"{bos}:0 $A:0", pair=f"{bos}:0 $A:0 {bos}:1 $B:1", special_tokens=[(bos, bos_id)]
        )
        tok.post_processor = processors.Sequence([byte_level, template])
    else:
        tok.post_processor = byte_level
    specials = [AddedToken(t, special=True, normalized=False, lstrip=False, rstrip=False, single_word=False)
                for t in spec.special_tokens]
    tok.add_special_tokens(specials)
    if tok.get_vocab_size(with_added_tokens=True) != spec.vocab_size:
        raise AssertionError(f"built {tok.get_vocab_size(with_added_tokens=True)} entries, want {spec.vocab_size}")
    if tok.token_to_id(spec.special_tokens[0]) != spec.first_special_id:
        raise AssertionError("special tokens did not land at first_special_id")
    return tok


def tokenizer_config(spec: TokenizerSpec) -> dict[str, Any]:
    """tokenizer_config.json: the fast tokenizer class (reads tokenizer.json as is), special tokens, chat
    template."""
    added = {
        str(spec.first_special_id + i): {
            "content": t, "lstrip": False, "normalized": False, "rstrip": False, "single_word": False, "special": True,
        }
        for i, t in enumerate(spec.special_tokens)
    }
    return {
        "added_tokens_decoder": added,
        "bos_token": spec.bos_token if spec.add_bos else None,
        "eos_token": spec.eos_token,
        "pad_token": None,
        "chat_template": spec.chat_template,
        "clean_up_tokenization_spaces": False,
        "model_input_names": ["input_ids", "attention_mask"],
        "model_max_length": spec.model_max_length,
        "tokenizer_class": "PreTrainedTokenizerFast",
    }


def generation_config(spec: TokenizerSpec) -> dict[str, Any]:
    """The token-id fields of generation_config.json that this tokenizer implies: BOS and the end-of-generation
    ids. The file a checkpoint gets adds its model family's sampling defaults (shapes.generation_config)."""
    return {
        "bos_token_id": spec.first_special_id,
        "eos_token_id": [spec.token_id(t) for t in spec.chat_stop_tokens],
    }


def save_tokenizer(spec: TokenizerSpec, out_dir: str) -> list[str]:
    """Write tokenizer.json, tokenizer_config.json and special_tokens_map.json; return the paths."""
    os.makedirs(out_dir, exist_ok=True)
    tok = build_tokenizer(spec)
    paths = [os.path.join(out_dir, n) for n in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")]
    tok.save(paths[0], pretty=False)
    special_map = {"eos_token": spec.eos_token}
    if spec.add_bos:
        special_map["bos_token"] = spec.bos_token
    for path, obj in zip(paths[1:], (tokenizer_config(spec), special_map)):
        with open(path, "w") as f:
            json.dump(obj, f, indent=2, ensure_ascii=False)
            f.write("\n")
    return paths
