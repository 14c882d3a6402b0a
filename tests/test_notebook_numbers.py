"""Every number with a unit or a ratio in a notebook's text comes from somewhere a reader can
re-run: a code cell's saved output in the same notebook, or a committed file in ``data/``. A
number found in neither is listed with its notebook and cell; an external figure, cited where it
is used, is allowed by name below with its reason."""

import json
import math
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))

UNIT = r"(?:x\b|×|µs|us\b|ms\b|GB/s|TB/s|GiB|MiB|KiB|GB\b|MB\b|%|tok/s|tokens/s|TFLOP/s)"
NUMBER = r"(\d[\d,]*(?:\.\d+)?)"
# a number, or a range of two, followed by a unit: 1.44x, 3.9-5x, 6.4 µs, 4,285 GB/s, 25%
QUANTITY = re.compile(r"(?<![\w.])" + NUMBER + r"(?:\s*[-–]\s*" + NUMBER + r")?\s*" + UNIT)

# (notebook, quantity as written) -> why it needs no cell or data file here
ALLOWED = {
    ("07_speculative_rollback.ipynb", "1.87-1.96x"): (
        "external: the speculative-decode gain the ReplaySSM write-up reports for vLLM, cited "
        "with its source in the same line"
    ),
}


def _outputs_text(nb) -> str:
    parts = []
    for cell in nb["cells"]:
        for out in cell.get("outputs", []):
            parts.append("".join(out.get("text", "")))
            parts.append("".join(out.get("data", {}).get("text/plain", "")))
    return "\n".join(parts).replace(",", "")


def _data_text() -> str:
    files = [p for p in (ROOT / "data").rglob("*") if p.is_file()]
    texts = [p.read_text(errors="ignore") for p in files if p.suffix in (".json", ".csv", ".md")]
    return "\n".join(texts).replace(",", "")


def _produced(number: str, *texts: str) -> bool:
    rx = re.compile(r"(?<![\d.])" + re.escape(number.replace(",", "")) + r"(?![\d])")
    return any(rx.search(t) for t in texts)


def unsourced_quantities(path, data_text):
    nb = json.loads(path.read_text(encoding="utf-8"))
    outputs = _outputs_text(nb)
    found = []
    for i, cell in enumerate(nb["cells"]):
        if cell["cell_type"] != "markdown":
            continue
        for m in QUANTITY.finditer("".join(cell["source"])):
            numbers = [n for n in m.groups() if n]
            if all(_produced(n, outputs, data_text) for n in numbers):
                continue
            if (path.name, m.group(0)) not in ALLOWED:
                found.append(f"{path.name} cell {i}: {m.group(0)!r}")
    return found


def test_every_quantity_in_the_text_is_produced_by_a_cell_or_data():
    data_text = _data_text()
    found = [q for path in NOTEBOOKS for q in unsourced_quantities(path, data_text)]
    assert not found, "numbers in the text that no cell output or data/ file produces:\n" + (
        "\n".join(found)
    )


def test_the_scan_finds_what_it_should(tmp_path):
    """The pattern catches ratios, ranges, units and percentages, and a produced number passes."""
    nb = {
        "cells": [
            {"cell_type": "markdown", "source": ["fast: 1.44x, 3.9-5x, 6.4 µs, 4,285 GB/s, 25%"]},
            {"cell_type": "code", "source": [], "outputs": [{"text": "ratio 1.44\n"}]},
        ]
    }
    path = tmp_path / "99_probe.ipynb"
    path.write_text(json.dumps(nb), encoding="utf-8")
    found = unsourced_quantities(path, data_text="")
    assert [f.split(": ", 1)[1] for f in found] == ["'3.9-5x'", "'6.4 µs'", "'4,285 GB/s'", "'25%'"]


def _minutes_table(text, column):
    """{notebook number: minutes} from a markdown table whose rows start '| NN Name |'."""
    rows = re.findall(r"^\| (\d\d) [^|]*\|(.*)$", text, re.M)
    return {nb: int(cells.split("|")[column].strip()) for nb, cells in rows}


def test_time_budgets_agree():
    """Each notebook's own **Time:** line, 00's table and objectives, and INSTRUCTORS.md's table
    give the same minutes, and both totals add up."""
    tour = "".join(json.loads(NOTEBOOKS[0].read_text(encoding="utf-8"))["cells"][0]["source"])
    guide = (ROOT / "notebooks" / "INSTRUCTORS.md").read_text(encoding="utf-8")
    own = {}
    for path in NOTEBOOKS:
        head = "".join(json.loads(path.read_text(encoding="utf-8"))["cells"][0]["source"])
        m = re.search(r"\*\*Time:\*\* about (\d+) minutes", head)
        assert m, f"{path.name}: no **Time:** line in its first cell"
        own[path.name[:2]] = int(m.group(1))
    in_tour = _minutes_table(tour, 1)
    in_guide = _minutes_table(guide.split("## Where people get stuck")[0], 0)
    objectives = {
        nb: int(m) for nb, m in re.findall(r"^\*\*(\d\d) [^*]*\((\d+) min\)\*\*", tour, re.M)
    }
    assert own == in_tour == in_guide == objectives
    total = sum(own.values())
    assert f"**{total} ({total // 60} h {total % 60} min)**" in tour
    assert f"**{total}** ({total // 60} h {total % 60} min)" in guide


def _rule_minutes(nb):
    """INSTRUCTORS.md's rule for a notebook's minutes: markdown words at 120 a minute (words with
    a letter or digit: a table's pipes are not words), non-blank code lines at 30 a minute, 10
    minutes for an exercise that defines a function, class or kernel, 5 for another, 5 for each
    question of the quiz; rounded up to 5."""
    cells = nb["cells"]
    words = sum(
        len([t for t in "".join(c["source"]).split() if re.search(r"\w", t)])
        for c in cells
        if c["cell_type"] == "markdown"
    )
    lines = sum(
        len([x for x in "".join(c["source"]).splitlines() if x.strip()])
        for c in cells
        if c["cell_type"] == "code"
    )
    exercises = 0
    for c in cells:
        name = c.get("metadata", {}).get("exercise")
        source = "".join(c["source"])
        if name == "quiz_answers":
            exercises += 5 * source.count('": None')
        elif name:
            writes = re.search(r"^\s*(def|class|@triton\.jit)", source, re.M)
            exercises += 10 if writes else 5
    return 5 * math.ceil((words / 120 + lines / 30 + exercises) / 5)


def test_no_notebook_is_budgeted_below_the_rule_and_the_days_add_up():
    """13, 14 and 12 had grown (exercises, text, a 14-question quiz) without their minutes; the
    rule is a floor (a budget may add discussions and explorers above it)."""
    below = {}
    minutes = {}
    for path in NOTEBOOKS:
        nb = json.loads(path.read_text(encoding="utf-8"))
        head = "".join(nb["cells"][0]["source"])
        minutes[path.name[:2]] = int(re.search(r"\*\*Time:\*\* about (\d+) minutes", head).group(1))
        if minutes[path.name[:2]] < _rule_minutes(nb):
            below[path.name] = (minutes[path.name[:2]], _rule_minutes(nb))
    assert not below, f"budgeted below INSTRUCTORS.md's rule (budget, rule): {below}"
    assert minutes["12"] >= 70  # the quiz's 14 questions alone
    tour = "".join(json.loads(NOTEBOOKS[0].read_text(encoding="utf-8"))["cells"][0]["source"])
    guide = (ROOT / "notebooks" / "INSTRUCTORS.md").read_text(encoding="utf-8")
    days = {1: range(0, 7), 2: range(7, 13), 3: range(13, 15)}
    for day, nbs in days.items():
        total = sum(minutes[f"{n:02d}"] for n in nbs)
        first, last = f"{nbs[0]:02d}", f"{nbs[-1]:02d}"
        assert f"day {day}: {first}-{last}, {total} minutes" in " ".join(tour.split())
        assert f"day {day} is {first}-{last} ({total} minutes)" in " ".join(guide.split())


def test_short_paths_add_up_and_match_the_guide():
    """The 3-hour and 1-day tables sum to their totals and are the same in 00 and the guide."""
    tour = "".join(json.loads(NOTEBOOKS[0].read_text(encoding="utf-8"))["cells"][0]["source"])
    guide = (ROOT / "notebooks" / "INSTRUCTORS.md").read_text(encoding="utf-8")
    for title, hours in (("The 3-hour path", "3 h"), ("The 1-day path", "7 h 30 min")):
        block = tour.split(f"### {title}")[1].split("###")[0].split("Optional on this path")[0]
        minutes = [int(m) for m in re.findall(r"\| (\d+) \|\n", block)]
        total = int(re.search(r"\*\*(\d+) \(" + hours + r"\)\*\*", block).group(1))
        assert sum(minutes) == total, (title, minutes, total)
        assert block.strip() in guide.replace(f"#### {title}", f"### {title}")


def test_where_replay_wins_is_stated_one_way():
    """The notebooks that say where replay wins on the GPU say what the engine data say
    (``replaylab.results.replay_wins``), and none keeps an older, contradicting phrasing."""
    from replaylab.results import replay_wins_summary

    decode = next(
        line for line in replay_wins_summary() if line.startswith("decode (bench_engine)")
    )
    first = re.search(r"wins from batch (\d+)", decode).group(1)
    stale = ("batch 64 and up", "batch >= 8", "on a GPU replay is the faster one")
    for path in NOTEBOOKS:
        nb = json.loads(path.read_text(encoding="utf-8"))
        text = "\n".join("".join(c["source"]) for c in nb["cells"] if c["cell_type"] == "markdown")
        assert not [s for s in stale if s in text], path.name
        if path.name[:2] in ("05", "06", "09"):
            assert f"wins from batch {first}" in " ".join(text.split()), path.name


# ---------------------------------------------------------------- issue 40: text and cells agree


def _nb(prefix):
    path = next(p for p in NOTEBOOKS if p.name.startswith(prefix))
    return json.loads(path.read_text(encoding="utf-8"))


def _markdown(nb) -> str:
    return " ".join(
        " ".join("".join(c["source"]).replace("#", " ").split())
        for c in nb["cells"]
        if c["cell_type"] == "markdown"
    )


def _outputs(nb) -> str:
    return _outputs_text(nb).replace("\n\n", "\n")


def test_every_matrix_rate_printed_is_measured_and_named_or_labelled_datasheet():
    """A TFLOP/s figure a notebook prints is the datasheet's (labelled so), a rate measured in a
    data/ file that the same line names, or a data file's own label quoted as such; the text
    calls no rate "measured" that is not."""
    from replaylab import costmodel as cm

    measured = set()
    for path in (ROOT / "data").glob("*.json"):
        measured |= {
            round(float(v))
            for v in re.findall(r'"matrix(?:_rate)?_tflops": ([\d.]+)', path.read_text())
        }
    assert measured, "no data file holds a measured matrix rate"
    h200 = cm.HARDWARE["H200"]
    assert f"{h200.matmul_rate / 1e12:.0f} TFLOP/s (datasheet)" in h200.source
    for path in NOTEBOOKS:
        nb = json.loads(path.read_text(encoding="utf-8"))
        for line in _outputs_text(nb).splitlines():
            for rate in re.findall(r"(\d+) TFLOP/s", line):
                ok = (
                    f"{rate} TFLOP/s (datasheet)" in line
                    or (int(rate) in measured and "data/" in line)
                    or " labels it: " in line
                )
                assert ok, f"{path.name}: {line!r}"
        text = _markdown(nb)
        assert "measured matrix rate" not in text, path.name
        assert "790 TFLOP/s" not in text, path.name
    assert "data/bench_serve_ragged.json" in _outputs(_nb("13_"))


def test_13_crossover_text_agrees_with_the_measured_stream():
    """13 says the measurement is the answer and the cost model's crossover lies far beyond it;
    the GPU file must bear that out, and the retired figures must stay out of the text."""
    from replaylab.results import load_bench
    from replaylab.teaching.plotting_serving import STREAM_GPU

    result = load_bench(STREAM_GPU)
    text = _markdown(_nb("13_"))
    assert result["device_type"] == "cuda" and "H100" in result["device"]
    assert f"This reads `{STREAM_GPU}`, the H100 run under a budget of 0.25" in text
    assert result["budget_bytes"] == 2**28
    assert "until it is committed" not in text
    for stale in ("near batch 1,100", "never for recompute", "near 175 rows"):
        assert stale not in text
    assert "speculation stops paying at the measured batch" in text
    assert "far below the cost model's" in text
    for strategy, row in result["strategies"].items():
        c = row["crossover"]
        measured, predicted = c["measured_batch"], c["predicted_batch"]
        assert measured is not None, strategy
        assert predicted is None or predicted >= 4 * measured, (strategy, measured, predicted)


def test_log_entry_bytes_agree_between_05_and_13():
    """05 counts an 8B log entry with the conv input, 13 the GPU engine's without it; 13 prints
    both and the break-even lengths, and its text says the entry is about half 05's."""
    e05 = int(
        re.search(r"one log entry: +([\d,]+) bytes", _outputs(_nb("05_"))).group(1).replace(",", "")
    )
    out13 = _outputs(_nb("13_"))  # commas removed
    m = re.search(
        r"one log entry (\d+) B \(x dt B C; notebook 05's entry adds the conv input: (\d+) B\)",
        out13,
    )
    assert m, "13 no longer prints both entries"
    gpu, teaching = int(m.group(1)), int(m.group(2))
    assert teaching == e05
    assert 0.4 < gpu / teaching < 0.6  # "about half"
    assert "about half of notebook 05's" in _markdown(_nb("13_"))


def test_instructors_gives_execution_seconds_only_in_its_table():
    guide = (ROOT / "notebooks" / "INSTRUCTORS.md").read_text(encoding="utf-8")
    after_table = guide.split("*How these were obtained.*")[1]
    assert not re.search(r"runs in (about|under) ", after_table)
    assert after_table.count("the seconds in the table under *Timing* above") >= 2


def test_no_known_gpu_gap_the_code_has_fixed():
    """06 section 4 and the log_room check put their tensors on ``kernel_device()``; 00 and the
    guide no longer call it a known gap."""
    import inspect

    from replaylab.teaching import exercises

    src = (ROOT / "notebooks" / "src" / "06_replay_kernel.py").read_text(encoding="utf-8")
    section4 = src.split("## 4. Run it here")[1].split("# ## 5")[0]
    assert "exercises.kernel_device()" in section4
    assert "kernel_device()" in inspect.getsource(exercises.check_largest_log_len)
    guide = (ROOT / "notebooks" / "INSTRUCTORS.md").read_text(encoding="utf-8")
    for text in (_markdown(_nb("00_")), " ".join(guide.split())):
        assert "known gap" not in text.lower()


def test_03_asks_about_the_work_it_counts_not_the_live_order():
    """03's question after its live timings asks about the counted scan work (which the cell
    below it prints), not about which strategy the live clock put last."""
    nb = _nb("03_")
    text = _markdown(nb)
    assert "be the slowest here" not in text
    assert "Why does replay do the most scan work here" in text
    steps = dict(
        re.findall(r"^(\w+) +logged tokens folded +\d+: ([\d.]+) scan steps", _outputs(nb), re.M)
    )
    assert float(steps["replay"]) > max(float(steps["snapshot"]), float(steps["recompute"]))


def test_assisted_generation_is_described_by_version():
    """transformers refuses assisted generation for hybrids only up to 5.24; from 5.25 it accepts
    it for NemotronH (a recorded state per draft: snapshot). No notebook says it refuses flatly."""
    for path in NOTEBOOKS:
        text = _markdown(json.loads(path.read_text(encoding="utf-8")))
        assert "which transformers refuses" not in text, path.name
        if "assisted generation" in text or "assistant_model" in text:
            assert "5.24" in text and "5.25" in text, path.name


def test_14_section_7_claims_about_the_two_stream_runs_hold():
    """14 compares the request streams on engines built for plain decode with the earlier run
    on engines built for k drafts; what its text says of the two must hold in the files."""
    from replaylab.bench.workload_stream import burst_point, workload_budget
    from replaylab.results import load_bench
    from replaylab.teaching.exercises_prefix import (
        EARLIER_WORKLOAD_STREAMS,
        WORKLOAD_STREAM_RESULTS,
    )

    text = " ".join(_markdown(_nb("14_")).split())
    for phrase in (
        "Built for k drafts, a snapshot request held over four times replay's bytes; built for "
        "plain decode, under twice",
        "Each budget admits about as many snapshot requests at once",
        "the earlier one admitted over twice as many replay requests as this one",
        "every rate above lies below its burst point",
        "they are higher than the fair ones on two workloads and lower on the other two",
        "replay's sustainable rate is above issue 38's target of 1.3x snapshot's on all four",
    ):
        assert phrase in text, phrase

    def held(w, s):
        row = next(r for r in w["rows"] if r["strategy"] == s and r["mode"] == "decode")
        return row["accounted_bytes_per_request"]["mean"]

    higher = []
    for name, path in WORKLOAD_STREAM_RESULTS.items():
        now = load_bench(path)["workloads"][name]
        then = load_bench(EARLIER_WORKLOAD_STREAMS[name])["workloads"][name]
        assert held(then, "snapshot") / held(then, "replay") > 4
        assert held(now, "snapshot") / held(now, "replay") < 2
        admits = {
            (run_name, s): workload_budget(w, "decode") / held(w, s)
            for run_name, w in (("then", then), ("now", now))
            for s in ("snapshot", "replay")
        }
        assert int(admits["then", "snapshot"]) == int(admits["now", "snapshot"])
        assert admits["then", "replay"] / admits["now", "replay"] > 2
        rates = {
            r["strategy"]: r["sustainable_rate"] for r in now["rates"] if r["mode"] == "decode"
        }
        assert max(rates.values()) < burst_point(now)
        assert rates["replay"] / rates["snapshot"] > 1.3
        earlier = {
            r["strategy"]: r["sustainable_rate"] for r in then["rates"] if r["mode"] == "decode"
        }
        higher.append(earlier["replay"] / earlier["snapshot"] > rates["replay"] / rates["snapshot"])
    assert sorted(higher) == [False, False, True, True]


def test_13_says_where_the_stream_budget_binds_as_the_gpu_file_shows():
    """13 reads the GPU stream: in plain decode the budget admits about as many snapshot requests
    as ran anyway, recompute (as many bytes as snapshot) reaches replay's rate, every search
    stopped at the TPOT bound and snapshot's step is the slower; with drafts the budget holds
    snapshot to a few and its requests wait longer than replay's; every request is lossless."""
    from replaylab.results import load_bench
    from replaylab.teaching.plotting_serving import STREAM_GPU

    run = load_bench(STREAM_GPU)
    text = " ".join(_markdown(_nb("13_")).split())
    for phrase in (
        "the budget admits about as many snapshot requests as ran at once anyway",
        "recompute, whose requests hold as many bytes as snapshot's, reaches the same rate as replay",
        "Every plain-decode search stopped at the TPOT bound, and snapshot's decode step is the slower",
        "With the synthetic drafter the budget does bind snapshot",
        "under every strategy and mode each of the first 8 requests, served alone at batch 1, gave the stream's tokens",
        "in `data/gpu_suite_h100_90b36f1.log`",
    ):
        assert phrase in text, phrase
    budget, o = run["budget_bytes"], run["objective"]
    rows = run["strategies"]
    dec = {s: r["modes"]["decode"] for s, r in rows.items()}
    syn = {s: r["modes"]["synthetic"] for s, r in rows.items()}

    def admits(m):
        return budget // m["accounted_bytes_per_request"]["mean"]

    assert 0 <= admits(dec["snapshot"]) - dec["snapshot"]["peak_running"] <= 1
    assert dec["recompute"]["sustainable_rate"] == dec["replay"]["sustainable_rate"]
    assert dec["replay"]["sustainable_rate"] > dec["snapshot"]["sustainable_rate"]
    held = {s: m["accounted_bytes_per_request"]["mean"] for s, m in dec.items()}
    assert abs(held["recompute"] / held["snapshot"] - 1) < 0.02
    for m in dec.values():
        failed = [p for p in m["rate_probes"] if not p["ok"] and p["rate"] > m["sustainable_rate"]]
        p = min(failed, key=lambda p: p["rate"])
        assert p["tpot_p99_s"] > o["tpot_p99_max_s"] and p["wait_p90_s"] <= o["wait_p90_max_s"]
    assert dec["snapshot"]["tpot_s"]["p50"] > max(
        dec[s]["tpot_s"]["p50"] for s in ("recompute", "replay")
    )
    assert syn["snapshot"]["peak_running"] == admits(syn["snapshot"]) < admits(dec["snapshot"])
    rate = syn["snapshot"]["sustainable_rate"]
    at = {s: next(p for p in m["rate_probes"] if p["rate"] == rate) for s, m in syn.items()}
    assert at["snapshot"]["wait_p90_s"] > at["replay"]["wait_p90_s"]
    assert at["snapshot"]["wait_p90_s"] <= o["wait_p90_max_s"]
    for r in rows.values():
        for m in r["modes"].values():
            assert m["tokens_equal_alone"] == m["requests_served_alone"] == 8
        lookup = r["modes"]["lookup"]  # "proposes thousands of drafts and almost none are accepted"
        assert lookup["proposed"] >= 1000 and lookup["accepted"] <= 0.01 * lookup["proposed"]
        assert lookup.get("sustainable_rate") is None and not lookup.get(
            "rate_probes"
        )  # "not searched"
    assert syn["recompute"]["graph_captures"] == 2  # "(the file's `graph_captures`: 2)"
    assert "the file's `graph_captures`: 2" in text and "its rate was not searched" in text
