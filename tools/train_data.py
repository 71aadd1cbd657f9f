"""The training text of the small default model: English prose from two documentation packages of Debian 12.

- python3.11-doc: the reStructuredText sources of Python's documentation (PSF License 2.0; the docs' code examples
  are also under the Zero-Clause BSD licence). Markup roles become their text; headings, index entries and code
  (literal blocks, doctests, grammar listings, tables) are dropped.
- postgresql-doc-15: PostgreSQL's manual as HTML (the PostgreSQL Licence, a BSD-style permissive licence). The text
  of its <p> elements is kept; code listings, tables and navigation are not.

Every 40th document (sorted by path) is held out: the model never trains on it, and its perplexity is the one we
report. prepare: the .debs -> documents -> a byte-level BPE tokenizer -> uint16 token files + a manifest.
"""

from __future__ import annotations

import hashlib
import io
import json
import lzma
import re
import subprocess
import tarfile
from dataclasses import dataclass
from html.parser import HTMLParser
from pathlib import Path

import numpy as np


@dataclass(frozen=True)
class DebSource:
    package: str
    version: str
    prefix: str  # the documents: files under this path ending in `suffix`
    suffix: str
    kind: str  # "rst" or "html": which cleaner reads them
    license: str
    license_file: str


SOURCES = (
    DebSource(
        "python3.11-doc", "3.11.2-6+deb12u9", "usr/share/doc/python3.11/html/_sources/", ".rst.txt", "rst",
        "Python Software Foundation License Version 2 (code examples also Zero-Clause BSD)",
        "usr/share/doc/python3.11-doc/copyright",
    ),
    DebSource(
        "postgresql-doc-15", "15.20-0+deb12u1", "usr/share/doc/postgresql-doc-15/html/", ".html", "html",
        "PostgreSQL Licence (BSD-style permissive)",
        "usr/share/doc/postgresql-doc-15/copyright",
    ),
)
HELD_OUT_EVERY = 40  # every 40th document by sorted path is held out (about 2.5 % of the text)

# Directives whose indented body is prose we keep (the directive line itself goes, or becomes its argument).
_PROSE_DIRECTIVES = {
    "note", "warning", "seealso", "versionadded", "versionchanged", "deprecated", "deprecated-removed",
    "impl-detail", "tip", "important", "attention", "caution", "hint", "topic", "sidebar", "rubric", "glossary",
}
# API descriptions: the signature becomes a line of text and the body is kept.
_SIGNATURE_DIRECTIVES = {
    "function", "method", "class", "attribute", "data", "exception", "decorator", "decoratormethod",
    "classmethod", "staticmethod", "coroutinefunction", "coroutinemethod", "abstractmethod", "module",
    "describe", "opcode", "cmdoption", "option", "envvar", "pdbcommand", "c:function", "c:macro", "c:type",
    "c:member", "c:var", "c:struct", "c:data", "c:enum", "c:enumerator", "index-entry", "awaitablefunction",
    "awaitablemethod", "currentmodule", "program", "term",
}
_ROLE = re.compile(r":[\w:.+-]+:`([^`]*)`")
_LINK = re.compile(r"`([^`<]*?)\s*<[^>]*>`_{0,2}")
_PLAIN_LINK = re.compile(r"`([^`]+)`_{1,2}")
_LITERAL = re.compile(r"``([^`]+)``")
_EMPHASIS = re.compile(r"\*\*([^*]+)\*\*|\*([^*\s][^*]*)\*")
_UNDERLINE = re.compile(r"^([=\-~^\"'`#*+.:_])\1{2,}\s*$")
_OPTION_LINE = re.compile(r"^\s+:[\w-]+:( |$)")


def _inline(text: str) -> str:
    """Markup roles, links, literals and emphasis as their plain text."""

    def role(match: re.Match) -> str:
        inner = match[1]
        link = re.fullmatch(r"(.*?)\s*<[^>]*>", inner, re.S)
        if link and link[1]:
            return link[1]
        inner = inner.lstrip("!")
        return inner.rsplit(".", 1)[-1] if inner.startswith("~") else inner

    text = _ROLE.sub(role, text)
    text = _LINK.sub(r"\1", text)
    text = _PLAIN_LINK.sub(r"\1", text)
    text = _LITERAL.sub(r"\1", text)
    text = _EMPHASIS.sub(lambda m: m[1] or m[2], text)
    return text.replace("\\", "")


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip(" "))


def rst_to_prose(source: str) -> str:
    """The prose paragraphs of one reStructuredText document, one paragraph a line, blank lines between."""
    lines = source.expandtabs(4).splitlines()
    kept: list[str] = []
    skip_deeper_than: int | None = None  # inside a dropped block: skip lines indented deeper than this
    pending_literal = False  # the previous paragraph ended in "::": the next indented block is code
    for line in lines:
        stripped = line.strip()
        if skip_deeper_than is not None:
            if not stripped or _indent(line) > skip_deeper_than:
                continue
            skip_deeper_than = None
        if not stripped:
            kept.append("")
            continue
        if pending_literal and _indent(line) > (_indent(kept[-1]) if kept and kept[-1] else -1):
            pending_literal = False
            skip_deeper_than = _indent(line) - 1
            continue
        pending_literal = False
        directive = re.match(r"^(\s*)\.\.\s+([\w:-]+)::\s*(.*)$", line)
        if directive:
            name, argument = directive[2], directive[3]
            if name in _SIGNATURE_DIRECTIVES and argument and name != "currentmodule":
                kept.append("")
                kept.append(directive[1] + _inline(argument))
                kept.append("")
            elif name not in _PROSE_DIRECTIVES and name not in _SIGNATURE_DIRECTIVES:
                skip_deeper_than = _indent(line)  # code, tables, index, toctree, images ...
            continue
        if stripped.startswith(".."):  # a comment or a link target
            skip_deeper_than = _indent(line)
            continue
        if _UNDERLINE.match(stripped) or _OPTION_LINE.match(line):
            continue
        if stripped.startswith((">>>", "...", "+-", "+=", "|", "$ ")):  # doctests, grid tables, shell sessions
            continue
        if stripped.endswith("::"):
            pending_literal = True
            stripped = stripped[:-2].rstrip()
            line = " " * _indent(line) + stripped + (":" if stripped and not stripped.endswith(":") else "")
            if not stripped:
                continue
        kept.append(line)

    paragraphs, current = [], []
    for line in kept + [""]:
        if line.strip():
            current.append(line.strip())
        elif current:
            paragraph = _inline(" ".join(current)).strip()
            if len(paragraph) > 1 and re.search(r"[A-Za-z]", paragraph):
                paragraphs.append(re.sub(r"\s+", " ", paragraph))
            current = []
    return "\n\n".join(paragraphs)


# ---------------------------------------------------------------------------------------------- the package


def _deb_members(deb_path: Path) -> dict[str, bytes]:
    """The files of a .deb's data archive (an `ar` archive holding data.tar.xz), by path without the leading ./"""
    blob = deb_path.read_bytes()
    if not blob.startswith(b"!<arch>\n"):
        raise ValueError(f"{deb_path}: not a Debian package (no ar header)")
    offset, data = 8, None
    while offset < len(blob):
        header = blob[offset : offset + 60]
        name, size = header[:16].decode().strip().rstrip("/"), int(header[48:58])
        if name.startswith("data.tar"):
            data = blob[offset + 60 : offset + 60 + size]
        offset += 60 + size + (size & 1)
    if data is None:
        raise ValueError(f"{deb_path}: no data.tar member")
    raw = lzma.decompress(data) if data[:6] == b"\xfd7zXZ\x00" else data
    members = {}
    with tarfile.open(fileobj=io.BytesIO(raw)) as archive:
        for member in archive.getmembers():
            if member.isfile():
                members[member.name.removeprefix("./")] = archive.extractfile(member).read()
    return members


class _ParagraphText(HTMLParser):
    """The text of each <p> element outside code listings and tables, one paragraph a string."""

    _SKIPPED = ("pre", "table", "script", "style")

    def __init__(self):
        super().__init__()
        self.paragraphs: list[str] = []
        self._open_p, self._skipped, self._buffer = 0, 0, []

    def handle_starttag(self, tag, attrs):
        self._skipped += tag in self._SKIPPED
        if tag == "p":
            self._open_p, self._buffer = self._open_p + 1, []

    def handle_endtag(self, tag):
        self._skipped -= tag in self._SKIPPED and self._skipped > 0
        if tag == "p" and self._open_p:
            self._open_p -= 1
            text = re.sub(r"\s+", " ", "".join(self._buffer)).strip()
            if re.search(r"[A-Za-z]", text):
                self.paragraphs.append(text)

    def handle_data(self, data):
        if self._open_p and not self._skipped:
            self._buffer.append(data)


def html_to_prose(source: str) -> str:
    parser = _ParagraphText()
    parser.feed(source)
    return "\n\n".join(parser.paragraphs)


def fetch_deb(source: DebSource, folder: Path) -> Path:
    """The source's .deb in `folder`, downloaded by apt-get the first time."""
    folder.mkdir(parents=True, exist_ok=True)
    name = f"{source.package}_{source.version.replace(':', '%3a')}_all.deb"
    if not (folder / name).exists():
        subprocess.run(["apt-get", "download", f"{source.package}={source.version}"], cwd=folder, check=True)
    return folder / name


@dataclass
class Corpus:
    """Documents by path, and where they came from (for the manifest)."""

    documents: dict[str, str]
    sources: list[dict]


def corpus_from_debs(folder: Path) -> Corpus:
    """Every source of SOURCES, its .deb in `folder` (fetched when absent), cleaned to prose."""
    documents, sources = {}, []
    for source in SOURCES:
        deb_path = fetch_deb(source, folder)
        members = _deb_members(deb_path)
        clean = rst_to_prose if source.kind == "rst" else html_to_prose
        paths = sorted(p for p in members if p.startswith(source.prefix) and p.endswith(source.suffix))
        for path in paths:
            documents[f"{source.package}/{path.removeprefix(source.prefix)}"] = clean(members[path].decode("utf-8"))
        sources.append({
            "package": f"Debian 12 {source.package}",
            "version": source.version,
            "deb_file": deb_path.name,
            "deb_sha256": sha256_file(deb_path),
            "files": f"{source.prefix}**/*{source.suffix} ({len(paths)} files)",
            "license": source.license,
            "license_file": source.license_file,
            "license_file_sha256": hashlib.sha256(members[source.license_file]).hexdigest(),
        })
    return Corpus(documents, sources)


def corpus_from_folder(folder: Path) -> Corpus:
    """Plain .txt / .rst files of a folder (tests and other sources): the same cleaning, the same split."""
    paths = sorted(p for p in folder.rglob("*") if p.suffix in (".txt", ".rst"))
    documents = {str(p.relative_to(folder)): rst_to_prose(p.read_text(encoding="utf-8")) for p in paths}
    return Corpus(documents, [{"package": f"folder {folder}", "files": f"{len(documents)} files"}])


def split_documents(documents: dict[str, str]) -> tuple[list[str], list[str]]:
    """(training paths, held-out paths): every HELD_OUT_EVERY-th non-empty document, sorted by path, is held out."""
    paths = [path for path in sorted(documents) if documents[path]]
    held = paths[HELD_OUT_EVERY // 2 :: HELD_OUT_EVERY] or paths[-1:]
    return [p for p in paths if p not in held], held


def sha256_file(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def prepare(corpus: Corpus, out: Path, vocab_size: int) -> dict:
    """Train the tokenizer on the training documents and write out/: tokenizer_gguf.json, tokenizer.json,
    train.bin / heldout.bin (uint16 ids, documents ended by <|endoftext|>), heldout.txt, manifest.json."""
    from strata.tokenizer import Tokenizer
    from strata.tokenizer_train import train_small_bpe

    out.mkdir(parents=True, exist_ok=True)
    train_paths, held_paths = split_documents(corpus.documents)
    train_text = [corpus.documents[p] + "\n" for p in train_paths]
    metadata = train_small_bpe(vocab_size, (line for doc in train_text for line in doc.splitlines(keepends=True)))
    (out / "tokenizer_gguf.json").write_text(json.dumps(metadata, ensure_ascii=False))
    tokenizer = Tokenizer.from_gguf_metadata(metadata, "trained BPE")
    tokenizer.backend.save(str(out / "tokenizer.json"))
    endoftext = tokenizer.token_to_id("<|endoftext|>")

    def ids_of(paths: list[str]) -> np.ndarray:
        encoded = tokenizer.backend.encode_batch([corpus.documents[p] for p in paths], add_special_tokens=False)
        flat = [i for doc in encoded for i in (*doc.ids, endoftext)]
        return np.asarray(flat, dtype=np.uint16)

    train_ids, held_ids = ids_of(train_paths), ids_of(held_paths)
    train_ids.tofile(out / "train.bin")
    held_ids.tofile(out / "heldout.bin")
    (out / "heldout.txt").write_text("\n\n".join(corpus.documents[p] for p in held_paths) + "\n", encoding="utf-8")
    manifest = {
        "sources": corpus.sources,
        "cleaning": "tools/train_data.py rst_to_prose / html_to_prose: prose paragraphs only (no code, no tables)",
        "vocab_size": vocab_size,
        "train_documents": len(train_paths),
        "heldout_documents": held_paths,
        "train_tokens": int(train_ids.size),
        "heldout_tokens": int(held_ids.size),
        "train_chars": sum(len(t) for t in train_text),
        "files": {
            name: sha256_file(out / name)
            for name in ("tokenizer_gguf.json", "tokenizer.json", "train.bin", "heldout.bin", "heldout.txt")
        },
    }
    (out / "manifest.json").write_text(json.dumps(manifest, indent=1))
    return manifest
