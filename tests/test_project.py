"""The project's set-up: environment.yml agrees with pyproject, kernels ship as
replaylab.kernels, the interpreter is on without a GPU, and the notebook helpers work."""

import json
import os
import pathlib
import re
import subprocess
import sys
import tomllib

import pytest
import torch
import yaml

import replaylab
from replaylab.scan import ssd_scan, ssd_step
from replaylab.shapes import PUBLISHED_SHAPES, memory_per_sequence, snapshot_in_kv_tokens
from replaylab.teaching import exercises

ROOT = pathlib.Path(__file__).resolve().parents[1]


def test_environment_yml_agrees_with_pyproject_and_run_sh():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    env = yaml.safe_load((ROOT / "environment.yml").read_text())
    pip = next(d["pip"] for d in env["dependencies"] if isinstance(d, dict))
    editable = next(p for p in pip if p.startswith("-e"))
    extras = set(re.search(r"\[(.*)\]", editable).group(1).split(","))
    assert extras == set(project["project"]["optional-dependencies"])
    torch_pin = next(p for p in pip if p.startswith("torch"))
    assert f"TORCH_DEFAULT={torch_pin}\n" in (ROOT / "run.sh").read_text()
    python = next(d for d in env["dependencies"] if isinstance(d, str) and d.startswith("python="))
    assert project["project"]["requires-python"] == ">=3.11" and python >= "python=3.11"
    assert "-r requirements.lock" in pip


def test_kernels_ship_inside_the_package():
    import replaylab.kernels.mamba2

    assert pathlib.Path(replaylab.kernels.mamba2.__file__).resolve().parent == ROOT / "kernels"
    link = ROOT / "replaylab" / "kernels"
    assert link.is_symlink() and link.resolve() == ROOT / "kernels"
    tool = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    assert "replaylab.kernels" in tool["packages"] and "kernels" not in tool["packages"]
    assert "package-dir" not in tool


def test_every_folder_of_modules_ships_in_the_wheel():
    """pyproject lists the packages by hand: a new subpackage must be listed, or the wheel lacks
    it while the editable install (which reads the source tree) hides the gap."""
    tool = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    folders = {
        ".".join(path.parent.relative_to(ROOT).parts)
        for path in (ROOT / "replaylab").rglob("*.py")
        if "__pycache__" not in path.parts
    }
    assert folders <= set(tool["packages"]), sorted(folders - set(tool["packages"]))


def _root_import_names():
    """Names that ``import NAME`` would find as a module or regular package in the checkout's
    root, which `python -m pytest` and `python -m replaylab` put first on sys.path."""
    names = set()
    for entry in ROOT.iterdir():
        if entry.name.startswith(".") or entry.name == "build":
            continue
        if entry.suffix == ".py" or entry.suffix == ".so":
            names.add(entry.name.split(".")[0])
        elif entry.is_dir() and (entry / "__init__.py").exists():
            names.add(entry.name)
    return names


def test_no_top_level_name_in_the_checkout_shadows_an_installed_distribution():
    import importlib.metadata

    installed = importlib.metadata.packages_distributions()
    names = _root_import_names()
    assert "replaylab" in names  # the scan sees regular packages
    assert not (ROOT / "kernels" / "__init__.py").exists()  # a namespace portion, never first
    clashes = {n: installed[n] for n in names if n in installed and n != "replaylab"}
    assert not clashes, f"the checkout's root shadows installed distributions: {clashes}"
    # transformers >= 5.25 imports the `kernels` distribution: from the root it must be that one
    code = "import kernels; print(getattr(kernels, '__file__', None))"
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    if "kernels" in installed:  # the distribution's own file, wherever it was installed
        dist = importlib.metadata.distribution(installed["kernels"][0])
        want = pathlib.Path(dist.locate_file("kernels/__init__.py")).resolve()
        assert out.returncode == 0, out.stderr
        assert pathlib.Path(out.stdout.strip()).resolve() == want, (out.stdout, want)
    else:  # at most the namespace portion, which holds no code of its own
        assert out.returncode == 0 and out.stdout.strip() == "None", out.stdout + out.stderr


def test_python_m_replaylab_generate_runs_from_the_checkout_root():
    """`python -m replaylab` from the root puts the root first on sys.path, as a user would."""
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "replaylab",
            "generate",
            "data/models/replaylab-code-10m",
            "--prompt",
            "def add(a, b):",
            "--max-new-tokens",
            "4",
            "--json",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert len(json.loads(out.stdout)["tokens"]) == 4


def test_triton_interpreter_is_on_without_a_gpu():
    if not torch.cuda.is_available():
        assert os.environ.get("TRITON_INTERPRET") == "1"


def test_the_interpreter_skips_the_work_it_would_throw_away():
    """``import replaylab`` turns off the interpreter's int32 overflow checks, whose asserts
    it drops anyway (no debug), and patches triton.language once a launch for each module
    instead of at every device-function call (replaylab/_interpreter.py). CI's time budget
    counts on both; a triton that moves these parts would make CI slow, not wrong: this says
    why."""
    if os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("compiled kernels: the interpreter plays no part")
    from triton.runtime import interpreter

    assert not interpreter.interpreter_builder.options.debug
    assert not interpreter.interpreter_builder.options.sanitize_overflow
    assert getattr(interpreter._patch_lang, "once_a_launch", False)


def test_published_shape_memory_by_hand():
    nemo = PUBLISHED_SHAPES["Nemotron-H 8B"]
    m = memory_per_sequence(nemo, 1000)
    assert m["ssm_state"] == 24 * 128 * 64 * 128 * 4  # 96 MiB of fp32 state
    assert m["kv"] == 1000 * 4 * 2 * 8 * 128 * 2
    assert m["conv_state"] == 24 * (128 * 64 + 2 * 8 * 128) * 3 * 2
    jamba = PUBLISHED_SHAPES["Jamba v0.1"]
    assert memory_per_sequence(jamba, 1)["ssm_state"] == 28 * 8192 * 16 * 4
    assert 6000 < snapshot_in_kv_tokens(nemo) < 6500


def test_exercise_checks_accept_right_and_reject_wrong_answers(capsys):
    nemo = PUBLISHED_SHAPES["Nemotron-H 8B"]
    assert exercises.check_conv_state_bytes(nemo.n_ssm * nemo.conv_channels * 3 * 2)
    assert not exercises.check_conv_state_bytes(123)
    assert not exercises.check_conv_state_bytes(None)
    assert exercises.check_kv_truncate(lambda k, p: k[:, :, :p])
    assert not exercises.check_kv_truncate(lambda k, p: k[:, :, : p - 1])
    assert exercises.check_ssd_step(lambda s, x, dt, A, B, C, D: ssd_step(s, x, dt, A, B, C, D))
    assert not exercises.check_ssd_step(lambda s, x, dt, A, B, C, D: ssd_step(s, x, dt, A, B, C))
    assert exercises.check_resume(
        lambda s, x, dt, A, B, C: ssd_scan(x, dt, A, B, C, initial_state=s).y
    )
    assert not exercises.check_resume(lambda s, x, dt, A, B, C: ssd_scan(x, dt, A, B, C).y)
    assert "not yet" in capsys.readouterr().out


@pytest.mark.figures
def test_memory_figure_has_a_kv_and_a_state_line_per_model():
    from replaylab.teaching.plotting import memory_vs_context_figure

    fig = memory_vs_context_figure([1024, 4096])
    assert len(fig.data) == 2 * len(PUBLISHED_SHAPES)
    kv = fig.data[0].y
    assert kv[1] == 4 * kv[0]  # KV grows linearly with the context
    assert fig.data[1].y[0] == fig.data[1].y[1]  # the state does not


def test_version():
    assert replaylab.__version__ == "0.1.0"


def test_readme_library_examples_run():
    text = (ROOT / "README.md").read_text()
    example = re.search(r"## The library in 20 lines\n\n```python\n(.*?)```", text, re.S).group(1)
    assert len(example.strip().splitlines()) <= 22
    exec(compile(example, "README.md", "exec"), {})
    branching = re.search(r"## Branching with one cache API\n\n```python\n(.*?)```", text, re.S)
    exec(compile(branching.group(1), "README.md", "exec"), {})


@pytest.mark.figures
def test_committed_kernel_benchmark_has_provenance_and_plots():
    from replaylab.teaching.plotting import (
        fold_vs_copy_figure,
        kernel_bandwidth_figure,
        kernel_time_vs_batch_figure,
        load_bench,
    )

    bench = load_bench()
    assert "H200" in bench["device"] and bench["date"] and bench["command"].startswith("python -m")
    assert bench["versions"]["mamba_ssm"] == "2.3.2.post1" and not bench["peer_errors"]
    fig = kernel_time_vs_batch_figure(bench, T=1, log_len=16)
    ours = fig.data[0]
    assert list(ours.x) == [1, 8, 32, 64, 128] and all(y > 0 for y in ours.y)
    assert len(kernel_bandwidth_figure(bench).data) == 5
    assert len(fold_vs_copy_figure(bench).data) == 5


@pytest.mark.figures
def test_committed_decode_benchmark_has_provenance_and_plots():
    from replaylab.teaching.plotting import (
        branching_workloads_figure,
        decode_throughput_figure,
        load_bench,
    )

    bench = load_bench("data/bench_decode.json")
    assert "H200" in bench["device"] and bench["date"] and not bench["errors"]
    assert "assisted generation is not supported" in bench["assisted_generation_refusal"]
    fig = decode_throughput_figure(bench)
    assert {t.name for t in fig.data} == {
        "replaylab snapshot",
        "replaylab recompute",
        "replaylab replay",
        "transformers generate",
    }
    assert len(branching_workloads_figure(bench).data) == 3


def _ruff_path():
    import shutil
    import sys

    beside = pathlib.Path(sys.executable).parent / "ruff"
    return shutil.which("ruff") or (str(beside) if beside.exists() else None)


def _ruff(*args):
    import subprocess

    return subprocess.run([_ruff_path(), *args], cwd=ROOT, capture_output=True, text=True)


@pytest.mark.skipif(
    _ruff_path() is None, reason="ruff is not installed here (the setup installs it; CI runs it)"
)
def test_ruff_lint_and_format_are_clean():
    lint = _ruff("check", ".")
    assert lint.returncode == 0, lint.stdout[-3000:]
    fmt = _ruff("format", "--check", ".")
    assert fmt.returncode == 0, fmt.stdout[-3000:]


def test_notebooks_carry_no_widget_views_or_widget_state():
    import subprocess
    import sys

    notebooks = sorted(str(p) for p in (ROOT / "notebooks").glob("*.ipynb"))
    out = subprocess.run(
        [sys.executable, str(ROOT / "tools" / "notebook_hygiene.py"), "--check", *notebooks],
        capture_output=True,
        text=True,
    )
    assert out.returncode == 0, out.stdout


def test_the_checkout_guard_sees_every_kind_of_change(tmp_path):
    """conftest's guard compares fingerprints of the checkout before and after the suite: a
    modified, a deleted and a new untracked file each show; an ignored file does not."""
    import subprocess

    from checkout_guard import changed_files, fingerprint

    def git(*args):
        subprocess.run(["git", *args], cwd=tmp_path, check=True, capture_output=True)

    git("init", "-q")
    (tmp_path / ".gitignore").write_text("ignored/\n")
    for name in ("kept.txt", "edited.txt", "deleted.txt"):
        (tmp_path / name).write_text(name)
    git("add", ".")
    before = fingerprint(tmp_path)
    assert changed_files(before, fingerprint(tmp_path)) == []
    (tmp_path / "edited.txt").write_text("changed")
    (tmp_path / "deleted.txt").unlink()
    (tmp_path / "new.txt").write_text("new")
    (tmp_path / "ignored").mkdir()
    (tmp_path / "ignored" / "out.txt").write_text("build output")
    assert changed_files(before, fingerprint(tmp_path)) == ["deleted.txt", "edited.txt", "new.txt"]
    import tempfile

    with tempfile.TemporaryDirectory() as elsewhere:  # not a git work tree
        assert fingerprint(elsewhere) is None
