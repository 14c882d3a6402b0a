"""Every number with a unit or a ratio in a notebook's text comes from somewhere a reader can
re-run: a code cell's saved output in the same notebook, or a committed file in ``data/``. A
number found in neither is listed with its notebook and cell; an external figure, cited where it
is used, is allowed by name below with its reason."""

import json
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


def test_short_paths_add_up_and_match_the_guide():
    """The 3-hour and 1-day tables sum to their totals and are the same in 00 and the guide."""
    tour = "".join(json.loads(NOTEBOOKS[0].read_text(encoding="utf-8"))["cells"][0]["source"])
    guide = (ROOT / "notebooks" / "INSTRUCTORS.md").read_text(encoding="utf-8")
    for title, hours in (("The 3-hour path", "3 h"), ("The 1-day path", "6 h 45 min")):
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
