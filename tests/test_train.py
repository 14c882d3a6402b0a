"""``replaylab train``: corpus split, tokenizer, fixed data order, a CPU smoke run whose folder
transformers loads with equal logits, clear errors for an empty corpus; and the trained pair
shipped in data/models: transformers' logits equal replaylab's, the card's numbers are the
metrics file's."""

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from replaylab.cache import HybridCache
from replaylab.cli import main
from replaylab.generate import load_checkpoint
from replaylab.train import (
    EOS,
    PAD,
    TrainConfig,
    batches,
    bigram_loss,
    encode,
    read_heldout_text,
    text_corpus,
    train_tokenizer,
    write_heldout_text,
)

ROOT = Path(__file__).resolve().parents[1]
MODELS = ROOT / "data" / "models"
PAIR = ("replaylab-code-10m", "replaylab-code-draft")


def own_source():
    """A small fixed corpus: this package's own modules."""
    return {p.name: p.read_text() for p in sorted((ROOT / "replaylab").glob("*.py"))}


def test_split_is_by_name_and_every_file_lands_once():
    texts = {f"f{i}.py": f"x = {i}\n" for i in range(400)}
    corpus = text_corpus(texts)
    assert sorted(corpus.train_names + corpus.heldout_names) == sorted(texts)
    assert 0 < len(corpus.heldout_names) < 20  # about 2%
    again = text_corpus(dict(reversed(list(texts.items()))))
    assert again.heldout_names == corpus.heldout_names
    manifest = corpus.manifest()
    assert manifest["heldout"] == corpus.heldout_names and "mod 50" in manifest["rule"]


def test_stdlib_corpus_skips_site_packages_and_files_that_are_not_utf8(tmp_path):
    from replaylab.train import stdlib_corpus

    for i in range(60):
        (tmp_path / "pkg").mkdir(exist_ok=True)
        (tmp_path / "pkg" / f"m{i}.py").write_text(f"X = {i}\n")
    (tmp_path / "site-packages").mkdir()
    (tmp_path / "site-packages" / "other.py").write_text("import this\n")
    (tmp_path / "latin1.py").write_bytes("s = 'caf\xe9'\n".encode("latin-1"))
    corpus = stdlib_corpus(tmp_path)
    names = corpus.train_names + corpus.heldout_names
    assert len(names) == 60 and all(n.startswith("pkg/") for n in names)
    assert corpus.skipped == ["latin1.py"] and corpus.manifest()["skipped_not_utf8"] == [
        "latin1.py"
    ]
    assert str(tmp_path) in corpus.source


def test_heldout_text_round_trips(tmp_path):
    corpus = text_corpus({f"m{i}.py": f"def f{i}():\n    return {i}\n\n" for i in range(300)})
    write_heldout_text(corpus, tmp_path / "h.txt")
    back = read_heldout_text(tmp_path / "h.txt")
    assert back == dict(zip(corpus.heldout_names, corpus.heldout_texts))


def test_tokenizer_specials_round_trip_and_determinism():
    texts = list(own_source().values())
    tok = train_tokenizer(texts, vocab_size=400)
    assert tok.get_vocab_size() == 400
    assert tok.token_to_id("<|endoftext|>") == EOS and tok.token_to_id("<|pad|>") == PAD
    sample = "def f(x):\n    return x ** 2  # ünïcode ✓\n"
    assert tok.decode(tok.encode(sample).ids) == sample
    again = train_tokenizer(texts, vocab_size=400)
    assert again.to_str() == tok.to_str()
    ids = encode(tok, ["a = 1", "b = 2"])
    assert ids.dtype == np.uint16 and (ids == EOS).sum() == 2 and ids[-1] == EOS


def test_data_order_is_fixed_by_the_seed_and_covers_every_window():
    ids = np.arange(1001, dtype=np.uint16)
    cfg = TrainConfig(steps=5, batch_size=4, seq_len=50, seed=7)
    first = [b for _, b in batches(ids, cfg)]
    again = [b for _, b in batches(ids, cfg)]
    other = [b for _, b in batches(ids, TrainConfig(steps=5, batch_size=4, seq_len=50, seed=8))]
    assert all(torch.equal(a, b) for a, b in zip(first, again))
    assert not all(torch.equal(a, b) for a, b in zip(first, other))
    starts = torch.cat([b[:, 0] for b in first])[:20]  # the first pass: 20 windows
    assert sorted(starts.tolist()) == list(range(0, 1000, 50))
    assert all(torch.equal(b[:, 1:] - b[:, :-1], torch.ones_like(b[:, 1:])) for b in first)


def test_bigram_baseline_learns_a_deterministic_sequence():
    ids = np.tile(np.arange(10, dtype=np.uint16), 200)
    res = bigram_loss(ids, ids[:100], vocab_size=10, alphas=(0.01,))
    assert res["loss"] < 0.01
    uniform = bigram_loss(ids, ids[:100], vocab_size=10, alphas=(1e9,))
    assert uniform["loss"] == pytest.approx(np.log(10), abs=0.01)


def test_empty_corpus_gets_a_clear_error(tmp_path, capsys):
    with pytest.raises(ValueError, match="corpus: no text to train on"):
        text_corpus({})
    with pytest.raises(ValueError, match="corpus: no text to train on"):
        text_corpus({"a.py": "", "b.py": ""})
    with pytest.raises(ValueError, match="corpus: no text to train a tokenizer on"):
        train_tokenizer([])
    (tmp_path / "empty").mkdir()
    code = main(["train", str(tmp_path / "out"), "--corpus", str(tmp_path / "empty")])
    assert code == 2 and "corpus: no text to train on" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_bad_training_settings_are_refused_before_the_folder_is_touched(tmp_path, capsys):
    bad = [
        (dict(steps=0), ValueError, r"steps: expected 1 <= steps, got 0"),
        (dict(steps=2.5), TypeError, r"steps: expected an integer, got float 2.5"),
        (dict(batch_size=0), ValueError, r"batch_size: expected 1 <= batch_size"),
        (dict(seq_len=0), ValueError, r"seq_len: expected 1 <= seq_len"),
        (dict(warmup=-1), ValueError, r"warmup: expected 0 <= warmup"),
        (dict(lr=float("nan")), ValueError, r"lr: expected a finite number > 0, got nan"),
        (dict(min_lr_ratio=1.5), ValueError, r"min_lr_ratio: expected a finite number"),
        (dict(grad_clip=0.0), ValueError, r"grad_clip: expected a finite number > 0"),
    ]
    for fields, error, match in bad:
        with pytest.raises(error, match=match):
            TrainConfig(**fields)
    out = tmp_path / "ckpt"
    out.mkdir()
    (out / "model.safetensors").write_bytes(b"trained weights")
    # --steps 0 overwrote a trained checkpoint with untrained weights, then raised IndexError
    code = main(["train", str(out), "--size", "smoke", "--steps", "0"])
    assert code == 2 and "steps: expected 1 <= steps, got 0" in capsys.readouterr().err
    assert [p.name for p in out.iterdir()] == ["model.safetensors"]
    assert (out / "model.safetensors").read_bytes() == b"trained weights"


@pytest.fixture(scope="module")
def smoke(tmp_path_factory):
    """Two identical CPU smoke runs of ``replaylab train`` on this package's own source."""
    root = tmp_path_factory.mktemp("smoke")
    src = root / "src"
    src.mkdir()
    for name, text in own_source().items():
        (src / name).write_text(text)
    args = ["--size", "smoke", "--corpus", str(src), "--vocab-size", "320", "--steps", "30"]
    args += ["--heldout-every", "4"]
    args += ["--batch-size", "4", "--seq-len", "64", "--warmup", "5", "--lr", "3e-3"]
    assert main(["train", str(root / "a"), *args]) == 0
    # the same through a prepared data folder
    prep = ["--corpus", str(src), "--vocab-size", "320", "--heldout-every", "4"]
    assert main(["train", str(root / "data"), "--prepare-only", *prep]) == 0
    rest = args[args.index("--steps") :]
    assert (
        main(["train", str(root / "b"), "--size", "smoke", "--data", str(root / "data"), *rest])
        == 0
    )
    return root / "a", root / "b"


def test_smoke_training_learns_and_is_reproducible(smoke):
    a, b = smoke
    log = json.loads((a / "train_log.json").read_text())
    curve = [p["loss"] for p in log["loss_curve"]]
    assert curve[-1] < curve[0] - 0.5  # it learns
    assert log["training_tokens"] == 30 * 4 * 64 and log["parameters"] > 0
    assert log["provenance"]["command"].startswith("replaylab train ")
    assert log["heldout"]["loss"] < np.log(320)  # better than uniform
    assert (a / "model.safetensors").read_bytes() == (b / "model.safetensors").read_bytes()
    assert (a / "tokenizer.json").read_text() == (b / "tokenizer.json").read_text()


def transformers_vs_replaylab(folder, T=70):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    hf = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    ours = load_checkpoint(folder)  # bf16 weights, upcast exactly on a CPU
    tok = AutoTokenizer.from_pretrained(folder)
    assert tok.eos_token_id == EOS == hf.generation_config.eos_token_id
    assert tok.pad_token_id == PAD
    text = (ROOT / "replaylab" / "train.py").read_text()[:2000]
    ids = torch.tensor([tok(text).input_ids[:T]])
    with torch.no_grad():
        ref = hf(ids, use_cache=False).logits
        got = ours(ids, HybridCache(ours))
    return float((got - ref).abs().max())


def test_smoke_folder_loads_in_transformers_with_equal_logits(smoke):
    config = json.loads((smoke[0] / "config.json").read_text())
    # the floor on Δ in both fields NemotronH has read it from (<= 5.24, >= 5.25)
    assert config["time_step_limit"][0] == config["time_step_min"] == 0.001
    assert transformers_vs_replaylab(smoke[0]) < 1e-4


@pytest.mark.parametrize("name", PAIR)
def test_shipped_models_logits_equal_transformers(name):
    """Under every release: NemotronH reads its floor on Δ from time_step_min up to
    transformers 5.24 and from time_step_limit from 5.25 (tests/test_model.py), and the shipped
    configs give both fields the floor the models were trained with."""
    config = json.loads((MODELS / name / "config.json").read_text())
    assert config["time_step_limit"][0] == config["time_step_min"] == 0.001
    assert transformers_vs_replaylab(MODELS / name) < 1e-4


def test_shipped_pair_card_metrics_and_size():
    metrics = json.loads((MODELS / "metrics.json").read_text())
    target, draft = (metrics["models"][n] for n in PAIR)
    assert target["heldout"]["loss"] < metrics["bigram"]["loss"] - 1.0
    assert (MODELS / PAIR[0] / "tokenizer.json").read_bytes() == (
        MODELS / PAIR[1] / "tokenizer.json"
    ).read_bytes()
    card = (MODELS / PAIR[0] / "README.md").read_text()
    assert f"{target['heldout']['loss']:.3f}" in card and f"{metrics['bigram']['loss']:.3f}" in card
    acc = metrics["acceptance"]["summary"]["draft model / replay"]["acceptance"]
    assert f"{acc:.2f}" in card
    total = sum(p.stat().st_size for p in MODELS.rglob("*") if p.is_file())
    assert total <= 25 * 2**20
    assert draft["parameters"] < target["parameters"]


def test_prompt_lookup_check_fails_on_the_stub_and_passes_on_a_solution(capsys):
    from replaylab.teaching.exercises_text import check_prompt_lookup, lookup_with_source

    assert not check_prompt_lookup(lambda context, k: None)
    assert "not done yet" in capsys.readouterr().out
    assert not check_prompt_lookup(lambda context, k: [context[-1]] * k)  # no lookup at all

    def solution(context, k):
        for n in range(min(3, len(context) - 1), 0, -1):
            for start in range(len(context) - n - 1, -1, -1):
                if context[start : start + n] == context[-n:]:
                    follow = context[start + n : start + n + k]
                    return follow + [follow[-1]] * (k - len(follow))
        return [context[-1]] * k

    assert check_prompt_lookup(solution)
    assert check_prompt_lookup(lambda context, k: lookup_with_source(context, k)[0])
    drafts, source, n = lookup_with_source([4, 5, 6, 9, 4, 5], 3)
    assert (drafts, source, n) == ([6, 9, 4], 2, 2)
    assert lookup_with_source([1, 2, 3], 2) == ([3, 3], None, 0)


def test_round_recorder_counts_accepted_drafts(tiny_model):
    from replaylab.decoding import PromptLookupDrafter, speculative
    from replaylab.teaching.exercises_text import RoundRecorder

    prompt = torch.tensor([[3, 4, 5, 3, 4, 5, 3, 4]])
    rec = RoundRecorder(PromptLookupDrafter())
    res = speculative(tiny_model.eval(), prompt, 20, rec, k=3, cache="replay")
    rounds = rec.finish(res)
    assert sum(r["accepted"] for r in rounds) == res.accepted
    assert all(0 <= r["accepted"] <= 3 for r in rounds) and len(rounds) * 3 == res.proposed
    assert [r["position"] for r in rounds][0] == prompt.shape[1] + 1


def test_committed_model_files_carry_their_provenance_and_still_load():
    """write_cards stamps the training run into every file that tolerates extra fields;
    transformers and tokenizers still read the folders."""
    import json
    from pathlib import Path

    from replaylab.generate import load_checkpoint, load_tokenizer
    from replaylab.train import PAIR, STAMPED_FILES

    root = Path(__file__).resolve().parents[1] / "data" / "models"
    for name in PAIR:
        prov = json.loads((root / name / "provenance.json").read_text())
        for f in STAMPED_FILES:
            data = json.loads((root / name / f).read_text())
            assert (data["device"], data["date"], data["command"]) == (
                prov["device"],
                prov["date"],
                prov["command"],
            ), (name, f)
        tok = load_tokenizer(root / name)
        assert tok.decode(tok.encode("def f(x):\n    return x").ids) == "def f(x):\n    return x"
        assert load_checkpoint(root / name).cfg.vocab_size == len(tok.get_vocab())
