"""The notebooks' support code: what a learner runs beside the library, never what the library
runs. Nothing outside this package imports it (``tests/test_architecture.py`` checks), and
only this package imports plotly and ipywidgets.

Modules, from the bottom up (each imports only those above it in this list, or the library):
    grading             the record of verdicts, PASS / FAIL lines, the guard around learner code
    kernel_harness      launching a learner's Triton kernel: interpreter or GPU, traffic counts,
                        the verdict of a kernel check
    experiments         live measurements the notebooks run (strategies compared, budgets)
    plotting, diagrams  plotly figures of committed results; access and memory diagrams
    widgets             the explorers (ipywidgets + plotly)
    timeline            the call-by-call timeline of one speculative round (notebook 03)
    solutions           ``solution_sections``, ``exercise_cells`` (the solutions / stubs run)
    exercises_common    what the checks of 01-09 share: verdicts, the first mismatch,
                        ``ScanInputs`` and ``MiniLayer`` (the mini stores' layer)
    exercises_memories, exercises_scan, exercises_branching, exercises_snapshot,
    exercises_recompute_replay, exercises_kernel, exercises_speculation, exercises_budgets,
    exercises_measuring
                        the checks of notebooks 01, 02, 03, 04, 05, 06, 07, 08 and 09 (+ 15)
    exercises           re-exports them all: a notebook calls ``exercises.check_*``
    exercises_families, exercises_text, exercises_serving, exercises_prefix
                        the checks of notebooks 11, 10, 13 and 14
    puzzles             the Triton puzzles of notebook 06
    plotting_serving, plotting_prefix
                        notebook 13's and 14's figures; 14's block-size / budget explorer
    quiz                the recap quiz of notebook 12, graded by computed answers
"""
