"""Every exercise check of the notebooks can fail and can pass, with each notebook run twice,
not three times.

* stubs: nbval's run of the notebook as committed ends with one more item, ``exercise stubs``,
  which reads the verdicts the kernel recorded: every ``check_*`` must have reported a failure.
* solutions: ``tests/test_notebook_solutions.py`` runs the notebook with each exercise cell
  replaced by its reference answer: every check must pass.

The verdicts come from ``replaylab.teaching.exercises.results()`` (every check records one), read
by a cell run in the notebook's kernel, not parsed from printed text. Both runs must call the same
checks in the same order, and at least one per exercise cell: each run writes its list of checks
to a folder the session's workers share, then compares it with the other run's list if that one
is already there. A run always writes before it reads, so whichever finishes second compares.
"""

from __future__ import annotations

import json
import tempfile
import uuid
from collections import defaultdict
from pathlib import Path

MARK = "REPLAYLAB_EXERCISE_RESULTS "
REPORT = (
    "import json as _json\n"
    "from replaylab.teaching import exercises as _exercises\n"
    f"print({MARK!r} + _json.dumps(_exercises.results()))"
)
STUB_ITEM = "exercise stubs"  # the name of nbval's extra item
_RUN_ID = uuid.uuid4().hex  # one session without xdist


def exercise_count(path) -> int:
    import nbformat  # here, not at import: the conftest loads this module on machines without it

    from replaylab.teaching.exercises import exercise_cells

    return len(exercise_cells(nbformat.read(path, as_version=4)))


def verdicts_from_text(text: str) -> list[tuple[str, bool]] | None:
    if MARK not in text:
        return None
    return [tuple(r) for r in json.loads(text.split(MARK, 1)[1].strip())]


def check_verdicts(name, mode, verdicts, n_exercises, config) -> None:
    """Assert the run's verdicts: all fail (stubs) or all pass (solutions), one or more per
    exercise cell, and the same checks in the same order as the notebook's other run."""
    assert verdicts is not None, f"{name} ({mode}): the notebook did not report its results"
    assert len(verdicts) >= n_exercises, f"{name}: {len(verdicts)} checks ran, {n_exercises} cells"
    want = mode == "solutions"
    wrong = [check for check, ok in verdicts if ok != want]
    assert not wrong, f"{name} ({mode}): these checks should {'pass' if want else 'fail'}: {wrong}"
    folder = _shared_folder(config)
    checks = [check for check, _ in verdicts]
    mine = folder / f"{name}.{mode}.json"
    tmp = mine.with_suffix(".tmp")
    tmp.write_text(json.dumps(checks))
    tmp.replace(mine)
    other = folder / f"{name}.{'stubs' if want else 'solutions'}.json"
    if other.exists():
        theirs = json.loads(other.read_text())
        assert theirs == checks, f"{name}: the two runs called different checks: {theirs} {checks}"


def _shared_folder(config) -> Path:
    """A folder of this test session, the same for every xdist worker."""
    run = getattr(config, "workerinput", {}).get("testrunuid", _RUN_ID)
    folder = Path(tempfile.gettempdir()) / f"replaylab-exercise-verdicts-{run}"
    folder.mkdir(exist_ok=True)
    return folder


def add_stub_verdict_item():
    """Make nbval's collector of a notebook with exercise cells yield one more item after the
    last cell: it runs REPORT in the notebook's kernel and checks that every check failed."""
    try:
        from nbval.plugin import IPyNbCell, IPyNbFile
    except ImportError:
        return

    class StubVerdicts(IPyNbCell):
        def runtest(self):
            super().runtest()
            text = "".join(o.get("text", "") for o in self.test_outputs or [])
            name = Path(str(self.parent.fspath)).stem
            check_verdicts(name, "stubs", verdicts_from_text(text), self.n_exercises, self.config)

    collect = IPyNbFile.collect

    def collect_with_verdicts(self):
        cells = list(collect(self))
        yield from cells
        n = exercise_count(str(self.fspath))
        if n:
            import nbformat

            cell = nbformat.v4.new_code_cell(REPORT)
            item = StubVerdicts.from_parent(
                self,
                name=STUB_ITEM,
                cell_num=len(cells),
                cell=cell,
                options=defaultdict(bool),
            )
            item.n_exercises = n
            yield item

    IPyNbFile.collect = collect_with_verdicts
