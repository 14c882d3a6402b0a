"""What every exercise check shares: the record of verdicts, the printed verdict and the guard
that turns anything the learner's code raises into a reported failure.

Glossary: a *check* is a ``check_*`` function of one of ``replaylab.teaching``'s
``exercises_<topic>`` modules (one per notebook topic; ``exercises`` re-exports those of
notebooks 01-09) or of ``puzzles``; a *verdict* is (check name, passed); the *learner's frame*
is the last frame of a traceback that lies outside replaylab and outside installed packages
and the standard library (a notebook cell, a script, a test), i.e. the line of the learner's
code where an exception was raised.

``@guarded("name")`` wraps a check so that it never raises: ``NotImplementedError`` (a stub)
is reported as "not yet implemented", any other exception as ``FAIL name: ... raised
ValueError: ... (in f, line 3: `...`)``; both record a failed verdict and return False, so a
notebook's Run All goes on past an unfinished or broken exercise.
"""

from __future__ import annotations

import functools
import inspect
import sysconfig
import traceback
from pathlib import Path

__all__ = [
    "record",
    "results",
    "report",
    "not_implemented",
    "NOT_IMPLEMENTED",
    "describe_exception",
    "learner_frame",
    "guarded",
]

# --------------------------------------------------------------------------------------------
# The record of verdicts (read by tests/test_notebook_solutions.py after running a notebook)

_RESULTS: list[tuple[str, bool]] = []


def record(name: str, ok: bool) -> bool:
    """Remember one check's verdict (in run order) and return it."""
    _RESULTS.append((name, bool(ok)))
    return bool(ok)


def results() -> list[tuple[str, bool]]:
    """Every verdict recorded in this process so far: [(check name, passed), ...]."""
    return list(_RESULTS)


def report(name: str, ok: bool, message: str) -> bool:
    """Print ``PASS name: message`` or ``FAIL name: message``, record the verdict, return it."""
    print(f"{'PASS' if ok else 'FAIL'} {name}: {message}")
    return record(name, ok)


NOT_IMPLEMENTED = "not yet implemented (the stub raised NotImplementedError)"


def not_implemented(name: str) -> bool:
    return report(name, False, NOT_IMPLEMENTED)


# --------------------------------------------------------------------------------------------
# Where an exception came from

_PACKAGE = Path(__file__).resolve().parents[1]  # replaylab/, not only replaylab/teaching/
_LIBRARIES = tuple(
    Path(p).resolve()
    for key in ("stdlib", "platstdlib", "purelib", "platlib")
    if (p := sysconfig.get_paths().get(key))
)


def _inside(path: Path, folder: Path) -> bool:
    try:
        path.relative_to(folder)
    except ValueError:
        return False
    return True


def _is_library(filename: str) -> bool:
    if filename.startswith("<") and filename.endswith(">"):  # <frozen ...>, <string>
        return filename.startswith("<frozen")
    path = Path(filename).resolve()
    return _inside(path, _PACKAGE) or any(_inside(path, lib) for lib in _LIBRARIES)


def _chain(err: BaseException) -> list[BaseException]:
    """``err`` and the exceptions it was raised from (``__cause__``, or ``__context__`` when
    not suppressed), outermost first; e.g. Triton's interpreter wraps the kernel's error."""
    chain = [err]
    while len(chain) < 10:
        last = chain[-1]
        inner = last.__cause__ or (None if last.__suppress_context__ else last.__context__)
        if inner is None or inner in chain:
            break
        chain.append(inner)
    return chain


def _learner_frame(err: BaseException):
    for frame in reversed(traceback.extract_tb(err.__traceback__)):
        if not _is_library(frame.filename):
            return frame
    return None


def learner_frame(err: BaseException):
    """(exception, ``traceback.FrameSummary``) of the learner's line where ``err`` was raised:
    the last frame outside replaylab, installed packages and the standard library, searched from
    the innermost exception of the chain ``err`` was raised from; (err, None) when every frame
    is library code (e.g. the check itself could not read the answer)."""
    for exc in reversed(_chain(err)):
        frame = _learner_frame(exc)
        if frame is not None:
            return exc, frame
    return err, None


def _where(frame) -> str:
    code = (frame.line or "").strip()
    return f"line {frame.lineno} of {frame.name}" + (f": `{code}`" if code else "")


def describe_exception(err: BaseException, limit: int = 300) -> str:
    """'your code raised IndexError: list index out of range (line 7 of find_draft:
    `follow[-1]`)': the exception type, its message (the last ``limit`` characters) and the
    learner's line where it was raised (or, when none is found, replaylab's line that failed
    on the answer)."""
    err, frame = learner_frame(err)
    message = str(err).strip()
    if len(message) > limit:
        message = "..." + message[-limit:]
    what = type(err).__name__ + (f": {message}" if message else "")
    if frame is not None:
        return f"your code raised {what} ({_where(frame)})"
    frames = traceback.extract_tb(err.__traceback__)
    ours = [f for f in frames if _inside(Path(f.filename).resolve(), _PACKAGE)]
    last = ours[-1] if ours else (frames[-1] if frames else None)
    where = f" at {Path(last.filename).name}, {_where(last)}" if last is not None else ""
    return f"the check raised {what} on your answer{where}; look at what your answer is"


# --------------------------------------------------------------------------------------------
# The guard


def guarded(name: str):
    """Decorator for a check: report any exception as a failed verdict instead of raising.

    ``name`` is the verdict's name (the one the check records itself), formatted with the
    check's arguments, e.g. ``"recompute at acceptance {acceptance}"``. The wrapped function
    keeps its signature and docstring; ``check.verdict_name(*args, **kwargs)`` gives the name.
    """

    def wrap(check):
        signature = inspect.signature(check)

        def verdict_name(*args, **kwargs) -> str:
            try:
                bound = signature.bind_partial(*args, **kwargs)
                bound.apply_defaults()
                return name.format(**bound.arguments)
            except Exception:  # a call with the wrong arguments still gets a verdict
                return name

        @functools.wraps(check)
        def checked(*args, **kwargs):
            try:
                return check(*args, **kwargs)
            except NotImplementedError:
                return not_implemented(verdict_name(*args, **kwargs))
            except Exception as err:  # the learner's code (or answer) raised: report it
                return report(verdict_name(*args, **kwargs), False, describe_exception(err))

        checked.verdict_name = verdict_name
        checked.guarded = True
        return checked

    return wrap
