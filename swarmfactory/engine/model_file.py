"""A model file's identity: the sha256 of its content, and the id it is served under.

Everything measured or tuned for a model (calibrations, engine profiles, verification references)
is keyed by the content digest, so a renamed or copied file keeps it and two different files never
share it. Hashing is done in chunks and remembered in ``model-digests.json`` under the user cache
root (``$SWARMFACTORY_CACHE`` or ``~/.cache/swarmfactory``) per resolved path, size and
``mtime_ns``: an unchanged file is hashed once (Gemma 3 270M's 250 MB: 0.3 s from the page
cache, seconds from a cold disk), a rewritten one again.

The served id (``/v1/models``, every response's ``model``) is the file name without its
extension: it is what the operator chose, distinguishes two quantisations of one model (whose
``general.name`` is the same) and needs no quoting.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

CHUNK = 8 << 20
KEEP = 64  # files remembered in the cache (the most recently hashed)
_memo: dict[tuple, str] = {}


def model_id(path: str | Path) -> str:
    """The id a server serves the GGUF file at ``path`` under."""
    return Path(path).stem


def digest_cache() -> Path:
    from swarmfactory.hardware import cache_dir

    return cache_dir() / "model-digests.json"


def sha256(path: str | Path) -> str:
    """Hex sha256 of the file's content, from the digest cache where this version of the file
    (resolved path, size, mtime_ns) was hashed before."""
    p = Path(path).resolve()
    st = p.stat()
    key = (str(p), st.st_size, st.st_mtime_ns)
    if key in _memo:
        return _memo[key]
    where = digest_cache()
    entry = _read(where).get(str(p)) or {}
    if entry.get("bytes") == st.st_size and entry.get("mtime_ns") == st.st_mtime_ns \
            and isinstance(entry.get("sha256"), str):
        digest = entry["sha256"]
    else:
        digest = _hash(p)
        _remember(where, str(p), {"bytes": st.st_size, "mtime_ns": st.st_mtime_ns, "sha256": digest})
    _memo[key] = digest
    return digest


def _hash(path: Path) -> str:
    h = hashlib.sha256()
    buf = bytearray(CHUNK)
    view = memoryview(buf)
    with open(path, "rb", buffering=0) as f:
        while n := f.readinto(buf):
            h.update(view[:n])
    return h.hexdigest()


def _read(where: Path) -> dict:
    try:
        files = json.loads(where.read_text()).get("files")
    except (OSError, ValueError, AttributeError):
        return {}  # none yet, or unreadable: hash again and write a good one
    return files if isinstance(files, dict) else {}


def _remember(where: Path, path: str, entry: dict) -> None:
    files = _read(where)
    files.pop(path, None)
    files[path] = entry  # last: the most recent
    files = dict(list(files.items())[-KEEP:])
    try:
        where.parent.mkdir(parents=True, exist_ok=True)
        tmp = where.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps({"version": 1, "files": files}, indent=1))
        os.replace(tmp, where)  # atomic: a concurrent reader sees the old file or the new one
    except OSError:
        pass  # a read-only cache: the digest is only computed again next time
