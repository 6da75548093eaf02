"""The tiny model, built from nothing: its config, its tokenizer, its random weights, written as a snapshot.

The course runs on a CPU on `qwen_lab/data/tiny`, a real snapshot that `qwen_lab.snapshot` reads like any
downloaded one. This module writes it, deterministically (two builds give byte-identical files):

    python -m qwen_lab.tiny DIR        # the committed copy: python -m qwen_lab.tiny qwen_lab/data/tiny

- the config: `config.TINY` with the tiny tokenizer's special-token ids (`tiny_config`);
- the weights: `random_state_dict(config, seed=0)`, bf16 matrices and fp32 A_log and gated norm, as in the
  released checkpoints;
- the tokenizer: the same pre-tokenizer as Qwen's, with 253 merges learned from a short embedded English text
  (`TINY_CORPUS`), 256 byte tokens and the special tokens `<|endoftext|>`, `<|im_start|>`, `<|im_end|>`: 512
  tokens, the tiny config's vocab_size. The training and the JSON writing are done here by hand so that the files
  are identical on every machine. `qwen_lab.tokenizer` loads it like any other.
"""

from __future__ import annotations

import argparse
import json
import sys
import unicodedata
from collections import Counter
from pathlib import Path

from .config import TINY, Qwen35Config
from .errors import QwenLabError, TokenizerError
from .export import write_json
from .safetensors_file import write_safetensors
from .snapshot import SINGLE_FILE, TINY_DIR
from .weights import random_state_dict

# Qwen3.5's pre-tokenizer regex: contractions, letter runs (with one leading non-letter), single digits,
# punctuation runs, newlines, spaces.
PRETOKENIZE_REGEX = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}"
                     r"| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")

TINY_VOCAB_SIZE = 512
TINY_SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
TINY_SPECIAL_IDS = {tok: TINY_VOCAB_SIZE - len(TINY_SPECIAL_TOKENS) + i for i, tok in enumerate(TINY_SPECIAL_TOKENS)}

# ChatML, as Qwen writes it: every message is <|im_start|>{role}\n{content}<|im_end|>\n; a generation prompt opens
# the assistant's turn. Content may also be a list of parts ({"type": "text", "text": ...}).
TINY_CHAT_TEMPLATE = (
    "{%- for message in messages %}\n"
    "    {%- if message['content'] is string %}\n"
    "        {%- set content = message['content'] %}\n"
    "    {%- else %}\n"
    "        {%- set content = message['content'] | selectattr('type', 'equalto', 'text')"
    " | map(attribute='text') | join('') %}\n"
    "    {%- endif %}\n"
    "    {{- '<|im_start|>' + message['role'] + '\\n' + content + '<|im_end|>' + '\\n' }}\n"
    "{%- endfor %}\n"
    "{%- if add_generation_prompt %}\n"
    "    {{- '<|im_start|>assistant\\n' }}\n"
    "{%- endif %}\n"
)

# The text the tiny tokenizer's merges are learned from.
TINY_CORPUS = """\
This course builds the forward pass of a small language model out of kernels that you write yourself.
Each notebook adds one kernel: the embedding, the normalization, the matrix multiplication, the rotary
embedding, the attention, the convolution and the delta rule. Every kernel is checked against a plain
PyTorch reference before the next notebook uses it. At the end the whole model generates text with
your kernels, and a benchmark compares its speed with the reference implementation.

Triton is a language for writing GPU kernels in Python. A Triton kernel runs as many programs at once;
each program works on one block of the data. You load a block from memory, compute on it, and store
the result. The compiler decides how the threads of a block share the work, so you think in blocks and
tiles, not in single threads. When there is no GPU, the Triton interpreter runs the same kernel on the
CPU with NumPy, one program at a time. It is slow, but it lets you test a kernel anywhere.

A GPU has thousands of cores and a memory with a very high bandwidth. Most kernels of a language model
are limited by memory, not by arithmetic: to generate one token, every weight of the model is read once
from memory. The time to read the weights is the floor for the time per token. A matrix multiplication
of a long prompt is limited by arithmetic instead, and there the tensor cores do the work.

The model is a hybrid. Three of every four layers use Gated DeltaNet, a linear attention with a state
of fixed size that is updated by the delta rule. The fourth layer uses gated attention: queries, keys
and values with a key value cache, a causal softmax, and a sigmoid gate on the output. Every layer then
has a gated feed forward network. The tokens are the input, and the output is a score for each token of
the vocabulary: the logits. The next token is sampled from these scores, with a temperature, top k and
top p.

The user asks a question and the assistant answers it. The system message tells the assistant how to
behave. Hello! How are you today? I am fine, thank you. What is a kernel? A kernel is a function that
runs on the GPU. Why is the model fast? Because it reads its weights only once for every token, and the
kernels are launched from a graph. Please explain the attention in simple words. The attention lets each
token look at the tokens before it and take a weighted mean of their values.

We measure the time of each kernel in milliseconds and the number of tokens per second. We compare the
bandwidth that a kernel reaches with the bandwidth of the memory. A good kernel reaches more than eighty
percent of it. We check the results with a tolerance: the values of a kernel and of the reference are
close, but not equal, because the order of the additions is different. In float32 the error is small;
in bfloat16 it is larger, and the test uses a larger tolerance.

The weights of the model are stored in safetensors files. The loader reads the header of each file,
checks the name and the shape of every tensor against the config, and fuses the projections that read
the same input into one matrix. The tokenizer splits the text into words and the words into tokens with
byte pair encoding. A token is a piece of a word, a whole word, a number, a space, or a sign like . , ; : ! ?
The chat template writes each message between a start marker and an end marker with its role: system,
user, assistant. Numbers are split into digits: 0 1 2 3 4 5 6 7 8 9, 10, 64, 128, 256, 1024, 2048, 4096.
"""


# ------------------------------------------------------------------ building the tiny tokenizer


def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte -> printable character map used by byte-level BPE (printable bytes map to themselves)."""
    bs = (list(range(ord("!"), ord("~") + 1)) + list(range(ord("\u00a1"), ord("\u00ac") + 1))
          + list(range(ord("\u00ae"), ord("\u00ff") + 1)))
    cs = list(bs)
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs)}


def _pre_tokenizer():
    from tokenizers import Regex, pre_tokenizers

    return pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(PRETOKENIZE_REGEX), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])


def train_bpe(corpus: str, vocab_size: int) -> tuple[dict[str, int], list[tuple[str, str]]]:
    """Byte-level BPE training, written out: start from the 256 byte symbols, repeatedly merge the most frequent
    adjacent pair (ties: the smallest pair in string order) until the vocabulary has `vocab_size` tokens."""
    alphabet = bytes_to_unicode()
    vocab = {ch: i for i, ch in enumerate(alphabet.values())}
    words = Counter(w for w, _ in _pre_tokenizer().pre_tokenize_str(unicodedata.normalize("NFC", corpus)))
    split = {w: list(w) for w in words}
    merges: list[tuple[str, str]] = []
    while len(vocab) < vocab_size:
        pairs: Counter = Counter()
        for w, count in words.items():
            s = split[w]
            for pair in zip(s, s[1:]):
                pairs[pair] += count
        if not pairs:
            raise TokenizerError(f"corpus: allows only {len(vocab)} tokens (every pair of symbols merged), "
                                 f"fewer than vocab_size={vocab_size}; expected a longer corpus or a smaller "
                                 "vocab_size")
        best = min(pairs.items(), key=lambda kv: (-kv[1], kv[0]))[0]
        merges.append(best)
        joined = best[0] + best[1]
        vocab.setdefault(joined, len(vocab))
        for w, s in split.items():
            i, out = 0, []
            while i < len(s):
                if i + 1 < len(s) and s[i] == best[0] and s[i + 1] == best[1]:
                    out.append(joined)
                    i += 2
                else:
                    out.append(s[i])
                    i += 1
            split[w] = out
    return vocab, merges


def tokenizer_json(vocab: dict[str, int], merges: list[tuple[str, str]], special_ids: dict[str, int]) -> dict:
    """A byte-level BPE tokenizer.json with Qwen's normalizer, pre-tokenizer and decoder: `vocab` and `merges` from
    `train_bpe` (or any trainer of the same byte alphabet), `special_ids` the special tokens and their ids."""
    added = [{"id": i, "content": t, "single_word": False, "lstrip": False, "rstrip": False,
              "normalized": False, "special": True} for t, i in special_ids.items()]
    byte_level = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False}
    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": added,
        "normalizer": {"type": "NFC"},
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": PRETOKENIZE_REGEX}, "behavior": "Isolated", "invert": False},
            byte_level]},
        "post_processor": byte_level,
        "decoder": byte_level,
        "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": "",
                  "end_of_word_suffix": "", "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
                  "vocab": vocab, "merges": [list(m) for m in merges]},
    }


def tiny_tokenizer_json() -> dict:
    """The tiny tokenizer.json: Qwen's normalizer, pre-tokenizer and decoder, a BPE trained on TINY_CORPUS."""
    vocab, merges = train_bpe(TINY_CORPUS, TINY_VOCAB_SIZE - len(TINY_SPECIAL_TOKENS))
    return tokenizer_json(vocab, merges, TINY_SPECIAL_IDS)


def write_tokenizer(directory, tokenizer: dict, special_ids: dict[str, int], model_max_length: int = 4096) -> None:
    """Write tokenizer.json (`tokenizer`, from `tokenizer_json`) and tokenizer_config.json with the ChatML
    template, <|im_end|> as eos and <|endoftext|> as pad: the files of the tiny snapshots."""
    directory = Path(directory)
    (directory / "tokenizer.json").write_bytes(
        (json.dumps(tokenizer, ensure_ascii=False, indent=1) + "\n").encode("utf-8"))
    tcfg = {
        "tokenizer_class": "Qwen2Tokenizer",
        "added_tokens_decoder": {str(i): {"content": t, "lstrip": False, "normalized": False,
                                          "rstrip": False, "single_word": False, "special": True}
                                 for t, i in special_ids.items()},
        "additional_special_tokens": ["<|im_start|>", "<|im_end|>"],
        "bos_token": None,
        "eos_token": "<|im_end|>",
        "pad_token": "<|endoftext|>",
        "unk_token": None,
        "errors": "replace",
        "add_prefix_space": False,
        "clean_up_tokenization_spaces": False,
        "split_special_tokens": False,
        "model_max_length": model_max_length,
        "chat_template": TINY_CHAT_TEMPLATE,
    }
    (directory / "tokenizer_config.json").write_bytes(
        (json.dumps(tcfg, ensure_ascii=False, indent=2, sort_keys=True) + "\n").encode("utf-8"))


def write_tiny_tokenizer(directory) -> None:
    """Write tokenizer.json and tokenizer_config.json (with the ChatML template) of the tiny model."""
    write_tokenizer(directory, tiny_tokenizer_json(), TINY_SPECIAL_IDS)


# ------------------------------------------------------------------ the tiny snapshot


def tiny_config() -> Qwen35Config:
    """config.TINY with the special-token ids of the tiny tokenizer (eos: <|im_end|>, <|endoftext|>; pad)."""
    eot, im_end = TINY_SPECIAL_IDS["<|endoftext|>"], TINY_SPECIAL_IDS["<|im_end|>"]
    return TINY.replace(eos_token_ids=(im_end, eot), pad_token_id=eot, bos_token_id=None, name="tiny")


def build_tiny_checkpoint(directory) -> Path:
    """Write the tiny model as a real snapshot: config.json (flat), model.safetensors (random_state_dict(TINY, 0):
    bf16 matrices, fp32 A_log and gated norm), tokenizer.json, tokenizer_config.json, generation_config.json.

    Deterministic: two builds give byte-identical files. The result is committed as qwen_lab/data/tiny.
    """
    config = tiny_config()
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    write_json(directory / "config.json", config.to_hf_dict())
    write_safetensors(directory / SINGLE_FILE, random_state_dict(config, seed=0))
    write_tiny_tokenizer(directory)
    gen = {"eos_token_id": list(config.eos_token_ids), "pad_token_id": config.pad_token_id, "do_sample": False}
    write_json(directory / "generation_config.json", gen)
    return directory


# ------------------------------------------------------------------ command line


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m qwen_lab.tiny", description=__doc__.split("\n\n")[0])
    p.add_argument("directory", help=f"where to write the snapshot (the committed copy: {TINY_DIR})")
    args = p.parse_args(argv)
    try:
        out = build_tiny_checkpoint(args.directory)
    except (QwenLabError, OSError) as e:  # an OSError: DIR cannot be written
        print(f"error: {e}", file=sys.stderr)
        return 2
    for f in sorted(out.iterdir()):
        print(f"{f}  {f.stat().st_size} bytes")
    return 0


if __name__ == "__main__":
    sys.exit(main())
