"""Where a run happened (device, versions, date), and the provenance written into a shipped
model folder's files."""

from __future__ import annotations

import json
import platform
from pathlib import Path

import torch


def utc_now() -> str:
    """The current UTC time, ISO 8601 to the second."""
    import datetime

    return datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")


def versions() -> dict:
    """``{"python", "torch", "transformers", "tokenizers"[, "cuda"]}``: version strings."""
    import tokenizers
    import transformers

    out = dict(
        python=platform.python_version(),
        torch=torch.__version__,
        transformers=transformers.__version__,
        tokenizers=tokenizers.__version__,
    )
    if torch.cuda.is_available():
        out["cuda"] = torch.version.cuda
    return out


def device_name(device) -> str:
    """The GPU's name for a CUDA ``device``, else the CPU's with its thread count."""
    if str(device).startswith("cuda"):
        return torch.cuda.get_device_name(torch.device(device))
    return f"CPU ({platform.processor() or platform.machine()}, {torch.get_num_threads()} threads)"


# files of a model folder that can carry extra top-level fields (tokenizers refuses unknown
# fields in tokenizer.json, so that one is covered by provenance.json alone)
STAMPED_FILES = ("config.json", "generation_config.json", "tokenizer_config.json")


def stamp_provenance(folder, provenance: dict):
    """Write the training run's device, date and command into each JSON file of ``folder``
    that tolerates extra fields (transformers keeps them as attributes it never reads)."""
    for name in STAMPED_FILES:
        path = Path(folder) / name
        data = json.loads(path.read_text())
        data.update(
            device=provenance["device"],
            date=provenance["date"],
            command=provenance["command"],
            provenance="provenance.json (versions, and the run that measured the card)",
        )
        path.write_text(json.dumps(data, indent=2) + "\n")


def folder_provenance(metrics: dict, name: str) -> dict:
    """Where every file of a shipped model folder comes from: the training run that wrote
    config.json, generation_config.json, model.safetensors and the tokenizer files (its device,
    versions, date and command), and the CPU run that measured the card's numbers."""
    m = metrics["models"][name]["provenance"]
    return dict(
        files="config.json, generation_config.json, model.safetensors, tokenizer.json and "
        "tokenizer_config.json were written by replaylab.train.export at the end of this run; "
        "the tokenizer was trained by replaylab.train.prepare on the train split (corpus.json)",
        device=m["device"],
        versions=m["versions"],
        date=m["date"],
        command=m["command"],
        weights_dtype=m.get("weights_dtype"),
        evaluation=metrics["evaluation_provenance"],
    )
