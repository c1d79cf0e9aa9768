"""What every command line shares (``cli.py``, ``engine_cli.py``, ``tune_cli.py``): the store
option, one error path, and the entry point's handling of what a command raises.

Bad input is one line on stderr and exit 2 (``fail``, and the error types of ``user_errors``); a
failure at run time is one line and exit 1 (``fail(..., code=1)``, or any other exception, with
``--debug`` for its traceback); Ctrl-C is 130. Nothing printed carries a password
(``redact.py``). Start-up stays light: only typer and rich load here.
"""

from __future__ import annotations

import os
import sys
from typing import NoReturn, Optional

import typer
from rich.console import Console

err = Console(stderr=True)

# Click's exception types, as the click that typer uses (recent typers vendor their own copy).
_ClickException = next(c for c in typer.BadParameter.__mro__ if c.__name__ == "ClickException")


def dflt(text: str) -> str:
    # Shown as "[default: ...]" after the help (escaped: the help text is Rich markup). Typer's own
    # show_default="..." would print "[default: (...)]".
    return f" \\[default: {text}]"


DEFAULT_STORE = ".swarmfactory/evidence.db"  # evidence.store.DEFAULT_PATH (kept light to import)
STORE_HELP = "evidence store: a SQLite file or a postgresql:// URL"
STORE_DEFAULT = f"$SWARMFACTORY_STORE, else {DEFAULT_STORE}"
READ_STORE_HELP = STORE_HELP + "; must already exist" + dflt(STORE_DEFAULT)
WRITE_STORE_HELP = STORE_HELP + "; created if missing (not its folder)" + dflt(STORE_DEFAULT)
DEBUG_HELP = "show the traceback instead of a one-line error"


def store_option(help: str = READ_STORE_HELP):
    """The one ``--store`` option of every command that reads or writes evidence."""
    return typer.Option(None, "--store", metavar="PATH|URL", help=help)


class UsageError(Exception):
    """Bad input from the user (``code`` 2), or a failure to report in one line (``code`` 1)."""

    def __init__(self, message: str, code: int = 2):
        super().__init__(message)
        self.code = code


def fail(message: str, code: int = 2) -> NoReturn:
    raise UsageError(message, code)


def open_store(store: Optional[str], create: bool, write: bool = False):
    """Reading commands open an existing store only; ``run``, ``eval`` and ``engine tune`` may
    create the file. A store opened to be written (``create`` or ``write``) must take a write
    now, before any work: else one line, exit 2."""
    from swarmfactory.evidence.store import Store

    return Store(store, create=create, write=create or write)


def user_errors() -> tuple:
    """Error types that mean bad input: one line, exit 2. Looked up only in modules already
    imported (an error of a module that never loaded cannot have been raised)."""
    names = {"swarmfactory.problems": "ProblemError", "swarmfactory.evidence.store": "StoreError",
             "swarmfactory.config": "ConfigError"}
    return (UsageError, *(getattr(sys.modules[m], n) for m, n in names.items() if m in sys.modules))


def say(text: str) -> None:
    """An error line on stderr: its first line (an exception's text may go on to quote a whole SQL
    statement), without passwords."""
    from swarmfactory.redact import redact

    lines = redact(text).strip().splitlines()
    err.print(lines[0] if lines else text, markup=False, highlight=False, soft_wrap=True)


def run(command, prog_name: str, argv: list[str] | None = None) -> NoReturn:
    """Run a click command as an entry point: 0 on success, 2 for bad input, 1 for a failure,
    130 on Ctrl-C."""
    from swarmfactory.redact import install_log_redaction, redact

    args = sys.argv[1:] if argv is None else list(argv)
    debug = "--debug" in args or bool(os.environ.get("SWARMFACTORY_DEBUG"))
    install_log_redaction()  # warnings of any module: on stderr, without passwords
    try:
        rc = command.main(args=args, prog_name=prog_name, standalone_mode=False)
    except _ClickException as exc:  # usage errors: bad option, missing argument, bad value
        if type(exc).__name__ == "NoArgsIsHelpError":
            sys.exit(2)  # the help was printed
        ctx = getattr(exc, "ctx", None)
        hint = f" (see {ctx.command_path} --help)" if ctx is not None else ""
        say(f"error: {exc.format_message()}{hint}")
        sys.exit(2)
    except (typer.Abort, KeyboardInterrupt):
        err.print("interrupted", highlight=False)
        sys.exit(130)
    except BrokenPipeError:
        sys.stderr.close()  # the reader went away (| head): nothing left to say
        sys.exit(1)
    except Exception as exc:
        if isinstance(exc, user_errors()) and not debug:
            say(f"error: {exc}")
            sys.exit(getattr(exc, "code", 2))
        if debug:
            import traceback

            sys.stderr.write(redact(traceback.format_exc()))
            sys.exit(1)
        inner = getattr(exc, "orig", None) or exc  # a driver's error: its own words, not SQLAlchemy's wrapper
        first = (str(inner).strip().splitlines() or [""])[0]
        say(f"error: {type(inner).__name__}: {first} (run with --debug for the traceback)")
        sys.exit(1)
    # With standalone_mode=False, click returns an Exit's code (typer.Exit(2) from a command,
    # 130 for a Ctrl-C it caught) instead of exiting: pass it on.
    sys.exit(rc if isinstance(rc, int) else 0)
