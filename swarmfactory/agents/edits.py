"""Turning a model's answer into kernel source: a full rewrite in a fenced block, or
SEARCH/REPLACE edits applied to the parent. Failures are typed so they can be recorded. What a
backend's source looks like (its fences, what defines the kernel) is its language record
(``Backend.language``)."""

from __future__ import annotations

import re

from swarmfactory.backends import get_backend

EDIT = re.compile(r"<{5,9} SEARCH\s*?\n(.*?)\n?={5,9}\s*?\n(.*?)\n?>{5,9} REPLACE", re.S)
FENCE = re.compile(r"```[ \t]*([A-Za-z0-9_+-]*)[ \t]*\n(.*?)```", re.S)


class EditError(Exception):
    """``kind`` is one of: empty, parse_error, apply_error."""

    def __init__(self, kind: str, message: str):
        super().__init__(message)
        self.kind = kind


def extract_source(answer: str, parent: str | None, symbol: str, backend: str = "c") -> tuple[str, str]:
    """Returns (source, how) with how in {"rewrite", "edit"}; raises EditError. ``backend``: what
    the source is written in; its language says which fenced blocks are source (```c,
    ```python...)."""
    text = (answer or "").strip()
    if not text:
        raise EditError("empty", "the model returned an empty answer")
    edits = EDIT.findall(text)
    if edits:
        if parent is None:
            raise EditError("apply_error", "SEARCH/REPLACE edits but no parent source to apply them to")
        src = parent
        for i, (search, replace) in enumerate(edits, 1):
            if search.strip() and search in src:
                src = src.replace(search, replace, 1)
            elif search.strip() and _loose(search) in _loose(src):
                src = _apply_loose(src, search, replace)
            else:
                raise EditError("apply_error", f"SEARCH block {i} of {len(edits)} does not occur in the parent")
        return src, "edit"
    language = get_backend(backend).language
    blocks = [b for tag, b in FENCE.findall(text) if tag.lower() in language.fences]
    blocks = [b for b in blocks if language.defines(b, symbol)]
    if blocks:
        return max(blocks, key=len).strip() + "\n", "rewrite"
    if language.is_whole_file(text, symbol):
        return text + "\n", "rewrite"  # an unfenced but complete file
    raise EditError("parse_error", f"no fenced {language.name} block defining {symbol}() and no SEARCH/REPLACE edit")


def _loose(s: str) -> str:
    return "\n".join(line.strip() for line in s.strip().splitlines())


def _apply_loose(src: str, search: str, replace: str) -> str:
    """Match ignoring indentation: find the run of source lines equal to the search lines."""
    lines, want = src.splitlines(), [ln.strip() for ln in search.strip().splitlines()]
    for i in range(len(lines) - len(want) + 1):
        if [ln.strip() for ln in lines[i:i + len(want)]] == want:
            return "\n".join(lines[:i] + replace.splitlines() + lines[i + len(want):]) + "\n"
    raise EditError("apply_error", "SEARCH block does not occur in the parent")
