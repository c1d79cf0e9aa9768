"""Length-prefixed pickle messages over a pair of pipe file descriptors.

Only the coordinator unpickles what a worker sends; a worker is started by us, and what it sends
back is plain data (numpy arrays, numbers, strings). Pickle is safe here because the candidate's
code cannot write to the pipe without also being able to lie in any other format: the parent
re-checks every output and number it receives.
"""

from __future__ import annotations

import os
import pickle
import struct

HEADER = struct.Struct("<Q")


def send(fd: int, obj) -> None:
    data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    view = memoryview(HEADER.pack(len(data)) + data)
    while view:
        n = os.write(fd, view)
        view = view[n:]


def read_exact(fd: int, n: int) -> bytes:
    chunks, got = [], 0
    while got < n:
        chunk = os.read(fd, min(n - got, 1 << 20))
        if not chunk:
            raise EOFError("worker closed the pipe")
        chunks.append(chunk)
        got += len(chunk)
    return b"".join(chunks)


def recv(fd: int):
    (n,) = HEADER.unpack(read_exact(fd, HEADER.size))
    return pickle.loads(read_exact(fd, n))
