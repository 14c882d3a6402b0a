"""The exercise checks of notebooks 03-09 and the Triton puzzles of notebook 06, without running
the notebooks: each check passes on the reference answer in ``notebooks/solutions/`` and fails
on the stub and on typical mistakes; the traffic counter counts what a kernel really touches."""

from __future__ import annotations

import importlib
import importlib.util
from pathlib import Path

import pytest
import torch

from replaylab.teaching import exercises, puzzles
from replaylab.teaching.exercises import ScanInputs, solution_sections

SOLUTIONS = Path(__file__).resolve().parents[1] / "notebooks" / "solutions"


def _solution(notebook, key, tmp_path=None, **namespace):
    """Run one solution section and return its namespace. Triton kernels need a real file
    (the interpreter reads their source), so those sections are imported from ``tmp_path``."""
    source = solution_sections(SOLUTIONS / f"{notebook}.py")[key]
    if tmp_path is None:
        exec(compile(source, f"{notebook}:{key}", "exec"), namespace)
        return namespace
    path = tmp_path / f"solution_{key}.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location(f"solution_{key}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return vars(module)


class _Stub:
    def __init__(self, *args):
        raise NotImplementedError


# ---------------------------------------------------------------- the mini stores


def test_snapshot_store_solution_passes_stub_fails(capsys):
    ns = _solution("03_branching_strategies", "snapshot_store")
    assert exercises.check_snapshot_store(ns["MySnapshotStore"])
    assert not exercises.check_snapshot_store(_Stub)
    assert "not yet implemented" in capsys.readouterr().out


def test_snapshot_store_check_catches_a_restore_that_keeps_the_position(capsys):
    base = _solution("03_branching_strategies", "snapshot_store")["MySnapshotStore"]

    class KeepsPosition(base):
        def restore(self, handle):
            self.state = self.saved[handle][1].clone()

    assert not exercises.check_snapshot_store(KeepsPosition)
    assert "position is" in capsys.readouterr().out


def test_snapshot_store_check_catches_a_restore_that_consumes_the_copy():
    base = _solution("03_branching_strategies", "snapshot_store")["MySnapshotStore"]

    class ConsumesCopy(base):
        def restore(self, handle):
            position, state = self.saved.pop(handle)
            self.state, self.position = state, position

    assert not exercises.check_snapshot_store(ConsumesCopy)


def test_recompute_store_solution_passes_and_mistakes_fail(capsys):
    base = _solution("05_recompute_vs_replay", "recompute_store")["MyRecomputeStore"]
    assert exercises.check_recompute_store(base)
    assert not exercises.check_recompute_store(_Stub)

    class KeepsEveryState(base):  # memory of a snapshot store: not recompute
        def advance(self, inputs):
            y = super().advance(inputs)
            self.checkpoints[self.position] = self.state
            return y

    capsys.readouterr()
    assert not exercises.check_recompute_store(KeepsEveryState)
    assert "checkpoints held at" in capsys.readouterr().out

    class ForgetsToRerun(base):  # restores the checkpoint itself, not the state at p
        def restore(self, p):
            rerun = super().restore(p)
            self.state = self.checkpoints[p - rerun].clone()
            return rerun

    assert not exercises.check_recompute_store(ForgetsToRerun)

    class MiscountsRerun(base):
        def restore(self, p):
            return super().restore(p) + 1

    assert not exercises.check_recompute_store(MiscountsRerun)


def test_replay_log_solution_passes_and_mistakes_fail(capsys):
    base = _solution("05_recompute_vs_replay", "replay_log")["MyReplayLog"]
    assert exercises.check_replay_log(base)
    assert not exercises.check_replay_log(_Stub)

    class CachesStates(base):  # keeps states: not a replay log
        def append(self, inputs):
            super().append(inputs)
            self.states = [self.state(j) for j in range(1, len(self) + 1)]

    capsys.readouterr()
    assert not exercises.check_replay_log(CachesStates)
    assert "state-shaped tensors" in capsys.readouterr().out

    class FoldsInPlace(base):  # writes the fold into the checkpoint
        def state(self, j=None):
            s = super().state(j)
            self.checkpoint.copy_(s)
            return s

    assert not exercises.check_replay_log(FoldsInPlace)

    class TruncateIgnored(base):
        def truncate_to(self, j):
            pass

    assert not exercises.check_replay_log(TruncateIgnored)


def test_scan_inputs_slicing_and_cat():
    layer = exercises.mini_layer()
    g = torch.Generator().manual_seed(0)
    a, b = layer.random_inputs(2, 3, g), layer.random_inputs(2, 4, g)
    both = ScanInputs.cat([a, b])
    assert len(both) == 7 and torch.equal(both[3:].x, b.x) and torch.equal(both[:3].B, a.B)
    with pytest.raises(TypeError, match="slice"):
        both[0]


def test_cost_eviction_solution_passes_and_lru_fails():
    ns = _solution("04_snapshot", "cost_eviction")
    assert exercises.check_cost_eviction(ns["cheapest_to_rebuild"])
    assert not exercises.check_cost_eviction(
        lambda items: min(items, key=lambda i: i.last_used).key
    )

    def stub(items):
        raise NotImplementedError

    assert not exercises.check_cost_eviction(stub)


# ---------------------------------------------------------------- questions with one answer


def test_answer_checks_reject_none_and_wrong_answers():
    assert not exercises.check_tokens_per_round(None)
    assert not exercises.check_tokens_per_round(1 + 0.9 + 0.8 + 0.6 + 0.3)  # not the products
    assert exercises.check_tokens_per_round(
        1 + 0.9 + 0.9 * 0.8 + 0.9 * 0.8 * 0.6 + 0.9 * 0.8 * 0.6 * 0.3
    )
    assert not exercises.check_largest_log_len(15)
    assert not exercises.check_largest_log_len(13)
    assert exercises.check_largest_log_len(14)
    assert not exercises.check_largest_winning_log(None)
    assert not exercises.check_worst_interval(32)
    assert not exercises.check_state_share((0.5, "more"))


@pytest.mark.figures
def test_recompute_break_even_matches_the_explorer():
    from replaylab.teaching.widgets import AcceptanceExplorer

    explorer = AcceptanceExplorer(acceptance=0.5, k=8)
    assert exercises.recompute_speedup(0.5, 8) == pytest.approx(
        explorer.predictions()["recompute"][0]
    )


def test_every_check_records_its_verdict():
    before = len(exercises.results())
    exercises.check_tokens_per_round(None)
    assert exercises.results()[before:] == [("tokens per round with falling acceptance", False)]


# the topic modules of notebooks 01-09 (and 15's roofline), which ``exercises`` re-exports
TOPICS = (
    "memories",
    "scan",
    "branching",
    "snapshot",
    "recompute_replay",
    "kernel",
    "speculation",
    "budgets",
    "measuring",
)


@pytest.mark.parametrize("topic", TOPICS)
def test_exercises_re_exports_every_check_of_the_topic_modules(topic):
    """A notebook calls ``exercises.check_*``: each check of a topic module is reachable there
    as the same object (and listed in ``__all__``), so a new check cannot be left out."""
    module = importlib.import_module(f"replaylab.teaching.exercises_{topic}")
    own = [
        name
        for name, obj in vars(module).items()
        if name.startswith("check_") and getattr(obj, "__module__", None) == module.__name__
    ]
    assert own, topic
    for name in own:
        assert getattr(exercises, name, None) is getattr(module, name), name
        assert name in exercises.__all__, name


# ---------------------------------------------------------------- Triton puzzles

interpreter_only = pytest.mark.skipif(
    not puzzles.interpreting(), reason="traffic is counted only under Triton's interpreter"
)


@interpreter_only
@pytest.mark.parametrize(
    ("key", "name", "check"),
    [
        ("puzzle_copy", "copy_kernel", puzzles.check_copy_kernel),
        ("puzzle_reduce", "reduce_kernel", puzzles.check_reduce_kernel),
        ("puzzle_update", "state_update_kernel", puzzles.check_state_update_kernel),
        ("puzzle_output", "output_kernel", puzzles.check_output_kernel),
        ("puzzle_fold", "fold_kernel", puzzles.check_fold_kernel),
        ("puzzle_log", "log_output_kernel", puzzles.check_log_output_kernel),
    ],
)
def test_puzzle_solutions_pass(tmp_path, key, name, check, capsys):
    kernel = _solution("06_replay_kernel", key, tmp_path)[name]
    assert check(kernel, seed=3)
    out = capsys.readouterr().out
    written = "written 1.00x" if key == "puzzle_update" else "written 0x"  # in place
    assert f"S: read 1.00x (6 tl.load), {written}" in out


_BAD_KERNELS = """
import triton
import triton.language as tl


@triton.jit
def empty(S, x, dt, B, C, A, D, y, H, P: tl.constexpr, N: tl.constexpr):
    pass


@triton.jit
def reads_twice(S, x, dt, B, C, A, D, y, H, P: tl.constexpr, N: tl.constexpr):
    b, h = tl.program_id(0), tl.program_id(1)
    p, n = tl.arange(0, P), tl.arange(0, N)
    row = b * H + h
    tile = (row * P + p[:, None]) * N + n[None, :]
    x_t, C_t = tl.load(x + row * P + p), tl.load(C + row * N + n)
    d_t, a = tl.load(dt + row), tl.load(A + h)
    out = tl.exp(d_t * a) * tl.sum(tl.load(S + tile) * C_t[None, :], axis=1)
    out += 0.0 * tl.sum(tl.load(S + tile), axis=1)  # a second, useless read of the state
    out += d_t * tl.sum(tl.load(B + row * N + n) * C_t) * x_t
    tl.store(y + row * P + p, out + tl.load(D + h) * x_t)


@triton.jit
def writes_state(S, x, dt, B, C, A, D, y, H, P: tl.constexpr, N: tl.constexpr):
    b, h = tl.program_id(0), tl.program_id(1)
    p, n = tl.arange(0, P), tl.arange(0, N)
    row = b * H + h
    tile = (row * P + p[:, None]) * N + n[None, :]
    x_t, B_t, C_t = tl.load(x + row * P + p), tl.load(B + row * N + n), tl.load(C + row * N + n)
    d_t, a = tl.load(dt + row), tl.load(A + h)
    state = tl.exp(d_t * a) * tl.load(S + tile) + (d_t * x_t)[:, None] * B_t[None, :]
    tl.store(S + tile, state)  # the step a replay kernel avoids
    tl.store(y + row * P + p, tl.sum(state * C_t[None, :], axis=1) + tl.load(D + h) * x_t)


@triton.jit
def fold_through_memory(S, log_x, log_dt, log_B, A, out, L, H, P: tl.constexpr, N: tl.constexpr):
    b, h = tl.program_id(0), tl.program_id(1)
    p, n = tl.arange(0, P), tl.arange(0, N)
    tile = ((b * H + h) * P + p[:, None]) * N + n[None, :]
    a = tl.load(A + h)
    tl.store(out + tile, tl.load(S + tile))
    for s in range(L):
        e = (b * L + s) * H + h
        d_s = tl.load(log_dt + e)
        x_s, B_s = tl.load(log_x + e * P + p), tl.load(log_B + e * N + n)
        state = tl.exp(d_s * a) * tl.load(out + tile) + (d_s * x_s)[:, None] * B_s[None, :]
        tl.store(out + tile, state)
"""


@interpreter_only
def test_puzzle_checks_fail_on_stubs_and_on_wasted_traffic(tmp_path, capsys):
    path = tmp_path / "bad_kernels.py"
    path.write_text(_BAD_KERNELS)
    spec = importlib.util.spec_from_file_location("bad_kernels", path)
    bad = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bad)

    assert not puzzles.check_output_kernel(bad.empty)
    assert "NaN left" in capsys.readouterr().out
    # right values, wrong traffic: each of these fails on the count alone
    assert not puzzles.check_output_kernel(bad.reads_twice)
    out = capsys.readouterr().out
    assert "checkpoint S: read 2.00x" in out and "read exactly once" in out
    assert not puzzles.check_output_kernel(bad.writes_state)
    assert "no state is written" in capsys.readouterr().out
    assert not puzzles.check_fold_kernel(bad.fold_through_memory)
    out = capsys.readouterr().out
    assert "folded state out: read 5.00x" in out and "written 6.00x" in out


@interpreter_only
def test_count_traffic_ignores_masked_lanes_and_restores_the_interpreter(tmp_path):
    path = tmp_path / "masked.py"
    path.write_text(
        "import triton\nimport triton.language as tl\n\n\n@triton.jit\n"
        "def half(src, dst, n):\n"
        "    i = tl.arange(0, 8)\n"
        "    tl.store(dst + i, tl.load(src + i, mask=i < n, other=0.0), mask=i < n)\n"
    )
    spec = importlib.util.spec_from_file_location("masked", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    src, dst = torch.randn(8), torch.zeros(8)
    with puzzles.count_traffic(src=src, dst=dst) as traffic:
        module.half[(1,)](src, dst, 4)
    assert traffic.read["src"] == 4 * 4 and traffic.written["dst"] == 4 * 4
    assert traffic.times_read("src") == 0.5 and traffic.unknown == 0
    from triton.runtime import interpreter

    assert "create_masked_load" not in vars(interpreter.interpreter_builder)
    assert "binary_op" not in vars(interpreter.interpreter_builder)


def test_count_traffic_refuses_without_the_interpreter(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    with pytest.raises(RuntimeError, match="interpreter is off"):
        with puzzles.count_traffic(x=torch.zeros(1)):
            pass


@interpreter_only
def test_a_kernel_that_raises_is_reported_not_raised(tmp_path, capsys):
    path = tmp_path / "broken.py"
    path.write_text(
        "import triton\nimport triton.language as tl\n\n\n@triton.jit\n"
        "def broken(S, x, dt, B, C, A, D, y, H, P: tl.constexpr, N: tl.constexpr):\n"
        "    tl.store(y + tl.arange(0, P), tl.load(S + tl.arange(0, 3)))\n"
    )
    spec = importlib.util.spec_from_file_location("broken", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert not puzzles.check_output_kernel(module.broken)
    out = capsys.readouterr().out
    assert "the kernel could not run: your code raised" in out and "line 7 of broken" in out
    from triton.runtime import interpreter

    assert "create_masked_load" not in vars(interpreter.interpreter_builder)
    assert "binary_op" not in vars(interpreter.interpreter_builder)
