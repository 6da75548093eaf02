"""The English corpus of the `tiny-english` model: Jane Austen's six novels, from a Debian package.

Where the text comes from (public domain, packaged under the MIT licence):

    apt-get download r-cran-janeaustenr        # Debian's janeaustenr 1.0.0 (Julia Silge), licence MIT
    dpkg-deb -x r-cran-janeaustenr_*.deb DIR

The novels (Sense and Sensibility, Pride and Prejudice, Mansfield Park, Emma, Northanger Abbey, Persuasion) were
published 1811-1818 and are in the public domain; the package holds Project Gutenberg's text of each, one R
character vector of lines per novel, in R's lazy-load database `usr/lib/R/site-library/janeaustenr/data/Rdata.rdb`
(its index: `Rdata.rdx`). This module reads that database without R: the index is a gzip-compressed serialized R
list of (offset, length) per object, and each object in the .rdb is a 4-byte big-endian length followed by a zlib
stream holding one serialized R object (R's XDR serialization, versions 2 and 3). Only the few R types those files
use are read.

    python scripts/austen_corpus.py OUT.txt     # download, extract and clean the text: about 4 MB of prose

`paragraphs()` gives the cleaned prose: Gutenberg's line wrapping undone, chapter headings, title pages and the
italics underscores dropped, one paragraph per string, novel by novel.
"""

from __future__ import annotations

import glob
import gzip
import re
import struct
import subprocess
import sys
import tempfile
import zlib
from pathlib import Path

PACKAGE = "r-cran-janeaustenr"
DATA_DIR = "usr/lib/R/site-library/janeaustenr/data"
NOVELS = ("sensesensibility", "prideprejudice", "mansfieldpark", "emma", "northangerabbey", "persuasion")


# ------------------------------------------------------------------ fetching the package


def fetch_package(workdir: Path) -> Path:
    """Download the package with apt-get (unless a .deb is already in `workdir`), extract it; the data folder."""
    workdir.mkdir(parents=True, exist_ok=True)
    debs = sorted(glob.glob(str(workdir / f"{PACKAGE}_*.deb")))
    if not debs:
        subprocess.run(["apt-get", "download", PACKAGE], cwd=workdir, check=True)
        debs = sorted(glob.glob(str(workdir / f"{PACKAGE}_*.deb")))
    if not debs:
        raise FileNotFoundError(f"{workdir}: apt-get download {PACKAGE} left no .deb; run `apt-get update` first")
    root = workdir / "extracted"
    subprocess.run(["dpkg-deb", "-x", debs[-1], str(root)], check=True)
    return root / DATA_DIR


# ------------------------------------------------------------------ reading R's serialization format


class _RReader:
    """A reader of R's XDR serialization for the types a lazy-load database of character vectors holds."""

    NIL, SYM, LIST, CHAR, LGL, INT, REAL, STR, VEC, REF, NILVALUE = 0, 1, 2, 9, 10, 13, 14, 16, 19, 255, 254

    def __init__(self, data: bytes):
        if data[:2] != b"X\n":
            raise ValueError(f"not R's XDR serialization (starts {data[:2]!r}, expected b'X\\n')")
        self.data, self.pos, self.refs = data, 2, []
        version = self._int()
        self._int(), self._int()  # the R versions that wrote it and that can read it
        if version == 3:
            n = self._int()  # the native encoding's name, skipped
            self.pos += n
        elif version != 2:
            raise ValueError(f"R serialization version {version}; expected 2 or 3")

    def _int(self) -> int:
        (v,) = struct.unpack_from(">i", self.data, self.pos)
        self.pos += 4
        return v

    def read(self):
        flags = self._int()
        kind, has_attr, has_tag = flags & 0xFF, bool(flags & (1 << 9)), bool(flags & (1 << 10))
        if kind in (self.NILVALUE, self.NIL):
            return None
        if kind == self.REF:
            return self.refs[(flags >> 8) - 1]
        if kind == self.SYM:
            name = self.read()  # its CHARSXP
            self.refs.append(name)
            return name
        if kind == self.LIST:  # a pairlist: attributes, tag, value, then the rest of the list
            attrs = self.read() if has_attr else None
            tag = self.read() if has_tag else None
            head = self.read()
            rest = self.read() or []
            del attrs
            return [(tag, head)] + rest
        if kind == self.CHAR:
            n = self._int()
            if n == -1:
                return None  # NA_character_
            s = self.data[self.pos:self.pos + n].decode("utf-8" if flags & (1 << 15) else "latin-1")
            self.pos += n
            return s
        n = self._int()
        if kind in (self.LGL, self.INT):
            value = list(struct.unpack_from(f">{n}i", self.data, self.pos))
            self.pos += 4 * n
        elif kind == self.REAL:
            value = list(struct.unpack_from(f">{n}d", self.data, self.pos))
            self.pos += 8 * n
        elif kind in (self.STR, self.VEC):
            value = [self.read() for _ in range(n)]
        else:
            raise ValueError(f"R type {kind} at byte {self.pos}; this reader knows character vectors and lists")
        if has_attr:
            attrs = dict(self.read())
            if "names" in attrs and kind == self.VEC:
                return dict(zip(attrs["names"], value))
        return value


def read_rdb(data_dir: Path) -> dict[str, list]:
    """Every object of the lazy-load database Rdata.rdx / Rdata.rdb in `data_dir`, by name."""
    index = _read_index(data_dir / "Rdata.rdx")
    blob = (data_dir / "Rdata.rdb").read_bytes()
    objects = {}
    for name, (offset, length) in index.items():
        raw = zlib.decompress(blob[offset + 4:offset + length])  # a 4-byte length, then the zlib stream
        objects[name] = _RReader(raw).read()
    return objects


def _read_index(path: Path) -> dict[str, tuple[int, int]]:
    """The .rdx: a serialized list whose `variables` maps each object's name to (offset, length) in the .rdb."""
    raw = path.read_bytes()
    raw = gzip.decompress(raw) if raw[:2] == b"\x1f\x8b" else zlib.decompress(raw[4:])
    index = _RReader(raw).read()
    return {name: (int(v[0]), int(v[1])) for name, v in index["variables"].items()}


# ------------------------------------------------------------------ cleaning the text


_HEADING = re.compile(r"^(chapter|volume|vol\.|end of|finis|the end)\b|^[IVXLC]+\.?$|^[^a-z]*$", re.IGNORECASE)


def _is_heading(paragraph: str) -> bool:
    """A chapter or volume heading, a title line, a line with no lower-case letter (names in capitals)."""
    return bool(_HEADING.match(paragraph)) or not re.search(r"[a-z]", paragraph) or len(paragraph.split()) < 4 \
        and not paragraph.endswith((".", "!", "?", '"', "'"))


def paragraphs(lines: list[str]) -> list[str]:
    """Gutenberg lines -> paragraphs: lines joined within a paragraph, headings and title matter dropped."""
    out, current = [], []
    for line in list(lines) + [""]:
        line = (line or "").strip()
        if line:
            current.append(line)
            continue
        if current:
            p = " ".join(current)
            p = p.replace("_", "")  # Gutenberg's _italics_
            p = re.sub(r"\s+", " ", p).strip()
            if p and not _is_heading(p):
                out.append(p)
            current = []
    return out


def austen_paragraphs(data_dir: Path) -> list[list[str]]:
    """The six novels, each a list of paragraphs, in NOVELS order."""
    objects = read_rdb(data_dir)
    missing = [n for n in NOVELS if n not in objects]
    if missing:
        raise KeyError(f"{data_dir}/Rdata.rdb: no object {missing[0]!r}; it holds {sorted(objects)}")
    return [paragraphs(objects[n]) for n in NOVELS]


def write_corpus(out: Path, workdir: Path | None = None) -> Path:
    """Fetch the package and write the cleaned novels to `out`: paragraphs separated by a blank line, novels by
    two. Returns `out`."""
    with tempfile.TemporaryDirectory() as tmp:
        data_dir = fetch_package(Path(workdir) if workdir else Path(tmp))
        novels = austen_paragraphs(data_dir)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("\n\n\n".join("\n\n".join(ps) for ps in novels) + "\n", encoding="utf-8")
    return out


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(f"usage: python {sys.argv[0]} OUT.txt")
    path = write_corpus(Path(sys.argv[1]))
    text = path.read_text(encoding="utf-8")
    print(f"{path}: {len(text):,} characters, {len(text.split()):,} words")
