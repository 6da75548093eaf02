"""The trained CPU default, `tiny-english`: a real snapshot of config.TINY_ENGLISH under 10 MB, its tokenizer, and
issue 49's bar on the command line (English words, no loop, under 60 s on 2 cores).

The full sweep of prompts and seeds is `python scripts/english_bar.py`; here one greedy and one sampled run.
"""

import json
import sys
from pathlib import Path

import pytest

from qwen_lab import load_tokenizer
from qwen_lab.config import TINY_ENGLISH, Qwen35Config
from qwen_lab.safetensors_file import read_safetensors_header
from qwen_lab.snapshot import TINY_ENGLISH_DIR, expected_tensors, resolve_source

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
import english_bar  # noqa: E402


def test_tiny_english_is_a_real_snapshot_of_its_preset_under_10_mb():
    assert resolve_source("tiny-english") == TINY_ENGLISH_DIR
    config = Qwen35Config.from_file(TINY_ENGLISH_DIR)
    assert config.replace(name="tiny-english") == TINY_ENGLISH
    assert config.num_linear_layers == 3 and config.num_full_layers == 1  # both layer kinds, the real 3:1 pattern
    header = read_safetensors_header(TINY_ENGLISH_DIR / "model.safetensors")
    assert set(header) == {"model." + k for k in expected_tensors(TINY_ENGLISH)}
    for name, info in header.items():
        fp32 = name.endswith(("linear_attn.A_log", "linear_attn.norm.weight"))
        assert info.dtype == ("F32" if fp32 else "BF16"), name
    assert (TINY_ENGLISH_DIR / "model.safetensors").stat().st_size <= 10_000_000
    assert sum(f.stat().st_size for f in TINY_ENGLISH_DIR.iterdir()) <= 10_000_000
    card = (TINY_ENGLISH_DIR / "README.md").read_text()
    assert "r-cran-janeaustenr" in card and "MIT" in card and "public domain" in card and "Held-out loss" in card


def test_tiny_english_tokenizer_has_the_chat_tokens_on_top():
    tok = load_tokenizer("tiny-english")
    assert tok.vocab_size == TINY_ENGLISH.vocab_size
    assert tok.special_tokens == {"<|endoftext|>": 4093, "<|im_start|>": 4094, "<|im_end|>": 4095}
    assert set(tok.eos_token_ids) == set(TINY_ENGLISH.eos_token_ids)
    text = "\"My dear Emma,\" said Mr. Knightley, \"it is a fine day.\""
    ids = tok.encode(text)
    assert tok.decode(ids) == text
    assert len(ids) < len(text.split()) * 2  # a BPE of words: mostly one or two tokens a word
    chat = tok.apply_chat_template([{"role": "user", "content": "Hello"}], add_generation_prompt=True)
    assert chat == "<|im_start|>user\nHello<|im_end|>\n<|im_start|>assistant\n"
    assert json.loads((TINY_ENGLISH_DIR / "tokenizer_config.json").read_text())["eos_token"] == "<|im_end|>"


@pytest.fixture(scope="module")
def words():
    if not english_bar.WORDS_FILE.is_file():
        pytest.skip(f"{english_bar.WORDS_FILE}: no word list; install Debian's wamerican (.ci/run does)")
    return english_bar.english_words()


def test_judge_tells_english_from_noise_and_loops(words):
    assert not english_bar.judge(" she was very happy to see her sister again, and they walked home", words)[
        "problems"]
    assert english_bar.judge(" �ns R d xq zzk vvr qqp", words)["problems"]
    assert english_bar.judge(", and, and, and, and, and, and, and, and", words)["problems"]   # too few words, a loop
    looped = english_bar.judge(" at the house at the house at the house at the house", words)
    assert any("a loop" in p for p in looped["problems"])


@pytest.mark.slow
@pytest.mark.quiet
@pytest.mark.parametrize("temperature,seed", [(0.0, 0), (0.8, 1)], ids=["greedy", "sampled"])
def test_cli_default_writes_english(words, temperature, seed):
    """`python -m qwen_lab.generate --max-new-tokens 32` on the default model and prompt: at least 85% English
    words, no 3-word run more than 3 times, in under 60 s (the whole command, start to exit) on a quiet 2-core
    machine. Marked quiet, so other pytest-xdist workers wait while it runs (tests/xdist_quiet.py): beside a busy
    worker the command's CPU time grew too (a run of 34 s alone took 61 s of CPU in CI). The time held to the bar
    is the CPU time; the wall time has a hang's limit of twice that."""
    prompt, text, seconds, cpu = english_bar.run_cli(None, temperature, seed, 0.9 if temperature else 1.0)
    verdict = english_bar.judge(text, words)
    assert not verdict["problems"], f"{prompt!r} -> {text!r}: {verdict['problems']}"
    assert cpu < english_bar.MAX_SECONDS, f"{cpu:.0f} s of CPU time for 32 tokens ({seconds:.0f} s wall): {text!r}"
    assert seconds < 2 * english_bar.MAX_SECONDS, f"{seconds:.0f} s wall for 32 tokens: {text!r}"


def test_tiny_english_tokenizer_matches_transformers():
    transformers = pytest.importorskip("transformers")
    hf = transformers.AutoTokenizer.from_pretrained(TINY_ENGLISH_DIR)
    tok = load_tokenizer("tiny-english")
    for text in ("It is a truth universally acknowledged, that a single man", "Café, naïve; 1811-1818!\n\n  x",
                 "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"):
        assert hf(text, add_special_tokens=False)["input_ids"] == tok.encode(text), text
    assert hf.eos_token == "<|im_end|>" and hf.pad_token == "<|endoftext|>"
