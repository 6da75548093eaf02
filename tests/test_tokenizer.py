"""The tokenizer: round trips, special tokens, the chat template, eos ids, streaming decode, unknown ids."""

import json
import shutil

import numpy as np
import pytest
import torch

from qwen_lab.config import QWEN35_0_8B, TINY
from qwen_lab.errors import CheckpointError, QwenLabError, TokenizerError, TokenizerTypeError
from qwen_lab.snapshot import TINY_DIR
from qwen_lab.tiny import TINY_CORPUS, TINY_SPECIAL_IDS, bytes_to_unicode, tiny_tokenizer_json, train_bpe
from qwen_lab.tokenizer import Tokenizer, load_tokenizer
from qwen_lab.weights import load_weights

TEXTS = [
    "Hello, Triton! The kernel reads every weight once per token.",
    "Numbers: 3.14159, 2048 tokens/s, 0.358 ms.\n\nTwo newlines,   three spaces\tand a tab.",
    "Unicode: naïve café, Größe, 東京, ελληνικά, emoji 🙂🚀 and a ZWJ family 👨‍👩‍👧.",
    "",
    " leading and trailing spaces ",
    "it's they're we've I'm you'll he'd",
]


@pytest.fixture(scope="module")
def tok():
    return load_tokenizer("tiny")


def copy_tiny(tmp_path):
    dst = tmp_path / "snap"
    shutil.copytree(TINY_DIR, dst)
    return dst


# ---------------------------------------------------------------- encode / decode


@pytest.mark.parametrize("text", TEXTS)
def test_round_trip(tok, text):
    ids = tok.encode(text)
    assert all(0 <= i < tok.vocab_size for i in ids)
    assert tok.decode(ids) == text


def test_vocabulary_matches_the_tiny_config(tok):
    assert tok.vocab_size == TINY.vocab_size == 512
    assert sorted(tok.id_to_token(i) is not None for i in range(512)) == [True] * 512


def test_merges_are_learned_from_english(tok):
    text = "the kernel reads the weights of the model"
    ids = tok.encode(text)
    assert len(ids) < len(text.encode()) / 2.5, [tok.id_to_token(i) for i in ids]
    assert tok.id_to_token(tok.encode(" the")[0]) == "Ġthe"


def test_bpe_training_is_deterministic_and_fills_the_vocabulary():
    vocab, merges = train_bpe(TINY_CORPUS, 509)
    assert len(vocab) == 509 and len(set(vocab.values())) == 509 and len(merges) >= 253
    assert list(vocab)[:256] == list(bytes_to_unicode().values())
    assert tiny_tokenizer_json() == tiny_tokenizer_json()


def test_encoding_matches_transformers(tok):
    transformers = pytest.importorskip("transformers")
    hf = transformers.AutoTokenizer.from_pretrained(TINY_DIR)
    for text in TEXTS + ["<|im_start|>user\nHi<|im_end|>\n"]:
        assert hf(text, add_special_tokens=False)["input_ids"] == tok.encode(text), text
    assert hf.eos_token == "<|im_end|>" and hf.pad_token == "<|endoftext|>"


def test_decode_accepts_tensors_and_single_ids(tok):
    ids = tok.encode("Triton kernels")
    assert tok.decode(torch.tensor(ids)) == "Triton kernels"
    assert tok.decode(ids[0]) == tok.decode(ids[:1])


def test_decode_accepts_integer_ids_of_every_kind(tok):
    ids = tok.encode("Triton kernels")
    text = tok.decode(ids)
    for same in (tuple(ids), np.array(ids), np.array(ids, dtype=np.int32), [np.int64(i) for i in ids],
                 torch.tensor(ids, dtype=torch.int32), [torch.tensor(i) for i in ids],
                 [torch.tensor([i]) for i in ids]):  # (the last: what a generation loop collects, one [1] per token)
        assert tok.decode(same) == text, type(same)
    assert tok.decode(torch.tensor(ids[0])) == tok.decode(np.int16(ids[0])) == tok.decode(ids[:1])
    assert tok.decode([]) == tok.decode(torch.tensor([], dtype=torch.long)) == ""


@pytest.mark.parametrize("ids, got, hint", [
    ([1.7], r"float 1\.7 at ids\[0\]", "a float is refused, even a whole one like 1.0"),
    ([3, 1.0], r"float 1\.0 at ids\[1\]", "a float is refused"),
    (2.0, "float 2.0", "a float is refused"),
    (torch.tensor([1.0, 2.0]), r"a torch\.Tensor of dtype torch\.float32 and shape \(2,\)", "a float is refused"),
    (np.array([1.5]), r"a numpy\.ndarray of dtype float64", "a float is refused"),
    ([True, 2], "bool True at ids\\[0\\]", "a bool is not a token id"),
    (torch.tensor([True]), r"a torch\.Tensor of dtype torch\.bool", "a bool is not a token id"),
    ("abc", "str 'abc'", "use encode(text)"),
    (b"ab", "bytes b'ab'", "use encode(text)"),
    (None, "None", ""),
    ([[1, 2]], r"list \[1, 2\] at ids\[0\]", "decode one sequence at a time"),
    (torch.tensor([[1, 2]]), r"a torch\.Tensor of dtype torch\.int64 and shape \(1, 2\)",
     "decode one sequence at a time (ids[0] of a [1, T] batch)"),
    ({1, 2}, r"set \{1, 2\}", ""),
])
def test_decode_rejects_what_is_not_token_ids(tok, ids, got, hint):
    expected = "an int, a list or tuple of ints, or an integer tensor or NumPy array of 0 or 1 dimensions"
    with pytest.raises(TokenizerTypeError, match=rf"ids: expected token ids: {expected}, got {got}") as e:
        tok.decode(ids)
    assert hint in str(e.value)
    assert isinstance(e.value, QwenLabError) and isinstance(e.value, TypeError)


def test_single_id_entries_check_their_id(tok):
    with pytest.raises(TokenizerTypeError, match="token_id: expected token ids.*got float 5.0"):
        tok.id_to_token(5.0)
    with pytest.raises(TokenizerTypeError, match="token_id: expected token ids.*got str '5'"):
        tok.stream_decoder().push("5")
    assert tok.id_to_token(np.int64(510)) == tok.id_to_token(torch.tensor(510)) == "<|im_start|>"
    assert tok.id_to_token(-1) is None and tok.id_to_token(512) is None and tok.id_to_token(2**70) is None


def test_encode_rejects_non_text(tok):
    with pytest.raises(TokenizerError, match="text: expected a str, got list") as e:
        tok.encode([1, 2, 3])
    assert isinstance(e.value, QwenLabError)
    assert isinstance(e.value, TypeError), "a caller's `except TypeError` still catches it"


def test_encode_rejects_a_lone_surrogate_naming_the_character_and_its_index(tok):
    # what `--prompt $'abc\xff'` becomes: Python decodes the command line with errors='surrogateescape'
    text = b"abc\xff".decode("utf-8", "surrogateescape")
    with pytest.raises(TokenizerError, match=r"text: character U\+DCFF at index 3 is not valid Unicode "
                                             r"\(an undecodable byte 0xFF of the input\?\)") as e:
        tok.encode(text)
    assert isinstance(e.value, QwenLabError) and isinstance(e.value, ValueError)
    with pytest.raises(TokenizerError, match=r"text: character U\+D83D at index 2 .*surrogate pair"):
        tok.encode("hi\ud83d")  # half of 🙂 in UTF-16
    big = QWEN35_0_8B.vocab_size - 1
    text = f"a <|id:{big}|>\udcff"  # also on the path that encodes the text piece by piece around placeholders
    with pytest.raises(TokenizerError, match=rf"text: character U\+DCFF at index {len(text) - 1} "):
        tok.encode(text)
    with pytest.raises(TokenizerError, match=r"token: character U\+DCFF at index 0"):
        tok.token_to_id("\udcff")
    with pytest.raises(TokenizerTypeError, match="token: expected a str, got int"):
        tok.token_to_id(5)


def test_bpe_training_on_too_short_a_corpus_names_both_arguments():
    with pytest.raises(TokenizerError, match=r"corpus: allows only 257 tokens.*vocab_size=300") as e:
        train_bpe("ab", 300)
    assert isinstance(e.value, QwenLabError) and isinstance(e.value, ValueError)


# ---------------------------------------------------------------- special tokens


def test_special_tokens_are_single_ids(tok):
    assert tok.special_tokens == {"<|endoftext|>": 509, "<|im_start|>": 510, "<|im_end|>": 511} == TINY_SPECIAL_IDS
    for text, i in tok.special_tokens.items():
        assert tok.encode(text) == [i]
        assert tok.decode([i]) == text
    ids = tok.encode("<|im_start|>user\nhello<|im_end|>")
    assert ids[0] == 510 and ids[-1] == 511 and 510 not in ids[1:-1]


def test_skip_special_tokens(tok):
    ids = tok.encode("<|im_start|>assistant\nHello!<|im_end|>")
    assert tok.decode(ids, skip_special_tokens=True) == "assistant\nHello!"


# ---------------------------------------------------------------- chat template


def test_chat_template_renders_chatml(tok):
    messages = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "What is a kernel?"}]
    expected = ("<|im_start|>system\nYou are terse.<|im_end|>\n"
                "<|im_start|>user\nWhat is a kernel?<|im_end|>\n")
    assert tok.apply_chat_template(messages, add_generation_prompt=False) == expected
    assert tok.apply_chat_template(messages) == expected + "<|im_start|>assistant\n"


def test_chat_template_multi_turn_and_content_parts(tok):
    messages = [{"role": "user", "content": [{"type": "text", "text": "Hi "}, {"type": "text", "text": "there"}]},
                {"role": "assistant", "content": "Hello!"},
                {"role": "user", "content": "Bye"}]
    text = tok.apply_chat_template(messages)
    assert text == ("<|im_start|>user\nHi there<|im_end|>\n<|im_start|>assistant\nHello!<|im_end|>\n"
                    "<|im_start|>user\nBye<|im_end|>\n<|im_start|>assistant\n")
    ids = tok.encode(text)
    assert ids.count(510) == 4 and ids.count(511) == 3


def test_chat_template_matches_transformers(tok):
    transformers = pytest.importorskip("transformers")
    hf = transformers.AutoTokenizer.from_pretrained(TINY_DIR)
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    for gen in (True, False):
        assert tok.apply_chat_template(messages, add_generation_prompt=gen) == hf.apply_chat_template(
            messages, tokenize=False, add_generation_prompt=gen)


def test_chat_template_from_a_jinja_file_wins(tmp_path):
    snap = copy_tiny(tmp_path)
    (snap / "chat_template.jinja").write_text("{% for m in messages %}[{{ m['role'] }}] {{ m['content'] }}\n"
                                              "{% endfor %}{% if add_generation_prompt %}[assistant] {% endif %}")
    tok = load_tokenizer(snap)
    assert tok.apply_chat_template([{"role": "user", "content": "hi"}]) == "[user] hi\n[assistant] "


def test_chat_template_raise_exception_is_reported(tmp_path):
    snap = copy_tiny(tmp_path)
    (snap / "chat_template.jinja").write_text("{{ raise_exception('System message must come first') }}")
    with pytest.raises(TokenizerError, match="the chat template refused the messages: System message must "
                                             "come first") as e:
        load_tokenizer(snap).apply_chat_template([{"role": "user", "content": "hi"}])
    assert str(snap) in str(e.value)
    assert isinstance(e.value, QwenLabError) and isinstance(e.value, ValueError)


def test_chat_template_that_fails_on_the_messages_is_reported(tmp_path):
    snap = copy_tiny(tmp_path)
    (snap / "chat_template.jinja").write_text("{{ messages[0]['content'].missing.field }}")
    with pytest.raises(TokenizerError, match="could not be rendered with these messages") as e:
        load_tokenizer(snap).apply_chat_template([{"role": "user", "content": "hi"}])
    assert str(snap) in str(e.value) and isinstance(e.value, QwenLabError)


def test_chat_template_with_a_jinja_syntax_error_names_the_snapshot(tmp_path):
    snap = copy_tiny(tmp_path)
    (snap / "chat_template.jinja").write_text("{% for m in messages %}{{ m['content'] }}")  # no endfor
    with pytest.raises(CheckpointError, match="the chat template is not valid Jinja") as e:
        load_tokenizer(snap).apply_chat_template([{"role": "user", "content": "hi"}])
    assert str(snap) in str(e.value)


def test_chat_template_rejects_malformed_messages(tok):
    for bad in ([{"text": "no role"}], "hi", None):
        with pytest.raises(TokenizerError, match="messages: expected a list of") as e:
            tok.apply_chat_template(bad)
        assert isinstance(e.value, QwenLabError) and isinstance(e.value, ValueError)


@pytest.mark.parametrize("messages, match", [
    ([{"role": "user", "content": 5}], r"messages\[0\]\['content'\]: expected a str, a list of content parts .*"
                                       r"or None, got int 5"),
    ([{"role": "user", "content": "hi"}, {"role": None, "content": "x"}],
     r"messages\[1\]\['role'\]: expected a str such as 'user'.*got None"),
    ([{"role": "user", "content": {"type": "text", "text": "hi"}}], r"messages\[0\]\['content'\]: .*got dict"),
    ([{"role": "user", "content": ["hi"]}], r"messages\[0\]\['content'\]\[0\]: expected a content part, a dict"),
])
def test_chat_template_rejects_messages_of_the_wrong_types(tok, messages, match):
    with pytest.raises(TokenizerTypeError, match=match) as e:
        tok.apply_chat_template(messages)
    assert isinstance(e.value, QwenLabError) and isinstance(e.value, TypeError) and isinstance(e.value, ValueError)


def test_chat_template_accepts_what_qwens_templates_read(tmp_path):
    # as Qwen's own templates do: content None for an assistant turn holding only tool calls, other keys passed on
    snap = copy_tiny(tmp_path)
    (snap / "chat_template.jinja").write_text(
        "{% for m in messages %}{% set c = m.content if m.content is string else '' %}"
        "<|im_start|>{{ m.role }}\n{{ c }}{% for t in m.tool_calls or [] %}<tool_call>{{ t.function.name }}"
        "</tool_call>{% endfor %}<|im_end|>\n{% endfor %}")
    messages = [{"role": "user", "content": "Weather?"},
                {"role": "assistant", "content": None, "tool_calls": [{"function": {"name": "weather"}}]},
                {"role": "tool", "content": "sunny"}]
    assert load_tokenizer(snap).apply_chat_template(messages) == (
        "<|im_start|>user\nWeather?<|im_end|>\n<|im_start|>assistant\n<tool_call>weather</tool_call><|im_end|>\n"
        "<|im_start|>tool\nsunny<|im_end|>\n")


def test_chat_template_failing_with_a_python_error_names_the_message(tmp_path):
    # a template that adds the content to a str, as Qwen's do for user turns: None (allowed for tool calls) fails
    snap = copy_tiny(tmp_path)
    (snap / "chat_template.jinja").write_text(
        "{% for m in messages %}{{ '<|im_start|>' + m.role + '\\n' + m.content + '<|im_end|>\\n' }}{% endfor %}")
    messages = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": None},
                {"role": "user", "content": "again"}]
    with pytest.raises(TokenizerError, match=r"the chat template could not be rendered with these messages, first "
                                             r"failing once messages\[1\] is included \(TypeError: ") as e:
        load_tokenizer(snap).apply_chat_template(messages)
    assert str(snap) in str(e.value) and isinstance(e.value, QwenLabError)
    assert isinstance(e.value.__cause__, TypeError), "chained to the template's own error"


def test_chat_template_failing_without_any_message_names_none(tmp_path):
    snap = copy_tiny(tmp_path)
    (snap / "chat_template.jinja").write_text("{{ (tools | length) }}")  # tools is None
    with pytest.raises(TokenizerError, match=r"could not be rendered with these messages \(TypeError: ") as e:
        load_tokenizer(snap).apply_chat_template([{"role": "user", "content": "hi"}])
    assert "messages[" not in str(e.value) and isinstance(e.value.__cause__, TypeError)


def test_chat_template_rejects_a_lone_surrogate(tmp_path, tok):
    with pytest.raises(TokenizerError, match=r"messages\[1\]\['content'\]: character U\+DCFF at index 2 is not "
                                             r"valid Unicode"):
        tok.apply_chat_template([{"role": "system", "content": "Be brief."},
                                 {"role": "user", "content": "hi\udcff"}])
    with pytest.raises(TokenizerError, match=r"messages\[0\]\['content'\]\[1\]\['text'\]: character U\+DCFF"):
        tok.apply_chat_template([{"role": "user", "content": [{"type": "text", "text": "a"},
                                                              {"type": "text", "text": "\udcff"}]}])
    snap = copy_tiny(tmp_path)
    (snap / "chat_template.jinja").write_text("<|im_start|>system\n{{ system }}<|im_end|>\n")
    with pytest.raises(TokenizerError, match=r"the rendered chat template text: character U\+DCFF at index 19"):
        load_tokenizer(snap).apply_chat_template([{"role": "user", "content": "hi"}], system="\udcff")


def test_missing_chat_template(tmp_path):
    snap = copy_tiny(tmp_path)
    cfg = json.loads((snap / "tokenizer_config.json").read_text())
    del cfg["chat_template"]
    (snap / "tokenizer_config.json").write_text(json.dumps(cfg))
    with pytest.raises(CheckpointError, match="no chat template"):
        load_tokenizer(snap).apply_chat_template([{"role": "user", "content": "hi"}])


# ---------------------------------------------------------------- end-of-sequence ids


def test_eos_ids_are_im_end_and_endoftext(tok):
    assert tok.eos_token_ids == (tok.token_to_id("<|im_end|>"), tok.token_to_id("<|endoftext|>")) == (511, 509)
    config, _ = load_weights("tiny", device="cpu", progress=False)
    assert config.eos_token_ids == tok.eos_token_ids


def test_eos_ids_fall_back_to_config_json_then_the_eos_token(tmp_path):
    snap = copy_tiny(tmp_path)
    (snap / "generation_config.json").unlink()
    cfg = json.loads((snap / "config.json").read_text())
    cfg["eos_token_id"] = 509
    (snap / "config.json").write_text(json.dumps(cfg))
    assert load_tokenizer(snap).eos_token_ids == (509,)
    del cfg["eos_token_id"]
    (snap / "config.json").write_text(json.dumps(cfg))
    assert load_tokenizer(snap).eos_token_ids == (511,)  # tokenizer_config.json: eos_token "<|im_end|>"


def test_eos_ids_from_a_multimodal_config(tmp_path):
    snap = copy_tiny(tmp_path)
    (snap / "generation_config.json").unlink()
    (snap / "config.json").write_text(json.dumps({"model_type": "qwen3_5", "text_config": {"eos_token_id": [7, 8]}}))
    assert load_tokenizer(snap).eos_token_ids == (7, 8)


# ---------------------------------------------------------------- streaming decode


def test_stream_decoder_holds_back_split_characters(tok):
    emoji = "🙂"
    ids = tok.encode(emoji)
    assert len(ids) == 4  # four UTF-8 bytes, each its own token in the tiny vocabulary
    dec = tok.stream_decoder()
    assert [dec.push(i) for i in ids] == ["", "", "", emoji]


@pytest.mark.parametrize("text", TEXTS[:3] + ["é🙂x東京"])
def test_stream_decoder_concatenates_to_the_text(tok, text):
    dec = tok.stream_decoder()
    pieces = [dec.push(torch.tensor(i)) for i in tok.encode(text)]
    assert "".join(pieces) + dec.flush() == text
    assert "\ufffd" not in "".join(pieces)


def test_stream_decoder_flush_shows_an_unfinished_character(tok):
    dec = tok.stream_decoder()
    first_byte = tok.encode("é")[0]
    assert dec.push(first_byte) == ""
    assert dec.flush() == "\ufffd"
    assert dec.flush() == ""


def test_stream_decoder_with_special_and_unknown_ids(tok):
    dec = tok.stream_decoder()
    out = [dec.push(i) for i in [510] + tok.encode("hi") + [300_000, 511]]
    assert "".join(out) == "<|im_start|>hi<|id:300000|><|im_end|>"
    dec = tok.stream_decoder(skip_special_tokens=True)
    assert "".join(dec.push(i) for i in [510] + tok.encode("hi") + [511]) == "hi"


# ---------------------------------------------------------------- ids outside the vocabulary


def test_unknown_ids_decode_to_placeholders(tok):
    big = QWEN35_0_8B.vocab_size - 1
    ids = tok.encode("a b") + [big, 512] + tok.encode(" c")
    assert tok.decode(ids) == f"a b<|id:{big}|><|id:512|> c"
    assert tok.decode([-1]) == "<|id:-1|>"


# ---------------------------------------------------------------- sources and errors


def test_random_weight_preset_uses_the_tiny_tokenizer():
    tok = load_tokenizer("qwen3.5-0.8b")
    assert tok.vocab_size == 512 and tok.encode("Hello") == load_tokenizer("tiny").encode("Hello")


def test_snapshot_directory(tmp_path):
    tok = load_tokenizer(copy_tiny(tmp_path))
    assert isinstance(tok, Tokenizer) and tok.vocab_size == 512


def test_missing_tokenizer_json(tmp_path):
    snap = copy_tiny(tmp_path)
    (snap / "tokenizer.json").unlink()
    with pytest.raises(CheckpointError, match="no tokenizer.json") as e:
        load_tokenizer(snap)
    assert str(snap) in str(e.value)


def test_corrupt_tokenizer_json(tmp_path):
    snap = copy_tiny(tmp_path)
    (snap / "tokenizer.json").write_text("{\"model\": ")
    with pytest.raises(CheckpointError, match="could not read the tokenizer") as e:
        load_tokenizer(snap)
    assert str(snap / "tokenizer.json") in str(e.value)


def test_missing_directory(tmp_path):
    with pytest.raises(CheckpointError, match="no such directory"):
        load_tokenizer(tmp_path / "nowhere")


def test_hub_id_fetches_only_tokenizer_files(tmp_path, monkeypatch):
    hub = pytest.importorskip("huggingface_hub")
    snap = copy_tiny(tmp_path)
    calls = []

    def fake_download(repo_id, allow_patterns=None, **kw):
        calls.append(allow_patterns)
        return str(snap)

    monkeypatch.setattr(hub, "snapshot_download", fake_download)
    assert load_tokenizer("Org/Model").vocab_size == 512
    assert "tokenizer.json" in calls[0] and not any(p.endswith("safetensors") for p in calls[0])


def test_hub_unreachable(monkeypatch):
    hub = pytest.importorskip("huggingface_hub")

    def offline(*a, **kw):
        raise OSError("network is unreachable")

    monkeypatch.setattr(hub, "snapshot_download", offline)
    with pytest.raises(CheckpointError, match="could not fetch it from the Hugging Face hub"):
        load_tokenizer("Qwen/Qwen3.5-0.8B")


def test_placeholders_of_unknown_ids_encode_back_to_their_ids(tok):
    big = QWEN35_0_8B.vocab_size - 1
    ids = tok.encode("a b") + [big, 512, big] + tok.encode(" c") + [510, 3000]
    text = tok.decode(ids)
    assert tok.encode(text) == ids
    assert tok.encode(f"<|id:{big}|>") == [big]
    # a marker naming an id the tokenizer knows, or a negative one, is ordinary text, encoded as the library does
    for text in ("<|id:5|>", "<|id:-1|>", "x<|id:5|>y"):
        assert tok.encode(text) == tok._tok.encode(text, add_special_tokens=False).ids
        assert len(tok.encode(text)) > 1 and tok.decode(tok.encode(text)) == text
