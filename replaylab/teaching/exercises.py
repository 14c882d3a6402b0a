"""Checks for the exercises of notebooks 01-09 (and 15's roofline question), one module per
notebook topic, re-exported here so a notebook calls ``exercises.check_*`` whichever module
holds it. Each ``check_*`` takes the learner's answer (a value, a function or a class),
compares it with the library on fixed or random inputs, prints a verdict (``PASS ...`` /
``FAIL ...`` with the first mismatch; notebooks 01-02 print ``correct:`` / ``not yet:``),
records it (``results()``) and returns True or False. A stub that returns None, is left as
None or raises NotImplementedError is reported as not done; any other exception raised by the
learner's code (or by reading the answer) is reported as ``FAIL name: ...`` naming the
exception and the learner's line (``grading.guarded``). No check raises, so an unfinished or
broken notebook still runs to the end.

Modules:
    exercises_common            verdict lines, the first-mismatch comparison, one-answer
                                questions; ``ScanInputs`` and ``MiniLayer`` (one Mamba-2
                                layer's recurrence, for the mini stores of notebooks 03-05)
    exercises_memories          01  conv-state bytes, KV truncation
    exercises_scan              02  the SSD step, resuming from a checkpoint
    exercises_branching         03  the mini snapshot store, strategies at acceptance 0
    exercises_snapshot          04  cost-aware eviction, snapshot bytes, budgets
    exercises_recompute_replay  05  the mini recompute store and replay log
    exercises_kernel            06  the replay kernel's log length (measured, cost model)
    exercises_speculation       07  recompute's break-even, tokens per round
    exercises_budgets           08  intervals against the optimum, eviction, beam search
    exercises_measuring         09, 15  the state's share of memory, the roofline floor
    solutions                   ``solution_sections``, ``exercise_cells`` (the double run)

Triton puzzles (notebook 06) live in ``replaylab.teaching.puzzles`` and record in ``grading``
too.
"""

from __future__ import annotations

from replaylab.teaching.exercises_branching import (
    check_interval_effect,
    check_rollback_work,
    check_snapshot_store,
)
from replaylab.teaching.exercises_budgets import (
    check_beam_log_length,
    check_cost_eviction_scenario,
    check_worst_interval,
)
from replaylab.teaching.exercises_common import MiniLayer, ScanInputs, mini_layer
from replaylab.teaching.exercises_kernel import (
    check_best_log_length,
    check_largest_log_len,
    check_largest_winning_log,
)
from replaylab.teaching.exercises_measuring import (
    check_recompute_at_acceptance,
    check_roofline_floor,
    check_state_share,
    roofline_floor_ms,
)
from replaylab.teaching.exercises_memories import check_conv_state_bytes, check_kv_truncate
from replaylab.teaching.exercises_recompute_replay import (
    check_recompute_store,
    check_replay_log,
    check_zero_rerun_distances,
)
from replaylab.teaching.exercises_scan import check_resume, check_ssd_step
from replaylab.teaching.exercises_snapshot import (
    check_cost_eviction,
    check_rerun_at_high_acceptance,
    check_snapshot_copy_bytes,
)
from replaylab.teaching.exercises_speculation import (
    check_recompute_break_even,
    check_tokens_per_round,
    recompute_speedup,
)
from replaylab.teaching.grading import record, results
from replaylab.teaching.kernel_harness import kernel_device
from replaylab.teaching.solutions import EXERCISE_KEY, exercise_cells, solution_sections

__all__ = [
    "record",
    "results",
    "ScanInputs",
    "MiniLayer",
    "mini_layer",
    "check_conv_state_bytes",
    "check_kv_truncate",
    "check_ssd_step",
    "check_resume",
    "check_snapshot_store",
    "check_recompute_store",
    "check_replay_log",
    "check_cost_eviction",
    "check_rollback_work",
    "check_interval_effect",
    "check_snapshot_copy_bytes",
    "check_rerun_at_high_acceptance",
    "recompute_speedup",
    "check_zero_rerun_distances",
    "check_largest_winning_log",
    "check_largest_log_len",
    "kernel_device",
    "check_recompute_break_even",
    "check_tokens_per_round",
    "check_worst_interval",
    "check_cost_eviction_scenario",
    "check_state_share",
    "check_recompute_at_acceptance",
    "check_best_log_length",
    "check_beam_log_length",
    "roofline_floor_ms",
    "check_roofline_floor",
    "EXERCISE_KEY",
    "solution_sections",
    "exercise_cells",
]
