"""The model cards of the shipped pair (``data/models/*/README.md``), written from
``metrics.json`` and the folders' training logs; measures nothing."""

from __future__ import annotations

import json
from pathlib import Path

from replaylab.training.provenance import folder_provenance, stamp_provenance

PAIR = ("replaylab-code-10m", "replaylab-code-draft")  # folders under data/models


def write_cards(models_dir) -> dict:
    """Refresh ``metrics.json``'s training figures from the folders' ``train_log.json`` (and
    ``runs/``), then write both model cards from it. Measures nothing."""
    models_dir = Path(models_dir)
    metrics = json.loads((models_dir / "metrics.json").read_text())
    logs = {n: json.loads((models_dir / n / "train_log.json").read_text()) for n in PAIR}
    metrics["models"] = {
        n: {k: v for k, v in log.items() if k != "loss_curve"} for n, log in logs.items()
    }
    metrics["bigram"] = logs[PAIR[0]]["bigram"]
    runs = sorted((models_dir / "runs").glob("*.json"))
    metrics["earlier_runs"] = [_run_summary(f) for f in runs]
    (models_dir / "metrics.json").write_text(json.dumps(metrics, indent=1))
    for n in PAIR:
        (models_dir / n / "README.md").write_text(model_card(metrics, n))
        provenance = folder_provenance(metrics, n)
        (models_dir / n / "provenance.json").write_text(json.dumps(provenance, indent=1))
        stamp_provenance(models_dir / n, provenance)
    return metrics


def _run_summary(path) -> dict:
    """A training run that was not shipped (its ``train_log.json`` under ``runs/``)."""
    log = json.loads(Path(path).read_text())
    return dict(
        file=f"runs/{Path(path).name}",
        command=log["provenance"]["command"],
        date=log["provenance"]["date"],
        device=log["provenance"]["device"],
        training_tokens=log["training_tokens"],
        seconds=log["seconds"],
        final_train_loss=log["loss_curve"][-1]["loss"],
        heldout_loss=log["heldout"]["loss"],
    )


def _fmt_int(n):
    return f"{n / 1e6:.2f}M" if n >= 1e6 else f"{n:,}"


def model_card(metrics: dict, name: str) -> str:
    """The model card (README.md) of ``name`` from ``metrics`` (what ``report`` measured)."""
    m = metrics["models"][name]
    target, draft = (metrics["models"][n] for n in PAIR)
    bigram, acc = metrics["bigram"], metrics["acceptance"]
    s = acc["summary"]
    role = "target" if name == PAIR[0] else "draft"
    cfg = m["model"]
    lines = [
        "---",
        "library_name: transformers",
        "license: apache-2.0",
        "tags: [nemotron_h, hybrid, mamba2, replaylab, code]",
        "---",
        "",
        f"# {name}",
        "",
        f"The {role} model of replaylab's trained pair: a hybrid (Mamba-2 + attention + MLP "
        f"blocks, NemotronH layout, pattern `{cfg['pattern']}`) trained from scratch on the "
        f"Python standard library's source. It exists to make the project's notebooks and "
        f"`replaylab generate` write real text and to give speculative decoding a real draft "
        f"model; it is a teaching artefact, not a useful code model.",
        "",
        "Load it with transformers (`AutoModelForCausalLM.from_pretrained(folder)`, "
        "`AutoTokenizer.from_pretrained(folder)`) or with replaylab:",
        "",
        "```console",
        f"replaylab generate data/models/{name} --prompt 'def fibonacci(n):' --max-new-tokens 48",
        "```",
        "",
        "## Model",
        "",
        "| | target | draft |",
        "|---|---|---|",
        f"| folder | `{PAIR[0]}` | `{PAIR[1]}` |",
        f"| parameters | {target['parameters']:,} | {draft['parameters']:,} |",
        f"| blocks (M Mamba-2, * attention, - MLP) | `{target['model']['pattern']}` "
        f"| `{draft['model']['pattern']}` |",
        f"| hidden size | {target['model']['hidden_size']} | {draft['model']['hidden_size']} |",
        f"| Mamba-2 heads x head dim, state size | {target['model']['ssm_heads']} x "
        f"{target['model']['ssm_head_dim']}, {target['model']['d_state']} | "
        f"{draft['model']['ssm_heads']} x {draft['model']['ssm_head_dim']}, "
        f"{draft['model']['d_state']} |",
        f"| vocabulary | {target['model']['vocab_size']} | {draft['model']['vocab_size']} |",
        f"| weights | {target['provenance']['weights_dtype']} | "
        f"{draft['provenance']['weights_dtype']} |",
        "",
        "Both share one tokenizer: byte-level BPE (`tokenizers`), "
        f"{target['model']['vocab_size']} entries, trained on the train split; id 0 "
        "`<|endoftext|>` (end of a file: BOS and EOS), id 1 `<|pad|>`. The embedding and the "
        "output layer were tied in training; NemotronH stores both, so the file holds both. "
        "The weights are stored in bfloat16; every number below was measured with those "
        "rounded weights.",
        "",
        "## Corpus and split",
        "",
        f"{m['corpus']['source']}: every `*.py` file outside site-packages that reads as "
        f"UTF-8, sorted by relative path; {m['corpus']['rule']}. "
        f"Train: {m['corpus']['train_files']} files, {_fmt_int(m['train_split_tokens'])} tokens; "
        f"held out: {m['corpus']['heldout_files']} files, "
        f"{_fmt_int(m['heldout_split_tokens'])} tokens. The file lists are in "
        "`data/models/corpus.json`, the held-out text in `data/models/heldout.txt.gz` (so the "
        "evaluation does not depend on the local Python). Each file's tokens are followed by "
        "`<|endoftext|>`; training windows of "
        f"{m['train']['seq_len']} + 1 tokens are cut from that stream and visited in an order "
        f"fixed by the seed ({m['train']['seed']}).",
        "",
        "## Training",
        "",
        "| | target | draft |",
        "|---|---|---|",
        f"| steps x batch x window | {target['train']['steps']} x "
        f"{target['train']['batch_size']} x {target['train']['seq_len']} | "
        f"{draft['train']['steps']} x {draft['train']['batch_size']} x "
        f"{draft['train']['seq_len']} |",
        f"| training tokens | {_fmt_int(target['training_tokens'])} "
        f"({target['training_tokens'] / target['train_split_tokens']:.1f} passes) | "
        f"{_fmt_int(draft['training_tokens'])} "
        f"({draft['training_tokens'] / draft['train_split_tokens']:.1f} passes) |",
        f"| peak learning rate (AdamW, warm-up, cosine) | {target['train']['lr']} | "
        f"{draft['train']['lr']} |",
        f"| training time | {target['seconds']:.0f} s | {draft['seconds']:.0f} s |",
        f"| device | {target['provenance']['device']} | {draft['provenance']['device']} |",
        f"| date | {target['provenance']['date']} | {draft['provenance']['date']} |",
        "",
        "Versions: "
        + ", ".join(f"{k} {v}" for k, v in target["provenance"]["versions"].items())
        + ". bf16 autocast, fp32 master weights. Commands (`--data` is the folder that "
        "`replaylab.train.prepare(stdlib_corpus(), '.trainprep')` wrote on Python "
        f"{metrics['evaluation_provenance']['versions']['python']}; `replaylab train "
        ".trainprep --prepare-only` makes the same call):",
        "",
        "```console",
        target["provenance"]["command"],
        draft["provenance"]["command"],
        "```",
        "",
        "The loss curves (train loss every 10 steps; the target's held-out loss on the first "
        "32k held-out tokens every 100 steps) are in each folder's `train_log.json`.",
        "",
    ]
    for run in metrics.get("earlier_runs", []):
        lines += [
            f"An earlier target run, not shipped (`data/models/{run['file']}`): "
            f"`{run['command']}` ({run['device']}, {run['date']}, {run['seconds']:.0f} s, "
            f"{_fmt_int(run['training_tokens'])} tokens) ended at train loss "
            f"{run['final_train_loss']:.3f} but held-out loss {run['heldout_loss']:.3f}: "
            "it had memorised the training split over "
            f"{run['training_tokens'] / target['train_split_tokens']:.0f} passes. The "
            "shipped target is the shorter run above.",
            "",
        ]
    lines += [
        "## Held-out loss",
        "",
        "Next-token cross-entropy in nats per token over the whole held-out split "
        f"({_fmt_int(m['heldout_split_tokens'])} tokens, windows of {m['train']['seq_len']}):",
        "",
        "| model | loss | perplexity |",
        "|---|---|---|",
        f"| target `{PAIR[0]}` | {target['heldout']['loss']:.3f} | "
        f"{target['heldout']['perplexity']:.2f} |",
        f"| draft `{PAIR[1]}` | {draft['heldout']['loss']:.3f} | "
        f"{draft['heldout']['perplexity']:.2f} |",
        f"| bigram baseline (train counts, smoothing alpha={bigram['alpha']:g} picked on the "
        f"held-out text) | {bigram['loss']:.3f} | {bigram['perplexity']:.2f} |",
        "",
        "## Speculative decoding: acceptance at k = 4",
        "",
        f"{acc['prompts']} prompts cut from the held-out files (each ends with a `def` line; "
        f"`replaylab.train.heldout_prompts`), {acc['n_new']} new tokens each, greedy "
        f"verification by the target, k = {acc['k']} drafts per round, under replay; the "
        "first prompts again under snapshot and recompute (the tokens, hence the acceptance, "
        "do not depend on the strategy: the check is that they do not). Acceptance is "
        "accepted / proposed drafts; 'identical' says whether every output equals plain "
        "greedy decoding's tokens.",
        "",
        "| drafter | strategy | prompts | accepted / proposed | acceptance | identical to greedy |",
        "|---|---|---|---|---|---|",
    ]
    for key, row in s.items():
        drafter, strategy = key.split(" / ")
        lines.append(
            f"| {drafter} | {strategy} | {row['prompts']} | {row['accepted']} / {row['proposed']} | "
            f"{row['acceptance']:.2f} | {'yes' if row['identical_to_greedy'] else 'NO'} |"
        )
    ev = metrics["evaluation_provenance"]
    lines += [
        "",
        f"Measured on {ev['device']}, {ev['date']}, "
        + ", ".join(f"{k} {v}" for k, v in ev["versions"].items())
        + f", with `{ev['command']}`.",
        "",
        "## Greedy samples",
        "",
        "The target, greedy, at most 48 new tokens, stopping at `<|endoftext|>` "
        "(`replaylab generate --prompt ...`):",
        "",
    ]
    for sample in metrics["samples"]:
        lines += ["```text", sample["prompt"] + sample["text"], "```", ""]
    lines += [
        "## Limits",
        "",
        "Ten million parameters and a few passes over 10M tokens of one code base: the "
        "model writes code-shaped text with plausible names and indentation, and repeats "
        "itself. It knows nothing outside the standard library's style. Not for any use "
        "beyond teaching how hybrid models decode.",
        "",
        f"The {role} model's card is generated by `replaylab.train.report`; the numbers are "
        "in `data/models/metrics.json`.",
        "",
    ]
    return "\n".join(lines)
