"""One safetensors file: its header read and checked, its tensors written, through the `safetensors` library.

A safetensors file is an 8-byte little-endian header length, a JSON header mapping each tensor's name to its dtype,
shape and byte range (`data_offsets`, within the data section) plus an optional `__metadata__` object of strings,
then the data section. The library enforces the format's rules when it opens a file; its errors say which rule
broke but name neither the file nor, mostly, the tensor ("invalid offset for tensor", "incomplete metadata, file
not fully covered"). So where it refuses a file, the header is examined here to say which tensor breaks which rule
(a truncated download, a corrupt header), in one `CheckpointError` that names the file.
"""

from __future__ import annotations

import json
import math
import struct
from dataclasses import dataclass
from pathlib import Path

from safetensors import SafetensorError, safe_open
from safetensors.torch import save_file
from torch import Tensor

from .errors import CheckpointError

# safetensors dtype code -> bytes per element (the codes torch holds; a file with another code is refused here only
# where the library refuses it too)
ST_DTYPE_BYTES = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U8": 1, "BOOL": 1,
                  "F8_E4M3": 1, "F8_E5M2": 1}
FLOAT_CODES = ("F64", "F32", "F16", "BF16")
_MAX_HEADER = 100 * 2**20  # the library's own limit on the header


@dataclass(frozen=True)
class TensorInfo:
    """One tensor as a safetensors header describes it."""
    file: Path
    name: str
    dtype: str                  # safetensors code: "BF16", "F32", ...
    shape: tuple[int, ...]
    offsets: tuple[int, int]    # [begin, end) within the data section


def read_safetensors_header(path) -> dict[str, TensorInfo]:
    """The tensors of a safetensors file, as its header describes them (in the header's order); reads no data.

    The safetensors library opens the file first: that checks the header is JSON of entries with a dtype the library
    knows, shapes and offsets of non-negative integers, `__metadata__` an object of strings, each byte range as long
    as its dtype and shape need, and the byte ranges tiling the data section to the end of the file (none truncated,
    overlapping or with gaps). Raises CheckpointError naming the file for one that cannot be read or is too short
    for a header, and, where the library refuses the file, naming the tensor that breaks a rule and the rule.
    """
    path = Path(path)
    size, n, raw = _raw_header(path)
    try:
        with safe_open(str(path), framework="pt"):
            pass
    except SafetensorError as e:
        refused = str(e)
    except OSError as e:  # permissions, an I/O error: name the file rather than fail with a bare traceback
        raise CheckpointError(f"{path}: could not read the file ({e.strerror or e})") from None
    else:
        header = json.loads(raw.decode("utf-8"))  # the library accepted it: every entry is well formed
        return {name: TensorInfo(path, name, info["dtype"], tuple(info["shape"]), tuple(info["data_offsets"]))
                for name, info in header.items() if name != "__metadata__"}
    _explain_refusal(path, size, n, raw)
    raise CheckpointError(f"{path}: the safetensors library refuses the file ({refused}); expected a safetensors "
                          "file, so it is damaged: download it again")


def _raw_header(path: Path) -> tuple[int, int, bytes]:
    """(file size, header length, header bytes), checked against the file size before the library sees the file."""
    try:
        size = path.stat().st_size
        with open(path, "rb") as f:
            head = f.read(8)
            if len(head) < 8:
                raise CheckpointError(f"{path}: only {size} bytes, too short for a safetensors file (it starts with "
                                      "an 8-byte header length); the file is truncated or empty, download it again")
            (n,) = struct.unpack("<Q", head)
            if n > min(size - 8, _MAX_HEADER):
                raise CheckpointError(f"{path}: the header length field says {n} bytes, more than a header can take "
                                      f"here ({min(size - 8, _MAX_HEADER)} bytes: the rest of the file, at most 100 "
                                      "MiB); the file is truncated or is not a safetensors file")
            return size, n, f.read(n)
    except OSError as e:  # permissions, an I/O error: name the file rather than fail with a bare traceback
        raise CheckpointError(f"{path}: could not read the file ({e.strerror or e})") from None


def _explain_refusal(path: Path, size: int, n: int, raw: bytes) -> None:
    """Raise a CheckpointError for the first rule of the format that the header breaks (the library refused the
    file); return if none is found here."""
    try:
        header = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise CheckpointError(f"{path}: corrupt safetensors header, expected {n} bytes of JSON ({e}); "
                              "the file is damaged, download it again") from None
    if not isinstance(header, dict):
        raise CheckpointError(f"{path}: corrupt safetensors header, expected a JSON object mapping tensor names "
                              f"to dtype/shape/data_offsets, got {type(header).__name__}")
    meta = header.get("__metadata__")
    if meta is not None and not (isinstance(meta, dict) and all(isinstance(v, str) for v in meta.values())):
        raise CheckpointError(f"{path}: corrupt safetensors header, '__metadata__' is {meta!r}; expected an object "
                              "of string values (the safetensors library refuses to open this file)")
    data_size = size - 8 - n
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        where = f"{path}: tensor '{name}'"
        try:
            code, shape, offsets = info["dtype"], info["shape"], info["data_offsets"]
            # JSON integers only, as the safetensors library reads them: 48.9 or true is a corrupt header
            if not (isinstance(shape, list) and isinstance(offsets, list) and len(offsets) == 2
                    and all(_is_uint(s) for s in shape + offsets)):
                raise TypeError
        except (TypeError, KeyError):
            raise CheckpointError(f"{where}: corrupt header entry {info!r}; expected {{'dtype': ..., 'shape': "
                                  "[non-negative integers], 'data_offsets': [begin, end]}") from None
        shape, (begin, end) = tuple(shape), offsets
        if code not in ST_DTYPE_BYTES:
            raise CheckpointError(f"{where}: unknown dtype {code!r}; expected one of {sorted(ST_DTYPE_BYTES)}")
        if begin > end:
            raise CheckpointError(f"{where}: corrupt header entry (shape {list(shape)}, data_offsets "
                                  f"[{begin}, {end}])")
        need = math.prod(shape) * ST_DTYPE_BYTES[code]
        if end - begin != need:
            raise CheckpointError(f"{where}: data_offsets [{begin}, {end}] span {end - begin} bytes, but dtype "
                                  f"{code} x shape {list(shape)} needs {need}; the header is corrupt")
        out[name] = TensorInfo(path, name, code, shape, (begin, end))
    cut = sorted((info for info in out.values() if info.offsets[1] > data_size), key=lambda info: info.offsets)
    if cut:
        first = cut[0]
        raise CheckpointError(
            f"{path}: tensor '{first.name}' ends at byte {8 + n + first.offsets[1]} but the file has only {size} bytes"
            f"{f' ({len(cut) - 1} more tensors lie past the end)' if len(cut) > 1 else ''}; the file is truncated "
            "(an interrupted download?), download it again")
    # The byte ranges, in offset order (not the header's order, which is free), must tile the data section:
    # the first starts at 0, each starts where the one before ends, the last ends at the end of the file.
    # Tensors with no elements take no bytes and may share an offset. An overlap is reported before a gap: two
    # tensors given the same bytes leave a gap where one of them should be, and the overlap names the culprit.
    pos, before, wrong = 0, None, {}
    for info in sorted(out.values(), key=lambda info: info.offsets):
        begin, end = info.offsets
        if begin != pos:
            after = f"the previous tensor '{before.name}' ends at {pos}" if before else "the data starts at 0"
            problem = f"a gap of {begin - pos} bytes" if begin > pos else f"{pos - begin} bytes overlap"
            wrong.setdefault(begin < pos, f"{path}: tensor '{info.name}' has data_offsets [{begin}, {end}] but "
                             f"{after} ({problem}); expected each tensor's bytes to follow the previous one's, so "
                             "the header is corrupt")
        if end >= pos:
            pos, before = end, info
    if wrong:
        raise CheckpointError(wrong.get(True, wrong.get(False)))
    if pos != data_size:
        raise CheckpointError(f"{path}: {data_size - pos} bytes follow the last tensor's data (the header covers "
                              f"{pos} of the {data_size} data bytes); expected the file to end where its last "
                              "tensor ends, so it is damaged or not a safetensors file")


def _is_uint(value) -> bool:
    """A non-negative JSON integer (a bool is not one, though Python's bool subclasses int)."""
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def write_safetensors(path, tensors: dict[str, Tensor], metadata: dict[str, str] | None = None) -> None:
    """Write tensors as a safetensors file with `safetensors.torch.save_file`: byte for byte the same for the same
    input (the library lays the tensors out by dtype, largest first, then by name, so each stays aligned).

    Takes any tensors: each is moved to the host and made contiguous, and one sharing memory with another (the
    blocks of a fused matrix, a tied head) is copied, as the library refuses shared memory.
    """
    own, seen = {}, set()
    for name, t in tensors.items():
        t = t.detach().to("cpu").contiguous()
        storage = t.untyped_storage().data_ptr()
        if t.numel() and storage in seen:
            t = t.clone()
        seen.add(t.untyped_storage().data_ptr())
        own[name] = t
    try:
        save_file(own, str(path), metadata=dict(metadata or {"format": "pt"}))
    except (SafetensorError, ValueError, RuntimeError, TypeError) as e:  # a dtype it cannot store, an I/O error
        raise CheckpointError(f"{path}: could not write the safetensors file ({e})") from None
