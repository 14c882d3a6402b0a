"""The library's seams: the recurrent-layer spec, the store interface and registry, the cache
built from specs (no model inside), imports without the notebook extras, the import graph (the
library never imports the teaching package; no cycles), and the commands."""

import ast
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from torch import nn

from replaylab import costmodel as cm
from replaylab.cache import CacheConfig, CacheSpec, HybridCache
from replaylab.decoding import SyntheticDrafter, greedy, speculative
from replaylab.recurrent import LayerState, RecurrentSpec
from replaylab.scan import ScanResult
from replaylab.strategies import (
    REGISTRY,
    STRATEGY_NAMES,
    Rollback,
    StateStore,
    register,
    store_class,
)
from replaylab.strategies.current import CurrentStateStore

CORE = [
    "replaylab",
    "replaylab.scan",
    "replaylab.model",
    "replaylab.cache",
    "replaylab.strategies",
    "replaylab.decoding",
    "replaylab.costmodel",
    "replaylab.kernels.mamba2",
    "replaylab.kernels.mamba1",
    "replaylab.kernels.gdn",
    "replaylab.bench.gdn_kernels",
    "replaylab.generate",
    "replaylab.cli",
    "replaylab.bench.cli",
]


def test_core_modules_import_without_the_notebook_extras():
    blocker = textwrap.dedent(f"""
        import importlib.abc, sys
        class Hide(importlib.abc.MetaPathFinder):
            def find_spec(self, name, path, target=None):
                if name.split(".")[0] in ("plotly", "ipywidgets", "jupyter", "jupyterlab",
                                          "anywidget", "IPython", "nbformat"):
                    raise ImportError("hidden by the test: " + name)
        sys.meta_path.insert(0, Hide())
        for name in {CORE!r}:
            __import__(name)
        import replaylab.costmodel as cm
        assert cm.HARDWARE["H200"].bandwidth > 0
        print("ok")
    """)
    out = subprocess.run([sys.executable, "-c", blocker], capture_output=True, text=True)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-2000:]


# --------------------------------------------------------------------------------------------
# The import graph, read from the source with ast (nothing is imported)

REPO = Path(__file__).resolve().parents[1]
# where each package's files live (replaylab/kernels links to the top-level kernels/)
PACKAGE_DIRS = {"replaylab": REPO / "replaylab", "replaylab.kernels": REPO / "kernels"}
# deferred imports that close a cycle on purpose, each with its reason (none: the import graph,
# deferred imports counted, has no cycle)
ALLOWED_DEFERRED: set[tuple[str, str]] = set()


def package_modules(dirs=None) -> dict[str, Path]:
    """Every module of the package: dotted name -> its file (a package by its __init__.py)."""
    modules = {}
    for package, folder in (dirs or PACKAGE_DIRS).items():
        for path in sorted(folder.rglob("*.py")):
            rel = path.relative_to(folder)
            if any((folder / part).is_symlink() for part in rel.parts[:1]):
                continue  # replaylab/kernels links to kernels/, walked as itself
            parts = [package, *rel.with_suffix("").parts]
            if parts[-1] == "__init__":
                parts.pop()
            modules[".".join(parts)] = path
    return modules


def import_edges(modules: dict[str, Path]) -> list[tuple[str, str, bool]]:
    """(importer, imported, deferred) for every import of one of ``modules`` by another;
    deferred: the import sits inside a function (it runs when the function is called)."""

    def known(name):  # a.b.c -> the longest of a.b.c, a.b, a that is one of the modules
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name

    edges = set()
    for module, path in modules.items():
        tree = ast.parse(path.read_text(), filename=str(path))
        deferred_nodes = {
            id(inner)
            for node in ast.walk(tree)
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
            for inner in ast.walk(node)
        }
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                targets = [known(alias.name) for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                # `from a import b`: the module a.b if b is one, else a
                targets = [known(f"{node.module}.{alias.name}") for alias in node.names]
            else:
                continue
            for target in targets:
                if target and target != module:
                    edges.add((module, target, id(node) in deferred_nodes))
    return sorted(edges)


def find_cycle(edges) -> list[str] | None:
    """One cycle of the directed graph ``edges`` ((a, b) pairs) as [a, b, ..., a], or None."""
    graph: dict[str, list[str]] = {}
    for a, b in edges:
        graph.setdefault(a, []).append(b)
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node):
        state[node] = 1
        path.append(node)
        for nxt in graph.get(node, ()):
            if state.get(nxt) == 1:
                return path[path.index(nxt) :] + [nxt]
            if nxt not in state and (cycle := visit(nxt)):
                return cycle
        path.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (cycle := visit(node)):
            return cycle
    return None


@pytest.fixture(scope="module")
def edges():
    modules = package_modules()
    assert {"replaylab.cache", "replaylab.teaching.exercises", "replaylab.kernels.mamba2"} <= set(
        modules
    ), sorted(modules)
    return import_edges(modules)


def test_only_the_teaching_package_imports_it(edges):
    def teaching(name):
        return name == "replaylab.teaching" or name.startswith("replaylab.teaching.")

    wrong = [(a, b) for a, b, _ in edges if teaching(b) and not teaching(a)]
    assert edges and not wrong, f"library modules importing replaylab.teaching: {wrong}"


def test_the_package_has_no_import_cycle(edges):
    top = [(a, b) for a, b, deferred in edges if not deferred]
    assert find_cycle(top) is None, f"module-level import cycle: {' -> '.join(find_cycle(top))}"
    # an import deferred into a function hides a cycle from Python, not from the reader (the
    # teaching package's old exercises -> puzzles -> exercises was one)
    every = [(a, b) for a, b, _ in edges if (a, b) not in ALLOWED_DEFERRED]
    cycle = find_cycle(every)
    assert cycle is None, f"import cycle through a deferred import: {' -> '.join(cycle)}"


def test_the_cycle_finder_finds_a_deferred_cycle(tmp_path):
    """The graph above is acyclic, so the check is shown failing on a package that is not: the
    shape the teaching modules had (a module-level import one way, a deferred one back)."""
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text("")
    (tmp_path / "pkg" / "exercises.py").write_text(
        "def kernel_device():\n    from pkg.puzzles import interpreting\n"
    )
    (tmp_path / "pkg" / "puzzles.py").write_text("from pkg.exercises import record\n")
    found = import_edges(package_modules({"pkg": tmp_path / "pkg"}))
    assert ("pkg.puzzles", "pkg.exercises", False) in found
    assert ("pkg.exercises", "pkg.puzzles", True) in found
    assert find_cycle([(a, b) for a, b, deferred in found if not deferred]) is None
    assert find_cycle([(a, b) for a, b, _ in found]) in (
        ["pkg.exercises", "pkg.puzzles", "pkg.exercises"],
        ["pkg.puzzles", "pkg.exercises", "pkg.puzzles"],
    )


def test_tools_import_only_public_names_of_the_library():
    """tools/ calls the library through its public functions: no ``from replaylab... import
    _name``, and no ``module._name`` of a replaylab module the tool imported."""
    private = []
    for path in sorted((REPO / "tools").glob("*.py")):
        tree = ast.parse(path.read_text(), filename=str(path))
        modules = set()  # names bound to replaylab modules (or to names imported from them)
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("replaylab"):
                names = [alias.name for alias in node.names]
                private += [f"{path.name}: {n}" for n in names if n.startswith("_")]
                modules |= {alias.asname or alias.name for alias in node.names}
            elif isinstance(node, ast.Import):
                modules |= {
                    a.asname for a in node.names if a.name.startswith("replaylab.") and a.asname
                }
        for node in ast.walk(tree):
            if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
                    and node.value.id in modules and node.attr.startswith("_")
                    and not node.attr.startswith("__")):  # fmt: skip
                private.append(f"{path.name}:{node.lineno}: {node.value.id}.{node.attr}")
    assert not private, f"tools/ using private names of replaylab: {private}"


class DecaySpec(RecurrentSpec):
    """A layer family with no weights at all: h_t = a_t h_{t-1} + u_t (elementwise, D
    channels), y_t = h_t; the conv window keeps the last input. Stores must serve it through
    this spec alone."""

    family, log_fields, conv_field = "decay", ("u", "a"), "u"

    def __init__(self, channels):
        self.state_shape, self.conv_shape = (channels,), (1, channels)

    def params(self):
        return None

    def prepare(self, window, inputs):
        return dict(u=inputs["u"], a=torch.sigmoid(inputs["g"]))

    def scan(self, state, entries, return_states=False):
        states = []
        for t in range(entries["u"].shape[1]):
            state = entries["a"][:, t] * state + entries["u"][:, t]
            states.append(state)
        stacked = torch.stack(states, 1)
        return ScanResult(stacked, state, stacked if return_states else None)


class DecayModel:
    """A 'model' of two decay layers (3 and 5 channels) whose inputs are looked up per token
    id in fixed random tables; its forward is the cache's rerun callback."""

    def __init__(self, vocab=11):
        g = torch.Generator().manual_seed(0)
        self.tables = {
            l: (
                torch.randn(vocab, d, generator=g, dtype=torch.float64),
                torch.randn(vocab, d, generator=g, dtype=torch.float64),
            )
            for l, d in ((0, 3), (2, 5))
        }

    def cache_spec(self):
        return CacheSpec(
            recurrent={0: DecaySpec(3), 2: DecaySpec(5)},
            attention={},
            dtype=torch.float64,
            device=torch.device("cpu"),
            rerun=self.forward,
        )

    def forward(self, ids, cache):
        cache.begin(ids)
        for layer, (u, gate) in self.tables.items():
            cache.layer(layer).advance(u=u[ids], g=gate[ids])
        cache.end()

    def by_hand(self, ids, layer):
        """The recurrence written out: h_t = sigmoid(g_t) h_{t-1} + u_t."""
        u, gate = self.tables[layer]
        h = torch.zeros(ids.shape[0], u.shape[1], dtype=torch.float64)
        for t in range(ids.shape[1]):
            h = torch.sigmoid(gate[ids[:, t]]) * h + u[ids[:, t]]
        return h


@pytest.mark.parametrize("strategy", STRATEGY_NAMES)
def test_a_new_layer_family_needs_only_its_spec(strategy):
    model = DecayModel()
    cache = HybridCache(model, 2, strategy, checkpoint_interval=3, log_length=3)
    ids = torch.randint(0, 11, (2, 12), generator=torch.Generator().manual_seed(1))
    model.forward(ids[:, :4], cache)
    handle = cache.snapshot()
    for t in range(4, 12, 2):
        model.forward(ids[:, t : t + 2], cache)
    for layer in (0, 2):
        assert torch.allclose(cache.state(layer).ssm, model.by_hand(ids, layer), rtol=1e-12)
        assert torch.equal(cache.state(layer).conv[:, 0], model.tables[layer][0][ids[:, -1]])
    cache.restore(handle)
    for layer in (0, 2):
        assert torch.allclose(cache.state(layer).ssm, model.by_hand(ids[:, :4], layer))
    if strategy != "snapshot":  # snapshot keeps only the handle's position
        cache.truncate_to(2)
    cache.reorder(torch.tensor([1, 1, 0]))
    p = cache.position
    want = model.by_hand(ids[[1, 1, 0], :p], 2)
    assert torch.allclose(cache.state(2).ssm, want, rtol=1e-12)


def test_the_cache_holds_no_model_and_no_store_holds_a_weight(tiny_model):
    cache = HybridCache(tiny_model, 2, "replay")
    with torch.no_grad():
        tiny_model(torch.randint(0, 50, (2, 5)), cache)
    for obj in (cache, cache.ssm):
        for name, value in vars(obj).items():
            assert not isinstance(value, nn.Module), name
            assert not isinstance(value, nn.Parameter), name
    assert set(cache.ssm.specs) == set(tiny_model.cfg.ssm_layers)


class RerunStore(CurrentStateStore):
    """Keeps nothing but the current state: every rollback re-runs from the start."""

    name = "rerun-from-start"
    rerun_is_fallback = False

    def rollback(self, position, handle_id=None):
        self._zero()
        return Rollback(0)

    def select(self, indices):
        self._gather(indices)

    def nbytes(self):
        return self.current_bytes()


def test_a_new_strategy_is_one_class_and_the_registry(tiny_model):
    register(RerunStore)
    try:
        assert store_class("rerun-from-start") is RerunStore
        prompt = torch.tensor([[3, 7, 1, 3, 7]])
        ref = greedy(tiny_model, prompt, 12, "snapshot")
        full = torch.cat([prompt, ref.tokens], 1)
        run = speculative(
            tiny_model, prompt, 12, SyntheticDrafter(full, 0.5), k=3, cache="rerun-from-start"
        )
        assert torch.equal(run.tokens, ref.tokens)
        assert run.restores > 0 and run.recomputed_tokens > 0
    finally:
        REGISTRY.pop("rerun-from-start")
    with pytest.raises(ValueError, match=r"already registered"):
        register(store_class("replay"))


def test_every_registered_store_implements_the_interface():
    assert STRATEGY_NAMES == ("snapshot", "recompute", "replay")
    for name in STRATEGY_NAMES:
        cls = store_class(name)
        assert issubclass(cls, StateStore) and cls.name == name and not cls.__abstractmethods__


def test_cache_config_refuses_bad_values():
    for bad, message in [
        (
            dict(strategy="copy"),
            r"strategy: expected one of \['recompute', "
            r"'replay', 'snapshot'\], got 'copy'",
        ),
        (
            dict(checkpoint_interval=0),
            r"checkpoint_interval: expected 1 <= checkpoint_interval, got 0",
        ),
        (dict(budget_bytes=0), r"budget_bytes: expected a number of bytes > 0, got 0"),
        (dict(eviction="fifo"), r"eviction: expected one of"),
        # an integer state dtype built a cache that no forward could advance
        (
            dict(dtype=torch.int64),
            r"dtype: expected a floating-point dtype for the state, got torch.int64",
        ),
    ]:
        with pytest.raises(ValueError, match=message):
            CacheConfig(**bad)
    for bad, message in [  # "yes" was taken; "float16" failed deep inside the KV store
        (dict(use_kernels="yes"), r"use_kernels: expected None, True or False, got 'yes'"),
        (dict(dtype="float16"), r"dtype: expected a torch.dtype .* got str 'float16'"),
    ]:
        with pytest.raises(TypeError, match=message):
            CacheConfig(**bad)
    empty = CacheSpec({}, {}, torch.float32, torch.device("cpu"), rerun=lambda ids, cache: None)
    with pytest.raises(ValueError, match=r"batch: expected 1 <= batch, got 0"):
        HybridCache(empty, 0)
    with pytest.raises(TypeError, match=r"batch: expected an integer, got float 2.5"):
        HybridCache(empty, 2.5)
    with pytest.raises(TypeError, match=r"log_length: expected an integer, got float 2.5"):
        CacheConfig(log_length=2.5)
    with pytest.raises(TypeError, match=r"rerun: expected a callable"):
        CacheSpec({}, {}, torch.float32, torch.device("cpu"), rerun=None)


def test_layer_state_helpers():
    s = LayerState(torch.arange(6.0).view(3, 2), torch.zeros(3, 1, 4))
    assert s.nbytes() == 6 * 4 + 12 * 4
    assert torch.equal(s.index(torch.tensor([2, 0])).ssm, torch.tensor([[4.0, 5.0], [0.0, 1.0]]))


def test_the_cost_model_refuses_unknown_strategies_and_providers():
    from replaylab.costmodel import kernel_bytes
    from replaylab.model import HybridConfig

    shape = cm.shape_from_config(HybridConfig())
    m = cm.model_costs(shape, cm.Workload(), 1e6)
    with pytest.raises(ValueError, match=r"strategy: the cost model knows"):
        cm.bytes_held(m, "copy")
    assert kernel_bytes("copy", 2, 4, 1, H=2, P=3, N=4, G=1) == 2 * 2 * 2 * 3 * 4 * 4
    with pytest.raises(ValueError, match=r"provider: expected one of"):
        kernel_bytes("magic", 2, 4, 1, H=2, P=3, N=4, G=1)


def test_measure_hardware_on_cpu_gives_plausible_rates():
    hw = cm.measure_hardware("cpu")
    assert 1e8 < hw.bandwidth < 1e13 and 1e8 < hw.matmul_rate < 1e14


def run(*args):
    return subprocess.run(
        [sys.executable, "-m", "replaylab", *args], capture_output=True, text=True
    )


def help_text(capsys, *args):
    """The command's help for ``args``, from its parser in this process (the command itself
    runs as a subprocess once, in ``--version``'s check)."""
    from replaylab.cli import main

    with pytest.raises(SystemExit) as exit_:
        main([*args, "--help"])
    assert exit_.value.code == 0
    return capsys.readouterr().out


def test_the_command_lists_its_subcommands_and_version(capsys):
    import replaylab

    assert run("--version").stdout.strip() == f"replaylab {replaylab.__version__}"
    top = help_text(capsys)
    assert "generate" in top and "bench" in top
    bench = help_text(capsys, "bench")
    assert all(name in bench for name in ("kernels", "sweep", "decode", "engine"))
    assert "--log-length" in help_text(capsys, "generate")
    if not torch.cuda.is_available():  # on a GPU this would run (and write) the benchmark
        missing = run("bench", "kernels", "--out", os.devnull)
        assert missing.returncode != 0 and "no CUDA device" in missing.stderr


def test_the_package_docstring_lists_every_module_and_no_other():
    """``replaylab``'s docstring is the map a reader opens first (``help(replaylab)``): each
    top-level module or package appears in its table, and each name it lists exists."""
    import pkgutil
    import re

    import replaylab

    modules = {m.name for m in pkgutil.iter_modules(replaylab.__path__) if m.name[0] != "_"}
    modules.add("kernels")  # a namespace folder, which iter_modules skips
    table = replaylab.__doc__.split("Modules", 1)[1]
    listed = set()
    for line in table.splitlines():
        names = re.match(r"    ((?:\w+, )*\w+)  ", line)
        if names:
            listed.update(names.group(1).split(", "))
    assert listed == modules, (sorted(modules - listed), sorted(listed - modules))
