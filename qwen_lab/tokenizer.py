"""The tokenizer: `tokenizer.json` through the `tokenizers` library, plus the snapshot's chat template.

    tok = qwen_lab.load_tokenizer("tiny-english")  # or a snapshot directory, a preset, a hub id
    ids = tok.encode("Hello, Triton!")             # list[int]
    text = tok.decode(ids)
    prompt = tok.apply_chat_template([{"role": "user", "content": "Hi"}])   # ChatML text, ready to encode
    decoder = tok.stream_decoder()                 # during generation: decoder.push(id) -> newly printable text

Qwen's tokenizer is a byte-level BPE: text is split by a regex into words, each word's UTF-8 bytes are
mapped to printable characters, and learned merges join them into tokens. A token can therefore hold
part of a multi-byte character; `stream_decoder` waits until the character is complete before printing.

The tiny model's tokenizer is read here like any other; `qwen_lab.tiny` builds it (a byte-level BPE trained
on a short embedded English text).
"""

from __future__ import annotations

import json
import numbers
import re
from collections.abc import Mapping
from pathlib import Path

from .config import Qwen35Config, eos_token_ids
from .errors import CheckpointError, TokenizerError, TokenizerTypeError
from .snapshot import TINY_DIR, resolve_source

TOKENIZER_PATTERNS = ["tokenizer.json", "tokenizer_config.json", "generation_config.json", "config.json",
                      "chat_template.jinja", "special_tokens_map.json"]
"""What `snapshot_download` fetches when only the tokenizer of a hub id is wanted."""

# what `decode` writes for an id the tokenizer does not know, and `encode` reads back
_PLACEHOLDER = re.compile(r"<\|id:(\d+)\|>")


# ------------------------------------------------------------------ the tokenizer


class Tokenizer:
    """A snapshot's tokenizer: encode, decode, the chat template, the end-of-sequence ids."""

    def __init__(self, tokenizer, *, chat_template: str | None = None, eos_token_ids=(), source: str = "",
                 bos_token: str | None = None, eos_token: str | None = None):
        self._tok = tokenizer
        self.chat_template = chat_template
        self.eos_token_ids: tuple[int, ...] = tuple(int(i) for i in eos_token_ids)
        self.source = source
        self.bos_token = bos_token
        self.eos_token = eos_token
        self._valid: list[bool] | None = None

    @classmethod
    def from_dir(cls, directory) -> "Tokenizer":
        """Read tokenizer.json, tokenizer_config.json (chat template), generation_config.json / config.json (eos)."""
        from tokenizers import Tokenizer as _Tok

        directory = Path(directory)
        path = directory / "tokenizer.json"
        if not path.is_file():
            raise CheckpointError(f"{directory}: no tokenizer.json; expected the snapshot's tokenizer files "
                                  "(tokenizer.json, tokenizer_config.json) beside config.json")
        try:
            tok = _Tok.from_file(str(path))
        except Exception as e:  # tokenizers raises a bare Exception for a bad file
            raise CheckpointError(f"{path}: could not read the tokenizer ({e})") from None
        tcfg = _read_json(directory / "tokenizer_config.json") or {}
        template = None
        if (directory / "chat_template.jinja").is_file():
            template = (directory / "chat_template.jinja").read_text()
        elif isinstance(tcfg.get("chat_template"), str):
            template = tcfg["chat_template"]
        elif isinstance(tcfg.get("chat_template"), list):  # [{"name": "default", "template": ...}, ...]
            named = {t.get("name"): t.get("template") for t in tcfg["chat_template"] if isinstance(t, dict)}
            template = named.get("default") or next(iter(named.values()), None)
        bos, eos = _token_text(tcfg.get("bos_token")), _token_text(tcfg.get("eos_token"))
        eos_ids = _eos_ids(_read_json(directory / "generation_config.json"))
        if not eos_ids:
            cfg = _read_json(directory / "config.json") or {}
            eos_ids = _eos_ids(cfg.get("text_config") if isinstance(cfg.get("text_config"), dict) else cfg)
            if not eos_ids:
                eos_ids = _eos_ids(cfg)
        if not eos_ids and eos is not None and tok.token_to_id(eos) is not None:
            eos_ids = (tok.token_to_id(eos),)
        return cls(tok, chat_template=template, eos_token_ids=eos_ids, source=str(directory), bos_token=bos,
                   eos_token=eos)

    # ---- vocabulary
    @property
    def vocab_size(self) -> int:
        """Number of token ids the tokenizer knows, special tokens included."""
        return self._tok.get_vocab_size(with_added_tokens=True)

    @property
    def special_tokens(self) -> dict[str, int]:
        """The special tokens (like <|im_start|>) and their ids."""
        return {t.content: i for i, t in sorted(self._tok.get_added_tokens_decoder().items()) if t.special}

    def token_to_id(self, token: str) -> int | None:
        """The id of `token` (a token's own text, like 'Ġthe' or '<|im_end|>'), None if the tokenizer has no such
        token."""
        if not isinstance(token, str):
            raise TokenizerTypeError(f"token: expected a str, got {type(token).__name__}")
        _check_unicode(token, "token")
        return self._tok.token_to_id(token)

    def id_to_token(self, token_id: int) -> str | None:
        """The token of `token_id` (an int), None for an id the tokenizer does not know."""
        token_id = _one_id(token_id, "token_id")
        return self._tok.id_to_token(token_id) if self._known(token_id) else None

    # ---- text <-> ids
    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        """Token ids of `text`. Special tokens written in the text (like <|im_start|>) become their single id.

        A `<|id:N|>` that `decode` wrote for an id N the tokenizer does not know becomes N again, so a reply of a
        random-weight model goes back into the next turn's prompt as the same ids, not as the characters of its
        placeholders (a marker naming an id the tokenizer knows stays text: `decode` never writes one). Text with
        such markers is encoded piece by piece without `add_special_tokens` (Qwen's tokenizers add none anyway)."""
        if not isinstance(text, str):
            raise TokenizerTypeError(f"text: expected a str, got {type(text).__name__}")
        _check_unicode(text, "text")
        unknown = [m for m in _PLACEHOLDER.finditer(text) if not self._known(int(m.group(1)))]
        if not unknown:
            return self._tok.encode(text, add_special_tokens=add_special_tokens).ids
        ids, start = [], 0
        for m in unknown:
            ids += self._tok.encode(text[start:m.start()], add_special_tokens=False).ids  # ('' encodes to [])
            ids.append(int(m.group(1)))
            start = m.end()
        return ids + self._tok.encode(text[start:], add_special_tokens=False).ids

    def decode(self, ids, skip_special_tokens: bool = False) -> str:
        """Text of `ids`: an int, a list or tuple of ints (NumPy integers and 0-d integer tensors count as ints), or an
        integer tensor or NumPy array of 0 or 1 dimensions. Floats (even 1.0), bools, strings, nested lists and
        2-d tensors raise `TokenizerTypeError` naming `ids`.

        An id the tokenizer does not know decodes to a visible `<|id:N|>` instead of failing (a random-weight model
        has a bigger vocabulary than the tiny tokenizer)."""
        ids = _id_list(ids)
        pieces, run = [], []
        for i in ids:
            if self._known(i):
                run.append(i)
                continue
            if run:
                pieces.append(self._tok.decode(run, skip_special_tokens=skip_special_tokens))
                run = []
            pieces.append(f"<|id:{i}|>")
        if run:
            pieces.append(self._tok.decode(run, skip_special_tokens=skip_special_tokens))
        return "".join(pieces)

    def _known(self, token_id: int) -> bool:
        valid = self._valid_ids()
        return 0 <= token_id < len(valid) and valid[token_id]

    def _valid_ids(self) -> list[bool]:
        if self._valid is None:
            n = max(self.vocab_size, max(self._tok.get_added_tokens_decoder(), default=-1) + 1)
            self._valid = [self._tok.id_to_token(i) is not None for i in range(n)]
        return self._valid

    def stream_decoder(self, skip_special_tokens: bool = False) -> "StreamDecoder":
        """A decoder for generation: `push(id)` returns the text that became printable with that token."""
        return StreamDecoder(self, skip_special_tokens)

    # ---- chat
    def apply_chat_template(self, messages, add_generation_prompt: bool = True, **kwargs) -> str:
        """Render `messages` ([{"role": ..., "content": ...}, ...]) with the snapshot's Jinja chat template.

        Each message is a dict with a str `role` and a `content` that is a str, a list of content parts (dicts such
        as {"type": "text", "text": ...}) or None (an assistant turn holding only `tool_calls`), as Qwen's templates
        read them; other keys (tool_calls, reasoning_content, ...) reach the template unchecked. A message that is
        not one raises `TokenizerTypeError`, and any failure of the template while rendering a `TokenizerError`,
        both naming the message's index.

        Returns text (special tokens written out); encode it with `encode`. Extra keyword arguments reach the
        template (e.g. `enable_thinking=False` for templates that read it).
        """
        if self.chat_template is None:
            raise CheckpointError(f"{self.source}: the tokenizer has no chat template (no 'chat_template' in "
                                  "tokenizer_config.json and no chat_template.jinja)")
        if not isinstance(messages, (list, tuple)) or not all(
                isinstance(m, Mapping) and "role" in m and "content" in m for m in messages):
            raise TokenizerError("messages: expected a list of {'role': ..., 'content': ...} dicts, got "
                                 f"{messages!r:.200}")
        for i, m in enumerate(messages):
            _check_message(m, f"messages[{i}]")
        ctx = dict(bos_token=self.bos_token or "", eos_token=self.eos_token or "", tools=None, documents=None)
        ctx.update(kwargs)
        text = _render(self.chat_template, self.source, messages=list(messages),
                       add_generation_prompt=add_generation_prompt, **ctx)
        _check_unicode(text, "the rendered chat template text")  # a keyword argument may have brought one
        return text

    def __repr__(self) -> str:
        return (f"Tokenizer({self.source}: {self.vocab_size} tokens, eos {list(self.eos_token_ids)}, "
                f"chat template {'yes' if self.chat_template else 'no'})")


class StreamDecoder:
    """Turns generated token ids into text as they arrive.

    A byte-level token can end in the middle of a multi-byte UTF-8 character; decoding it alone would print
    U+FFFD. `push` therefore decodes the recent tokens together and returns only the text that is complete,
    holding back a trailing partial character until the tokens that finish it arrive.
    """

    MAX_PENDING = 8  # tokens held back at most: past that, the bytes are invalid UTF-8 and are shown as U+FFFD

    def __init__(self, tokenizer: Tokenizer, skip_special_tokens: bool = False):
        self.tokenizer = tokenizer
        self.skip_special_tokens = skip_special_tokens
        self.ids: list[int] = []
        self._prefix = 0   # start of the context decoded together with the new tokens
        self._read = 0     # everything before this has been returned

    def push(self, token_id) -> str:
        """Add one token id; return the newly printable text ('' while a character is incomplete)."""
        self.ids.append(_one_id(token_id, "token_id"))
        return self._emit(final=False)

    def flush(self) -> str:
        """Whatever is still held back (an incomplete character shows as U+FFFD)."""
        return self._emit(final=True)

    def _emit(self, final: bool) -> str:
        if self._read == len(self.ids):
            return ""
        dec = lambda ids: self.tokenizer.decode(ids, skip_special_tokens=self.skip_special_tokens)  # noqa: E731
        before = dec(self.ids[self._prefix:self._read])
        now = dec(self.ids[self._prefix:])
        if not final and now.endswith("\ufffd") and len(self.ids) - self._read < self.MAX_PENDING:
            return ""
        self._prefix, self._read = self._read, len(self.ids)
        return now[len(before):] if now.startswith(before) else now


def load_tokenizer(source="tiny-english") -> Tokenizer:
    """The tokenizer of a snapshot directory, "tiny-english", "tiny", a random-weight preset (-> the tiny tokenizer)
    or a hub id."""
    where = resolve_source(source, allow_patterns=TOKENIZER_PATTERNS)
    if isinstance(where, Qwen35Config):
        where = TINY_DIR
    return Tokenizer.from_dir(where)


# ------------------------------------------------------------------ helpers


def _read_json(path: Path):
    if not path.is_file():
        return None
    try:
        return json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise CheckpointError(f"{path}: not valid JSON ({e})") from None


def _token_text(tok) -> str | None:
    if isinstance(tok, dict):
        return tok.get("content")
    return tok if isinstance(tok, str) else None


def _eos_ids(cfg) -> tuple[int, ...]:
    return eos_token_ids(cfg.get("eos_token_id")) if isinstance(cfg, dict) else ()


_IDS_EXPECTED = ("token ids: an int, a list or tuple of ints, or an integer tensor or NumPy array of 0 or 1 "
                 "dimensions")


def _is_array(x) -> bool:
    """A torch tensor, a NumPy array or a NumPy scalar."""
    return hasattr(x, "tolist") and hasattr(x, "dtype") and hasattr(x, "ndim")


def _is_integer_dtype(dtype) -> bool:
    kind = getattr(dtype, "kind", None)  # NumPy: 'i' signed, 'u' unsigned ('b' bool, 'f' float, ...)
    if kind is not None:
        return kind in "iu"
    if getattr(dtype, "is_floating_point", True) or getattr(dtype, "is_complex", True):  # torch
        return False
    return str(dtype) != "torch.bool"


def _describe(x) -> str:
    if _is_array(x):
        return f"a {type(x).__module__.split('.')[0]}.{type(x).__name__} of dtype {x.dtype} and shape {tuple(x.shape)}"
    return "None" if x is None else f"{type(x).__name__} {x!r:.80}"


def _bad_ids(name: str, what, where: str = "", hint: str = "") -> TokenizerTypeError:
    at = f" at {where}" if where else ""
    hint = f"; {hint}" if hint else ""
    return TokenizerTypeError(f"{name}: expected {_IDS_EXPECTED}, got {_describe(what)}{at}{hint}")


def _hint_for(x) -> str:
    if isinstance(x, bool) or _is_array(x) and str(x.dtype).endswith("bool"):
        return "a bool is not a token id"
    if isinstance(x, (float, complex)) or _is_array(x) and not _is_integer_dtype(x.dtype):
        return ("token ids are integers, so a float is refused, even a whole one like 1.0, rather than rounded: "
                "convert deliberately (int(x), tensor.long())")
    if isinstance(x, (str, bytes)):
        return "to turn text into ids, use encode(text)"
    if _is_array(x) or isinstance(x, (list, tuple)):
        return "decode one sequence at a time (ids[0] of a [1, T] batch)"
    return ""


def _one_id(x, name: str, where: str = "") -> int:
    """`x` as a Python int: an int, a NumPy integer, or an integer tensor or array holding one value (0-d, or [1]:
    what a generation loop collects per token); bools refused."""
    if _is_array(x):
        if _is_integer_dtype(x.dtype) and (x.ndim == 0 or (x.ndim == 1 and x.shape[0] == 1)):
            value = x.tolist()
            return int(value[0] if isinstance(value, list) else value)
    elif isinstance(x, numbers.Integral) and not isinstance(x, bool):
        return int(x)
    raise _bad_ids(name, x, where, _hint_for(x))


def _id_list(ids, name: str = "ids") -> list[int]:
    """`ids` (see `Tokenizer.decode`) as a list of Python ints; anything else raises TokenizerTypeError naming
    `name`."""
    if _is_array(ids):
        if ids.ndim > 1 or not _is_integer_dtype(ids.dtype):
            raise _bad_ids(name, ids, hint=_hint_for(ids))
        out = ids.tolist()
        return [out] if ids.ndim == 0 else out
    if isinstance(ids, (list, tuple, range)):
        return [_one_id(x, name, f"{name}[{j}]") for j, x in enumerate(ids)]
    return [_one_id(ids, name)]


def _check_unicode(text: str, name: str) -> None:
    """Refuse a lone surrogate (U+D800 to U+DFFF): no Unicode character, so UTF-8 cannot encode it and the
    `tokenizers` library fails on it with a bare TypeError. Python makes one of each byte that is not UTF-8 when it
    decodes with errors='surrogateescape', as it does for the command line (`--prompt $'abc\\xff'`)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        code = ord(text[e.start])
        why = (f"an undecodable byte 0x{code - 0xDC00:02X} of the input?" if 0xDC80 <= code <= 0xDCFF
               else "half of a UTF-16 surrogate pair?")
        raise TokenizerError(f"{name}: character U+{code:04X} at index {e.start} is not valid Unicode ({why}); "
                             "expected text that encodes to UTF-8 (read the input's bytes with "
                             "errors='replace', or fix its encoding)") from None


def _check_message(m, name: str) -> None:
    """A chat message as Qwen's templates read it (see `Tokenizer.apply_chat_template`), its text valid Unicode."""
    role, content = m["role"], m["content"]
    if not isinstance(role, str):
        raise TokenizerTypeError(f"{name}['role']: expected a str such as 'user', 'assistant' or 'system', got "
                                 f"{_describe(role)}")
    _check_unicode(role, f"{name}['role']")
    if isinstance(content, str):
        _check_unicode(content, f"{name}['content']")
    elif isinstance(content, (list, tuple)):
        for j, part in enumerate(content):
            if not isinstance(part, Mapping):
                raise TokenizerTypeError(f"{name}['content'][{j}]: expected a content part, a dict such as "
                                         f"{{'type': 'text', 'text': ...}}, got {_describe(part)}")
            if isinstance(part.get("text"), str):
                _check_unicode(part["text"], f"{name}['content'][{j}]['text']")
    elif content is not None:
        raise TokenizerTypeError(f"{name}['content']: expected a str, a list of content parts such as "
                                 f"{{'type': 'text', 'text': ...}}, or None, got {_describe(content)}")


def _first_failing_message(compiled, ctx: dict, error: Exception) -> int | None:
    """The index of the message with which a render first fails as it did with all of them (the same exception and
    text), rendering the messages before it and it; None where the messages cannot tell (the template fails so without
    any message, or no prefix fails so)."""
    messages = ctx.get("messages")
    if not isinstance(messages, list):
        return None

    def same(k: int) -> bool:
        try:
            compiled.render(**{**ctx, "messages": messages[:k]})
        except Exception as e:  # any failure is compared; none escapes
            return type(e) is type(error) and str(e) == str(error)
        return False

    if same(0):
        return None
    return next((k - 1 for k in range(1, len(messages) + 1) if same(k)), None)


def _render(template: str, source: str, /, **ctx) -> str:
    """Render a chat template the way transformers does: sandboxed Jinja, trim_blocks and lstrip_blocks.

    `source` (the snapshot directory) names the template in errors; positional-only, so that the template's
    own variables may use any name."""
    from datetime import datetime

    from jinja2 import TemplateSyntaxError
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    where = f"{source}: the chat template" if source else "the chat template"

    def raise_exception(message):
        raise TokenizerError(f"{where} refused the messages: {message}")

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=["jinja2.ext.loopcontrols"])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    try:
        compiled = env.from_string(template)
    except TemplateSyntaxError as e:
        raise CheckpointError(f"{where} is not valid Jinja (line {e.lineno}: {e.message}); expected a Jinja "
                              "chat template in chat_template.jinja or tokenizer_config.json's 'chat_template'") \
            from None
    try:
        return compiled.render(**ctx)
    except TokenizerError:  # raise_exception: the template refused the messages, in its own words
        raise
    except Exception as e:  # a TemplateError, or the TypeError, KeyError, ... of a value the template cannot use
        k = _first_failing_message(compiled, ctx, e)
        at = f", first failing once messages[{k}] is included" if k is not None else ""
        raise TokenizerError(f"{where} could not be rendered with these messages{at} ({type(e).__name__}: {e}); "
                             "expected messages with the fields the template reads") from e
