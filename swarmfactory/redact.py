"""Passwords out of everything a user sees: ``redact(text)`` for errors, log lines and pages.

A store or endpoint URL may carry a password (``postgresql://user:secret@host/db``); wherever such
a URL, or an exception's text that may quote one, reaches a terminal, a log or a page it goes
through ``redact`` first. Light to import (the CLI's error path uses it).
"""

from __future__ import annotations

import logging
import re
import sys

# scheme://user:password@ (the password up to the last @ before a space: it may hold a / or a :)
_USERINFO = re.compile(r"(?P<head>\b[a-zA-Z][a-zA-Z0-9+.\-]*://[^\s:/@]*):(?P<secret>[^\s@]*)@")
# password=... in a query string or a libpq connection string
_PARAM = re.compile(r"(?P<head>\b(?:password|passwd|pwd)=)(?P<secret>[^&\s'\"]+)", re.IGNORECASE)


def redact(text) -> str:
    """``text`` (any object, as ``str``) with every URL password replaced by ``***``:
    ``postgresql://user:***@host/db``; ``password=***`` in query and connection strings."""
    s = str(text)
    s = _USERINFO.sub(lambda m: f"{m['head']}:***@", s)
    return _PARAM.sub(lambda m: f"{m['head']}***", s)


class RedactingHandler(logging.StreamHandler):
    """Log records on the current ``sys.stderr`` (looked up at each record, so a live progress
    display that redirects stderr still gets them), redacted."""

    def __init__(self, level: int = logging.WARNING):
        super().__init__()
        self.setLevel(level)
        self.setFormatter(logging.Formatter("%(message)s"))

    @property
    def stream(self):
        return sys.stderr

    @stream.setter
    def stream(self, _value):  # StreamHandler.__init__ assigns one; stderr is looked up per record
        pass

    def format(self, record: logging.LogRecord) -> str:
        return redact(super().format(record))


def install_log_redaction(logger_name: str = "swarmfactory") -> None:
    """Route ``logger_name``'s warnings and errors to stderr through ``RedactingHandler`` (once)."""
    logger = logging.getLogger(logger_name)
    if not any(isinstance(h, RedactingHandler) for h in logger.handlers):
        logger.addHandler(RedactingHandler())
