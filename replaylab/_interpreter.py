"""Work that Triton's interpreter (3.x, ``TRITON_INTERPRET=1``: the kernels on CPU tensors)
does and then throws away, skipped. ``import replaylab`` calls ``quicken`` when the interpreter
is on. Neither change alters a value a kernel computes, and compiled (GPU) kernels never pass
through this code. Each step checks that the interpreter still has the parts it relies on
and leaves it alone otherwise (a slower interpreter, never a wrong one).

Measured on a 2-core CPU machine: the first took test_decode_kernels' fused replay engine
test from 44 s to 23 s, the second three fused-engine tests from 83 s of CPU time to 56 s.
"""

from __future__ import annotations

import dataclasses
import functools


def quicken():
    try:
        from triton.runtime import interpreter
    except ImportError:  # no triton: nothing runs through the interpreter
        return
    _skip_dropped_overflow_checks(interpreter)
    _patch_the_language_once_a_launch(interpreter)


def _skip_dropped_overflow_checks(interpreter):
    """The interpreter follows every int32 +, - and * with an overflow check (a cast to int64,
    the operation again, two compares) and then drops it: the check's ``device_assert`` does
    nothing unless the interpreter's options say ``debug``, and the interpreter never sets that
    (about 45% of an interpreted Mamba-2 replay step)."""
    builder = getattr(interpreter, "interpreter_builder", None)
    options = getattr(builder, "options", None)
    if dataclasses.is_dataclass(options) and not getattr(options, "debug", True):
        if getattr(options, "sanitize_overflow", False):
            builder.options = dataclasses.replace(options, sanitize_overflow=False)


def _patch_the_language_once_a_launch(interpreter):
    """Every call of a jitted device function (``tl.sum``, ``tl.cumsum``, a kernel's own
    helpers) patches ``triton.language`` again for the interpreter (``_patch_lang``, an
    ``inspect.getmembers`` over four modules), although within one launch the first such call
    from a module's functions has done it and nothing undoes it before the launch ends: the
    repeats change nothing (they were 40% of the interpreted fused GDN engine test).
    Within a launch (``GridExecutor.__call__``) the language is now patched once for each
    module whose functions run; the launch's own patch, which it undoes at its end, is the
    first, as before. Outside a launch nothing changes."""
    patch_lang = getattr(interpreter, "_patch_lang", None)
    executor = getattr(interpreter, "GridExecutor", None)
    empty_scope = getattr(interpreter, "_LangPatchScope", None)
    if None in (patch_lang, executor, empty_scope) or hasattr(patch_lang, "once_a_launch"):
        return
    launches = []  # for each launch running: the ids of the globals patched for it

    @functools.wraps(patch_lang)
    def once_a_launch(fn):
        if launches and id(fn.__globals__) in launches[-1]:
            return empty_scope()  # nothing to undo: the patch in force stays, as it would
        scope = patch_lang(fn)
        if launches:
            launches[-1].add(id(fn.__globals__))
        return scope

    run = executor.__call__

    @functools.wraps(run)
    def launch(self, *args, **kwargs):
        launches.append(set())
        try:
            return run(self, *args, **kwargs)
        finally:
            launches.pop()

    once_a_launch.once_a_launch = True
    interpreter._patch_lang = once_a_launch
    executor.__call__ = launch
