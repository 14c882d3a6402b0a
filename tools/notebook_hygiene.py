"""Output hygiene for the notebooks (a pre-commit hook and a test).

Interactive explorers render only in a live kernel: a saved widget view without its state shows
as raw ``VBox(children=...)`` text when the notebook is opened. So no saved output may be a
widget view, and no notebook may carry saved widget state (megabytes of JavaScript). An
explorer's output also holds a static SVG of its figure (``replaylab.teaching.widgets``): ``--fix``
keeps that, so the saved notebook shows the explorer's starting view.

    python tools/notebook_hygiene.py --check notebooks/*.ipynb   exit 1 and name the cells
    python tools/notebook_hygiene.py --fix notebooks/*.ipynb     strip them in place
"""

from __future__ import annotations

import argparse
import json
import sys

WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"


def problems(nb) -> list[str]:
    found = []
    if "widgets" in nb.get("metadata", {}):
        found.append("metadata.widgets (saved widget state)")
    for i, cell in enumerate(nb["cells"]):
        for out in cell.get("outputs", []):
            if WIDGET_VIEW in out.get("data", {}):
                found.append(f"cell {i}: a widget view output")
    return found


def strip(nb):
    """Drop saved widget state and every widget view. An output that also holds something a
    reader can see without a kernel (an explorer's static SVG) keeps that; one left with only
    the widget's raw text goes."""
    nb.get("metadata", {}).pop("widgets", None)
    for cell in nb["cells"]:
        outputs = cell.get("outputs", [])
        if not any(WIDGET_VIEW in out.get("data", {}) for out in outputs):
            continue
        kept = []
        for out in outputs:
            data = out.get("data", {})
            if WIDGET_VIEW in data:
                data.pop(WIDGET_VIEW)
                if set(data) <= {"text/plain"}:
                    continue
            kept.append(out)
        cell["outputs"] = kept
        if not kept:
            cell["execution_count"] = None
    return nb


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--fix", action="store_true", help="strip in place instead of checking")
    parser.add_argument("--check", action="store_true", help="report and fail (the default)")
    parser.add_argument("paths", nargs="+")
    args = parser.parse_args(argv)
    bad = 0
    for path in args.paths:
        with open(path, encoding="utf-8") as f:
            nb = json.load(f)
        found = problems(nb)
        if found and args.fix:
            with open(path, "w", encoding="utf-8") as f:
                json.dump(strip(nb), f, indent=1, ensure_ascii=False)
                f.write("\n")
        elif found:
            bad += 1
            print(f"{path}: " + "; ".join(found))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
