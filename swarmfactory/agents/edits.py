"""Turning a model's answer into kernel source: a full rewrite in a fenced block, or
SEARCH/REPLACE edits applied to the parent. Failures are typed so they can be recorded."""

from __future__ import annotations

import re

EDIT = re.compile(r"<{5,9} SEARCH\s*?\n(.*?)\n?={5,9}\s*?\n(.*?)\n?>{5,9} REPLACE", re.S)
FENCE = re.compile(r"```[ \t]*([A-Za-z0-9_+-]*)[ \t]*\n(.*?)```", re.S)


class EditError(Exception):
    """``kind`` is one of: empty, parse_error, apply_error."""

    def __init__(self, kind: str, message: str):
        super().__init__(message)
        self.kind = kind


FENCE_LANGS = {"c": ("", "c", "cpp", "c++", "h"), "triton": ("", "python", "py", "triton"),
               "cuda": ("", "cuda", "cu", "cpp", "c++", "c"), "ptx": ("", "ptx", "asm")}


def extract_source(answer: str, parent: str | None, symbol: str, backend: str = "c") -> tuple[str, str]:
    """Returns (source, how) with how in {"rewrite", "edit"}; raises EditError. ``backend`` says
    which fenced blocks are source (```c, ```python, ```cuda, ```ptx)."""
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
    langs = FENCE_LANGS.get(backend, FENCE_LANGS["c"])
    blocks = [b for lang, b in FENCE.findall(text) if lang.lower() in langs]
    pattern = rf"\.entry\s+{re.escape(symbol)}\s*\(" if backend == "ptx" else rf"\b{re.escape(symbol)}\s*\("
    blocks = [b for b in blocks if re.search(pattern, b)]
    if blocks:
        return max(blocks, key=len).strip() + "\n", "rewrite"
    if backend == "c" and re.search(rf"\bvoid\s+{re.escape(symbol)}\s*\(", text) and "#include" in text:
        return text + "\n", "rewrite"  # an unfenced but complete file
    what = {"c": "C", "triton": "Python (Triton)", "cuda": "CUDA", "ptx": "PTX"}.get(backend, backend)
    raise EditError("parse_error", f"no fenced {what} block defining {symbol}() and no SEARCH/REPLACE edit")


def _loose(s: str) -> str:
    return "\n".join(line.strip() for line in s.strip().splitlines())


def _apply_loose(src: str, search: str, replace: str) -> str:
    """Match ignoring indentation: find the run of source lines equal to the search lines."""
    lines, want = src.splitlines(), [ln.strip() for ln in search.strip().splitlines()]
    for i in range(len(lines) - len(want) + 1):
        if [ln.strip() for ln in lines[i:i + len(want)]] == want:
            return "\n".join(lines[:i] + replace.splitlines() + lines[i + len(want):]) + "\n"
    raise EditError("apply_error", "SEARCH block does not occur in the parent")
