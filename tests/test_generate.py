"""``replaylab generate`` on transformers checkpoints: transformers' own greedy tokens, under
every strategy and draft; clear errors for bad input; and what transformers' own assisted
generation does with these models, per release."""

import json
import shutil
from pathlib import Path

import pytest
import torch
from test_model import needs_grouped_bamba_norm, tiny_bamba, tiny_nemotron_h

from replaylab.cache import CacheConfig
from replaylab.cli import main
from replaylab.generate import _use_engine, generate
from replaylab.model import HybridConfig, HybridLM


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    root = tmp_path_factory.mktemp("ckpt")
    target, draft, bamba = tiny_nemotron_h("M-M*-M"), tiny_nemotron_h("M*-", seed=1), tiny_bamba()
    for name, model in (("target", target), ("draft", draft), ("bamba", bamba)):
        model.save_pretrained(root / name)
    return root, target, bamba


def hf_greedy(hf, prompt, n):
    ids = torch.tensor([prompt])
    with torch.no_grad():
        out = hf.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=n,
            min_new_tokens=n,
            do_sample=False,
        )
    return out[0, len(prompt) :].tolist()


def run_cli(capsys, *argv):
    code = main(list(map(str, argv)))
    out = capsys.readouterr()
    return code, (json.loads(out.out) if code == 0 else out.err)


PROMPT = [5, 17, 3, 5, 17, 3, 9, 5, 17, 0, 3]


@pytest.mark.parametrize("strategy", ["snapshot", "recompute", "replay"])
def test_generate_reproduces_transformers_greedy_with_every_draft(checkpoints, capsys, strategy):
    root, target, bamba = checkpoints
    want = hf_greedy(target, PROMPT, 12)
    for draft in ("none", "prompt-lookup", root / "draft"):
        code, out = run_cli(
            capsys,
            "generate",
            root / "target",
            "--prompt-ids",
            ",".join(map(str, PROMPT)),
            "--max-new-tokens",
            12,
            "--strategy",
            strategy,
            "--draft",
            draft,
            "--k",
            3,
            "--checkpoint-interval",
            4,
            "--log-length",
            4,
        )
        assert code == 0 and out["tokens"] == want, draft
        if draft != "none":
            assert out["proposed"] > 0


def test_generate_on_the_serving_engine_reproduces_transformers_greedy(checkpoints, capsys):
    """``--engine on`` decodes with ``DecodeEngine`` (here its reference path, on CPU): the
    same tokens as transformers, greedy and speculative; "auto" keeps the teaching cache on a
    CPU; a layout the engine cannot serve is refused by name."""
    root, target, _ = checkpoints
    want = hf_greedy(target, PROMPT, 12)
    for strategy in ("snapshot", "recompute", "replay"):
        for draft in ("none", "prompt-lookup", root / "draft"):
            run = generate(
                root / "target", PROMPT, 12, strategy, draft if draft != "none" else None, 3,
                engine=True,
            )  # fmt: skip
            assert run.tokens[0].tolist() == want and "engine" in run.extra, (strategy, draft)
            assert run.extra["engine"]["steps"] > 0
            if draft != "none":
                assert run.proposed > 0 and run.restores == run.extra["engine"]["rollbacks"]
    auto = generate(root / "target", PROMPT, 4, "replay", engine="auto")
    assert "engine" not in auto.extra  # the model is on a CPU: the teaching cache
    if torch.cuda.is_available():
        auto = generate(root / "target", PROMPT, 4, "replay", engine="auto", device="cuda")
        assert "engine" in auto.extra and auto.tokens[0].tolist() == want[:4]
        # a draft model on the GPU drafts from the engine's host-side contexts; its speculative
        # tokens equal the same engine's greedy ones (one arithmetic)
        on_gpu = dict(engine="auto", device="cuda")
        plain = generate(root / "target", PROMPT, 12, "replay", **on_gpu)
        spec = generate(root / "target", PROMPT, 12, "replay", root / "draft", 3, **on_gpu)
        assert spec.proposed > 0 and spec.tokens.tolist() == plain.tokens.tolist()
    odd = HybridLM(HybridConfig(), seed=None)
    odd.cfg.mlp = "gelu"  # past the config's own check: a layout the engine cannot serve
    with pytest.raises(ValueError, match=r"engine: the serving engine cannot decode this: mlp"):
        _use_engine(True, odd, CacheConfig("replay"))
    with pytest.raises(ValueError, match=r"engine: expected 'auto', True or False, got 'yes'"):
        generate(root / "target", PROMPT, 4, "replay", engine="yes")
    code, out = run_cli(
        capsys, "generate", root / "target", "--prompt-ids", ",".join(map(str, PROMPT)),
        "--max-new-tokens", 12, "--engine", "on", "--json",
    )  # fmt: skip
    assert code == 0 and out["tokens"] == want


@needs_grouped_bamba_norm
def test_generate_decodes_bamba_on_the_serving_engine(checkpoints):
    """Bamba (RoPE, SwiGLU) decodes on the engine's reference path: transformers' tokens."""
    root, _, bamba = checkpoints
    bamba_want = hf_greedy(bamba, PROMPT, 6)
    for draft in (None, "prompt-lookup"):
        run = generate(root / "bamba", PROMPT, 6, "replay", draft, 3, engine=True)
        assert "engine" in run.extra and run.tokens[0].tolist() == bamba_want, draft


@needs_grouped_bamba_norm
def test_generate_a_bamba_checkpoint(checkpoints, capsys):
    root, _, bamba = checkpoints
    code, out = run_cli(
        capsys,
        "generate",
        root / "bamba",
        "--prompt-ids",
        "4,8,15,16,23,42",
        "--max-new-tokens",
        10,
        "--draft",
        "prompt-lookup",
    )
    assert code == 0 and out["tokens"] == hf_greedy(bamba, [4, 8, 15, 16, 23, 42], 10)


def hf_assisted(hf, prompt, n, assistant):
    """transformers' assisted (speculative) greedy generation, drafting with ``assistant``."""
    ids = torch.tensor([prompt])
    assistant.generation_config.num_assistant_tokens = 3  # short drafts: many rounds
    assistant.generation_config.num_assistant_tokens_schedule = "constant"
    with torch.no_grad():
        out = hf.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=n,
            min_new_tokens=n,
            do_sample=False,
            assistant_model=assistant,
        )
    return out[0, len(prompt) :].tolist()


def test_transformers_assisted_generation_per_release(checkpoints):
    """Up to transformers 5.24 assisted generation refuses these hybrids (their model classes
    are stateful: no way back from a rejected draft). From 5.25 their caches record past
    recurrent states while verifying drafts (``activate_past_recording``) and roll back with
    ``crop``, one snapshot per draft token, and the assisted tokens equal greedy ones, with the
    target itself and with a smaller NemotronH as the draft. (A round rejecting every draft
    restores one token too far in 5.25.0: ``tests/test_hf_cache.py::test_rejecting_every_draft``
    shows it on the trained model; these tiny models' tokens do not move.)"""
    import transformers
    from packaging.version import Version

    root, target, _ = checkpoints
    draft = type(target).from_pretrained(root / "draft").eval()
    if Version(transformers.__version__) < Version("5.25"):
        with pytest.raises(ValueError, match="assisted generation is not supported with stateful"):
            hf_assisted(target, PROMPT, 4, target)
        return
    want = hf_greedy(target, PROMPT, 12)
    assert hf_greedy(draft, PROMPT, 12) != want  # the draft is wrong at times: rollbacks happen
    for assistant in (target, draft):
        assert hf_assisted(target, PROMPT, 12, assistant) == want


def test_bad_input_gets_a_clear_error(checkpoints, capsys, tmp_path):
    root, _, _ = checkpoints
    from transformers import LlamaConfig, NemotronHConfig

    LlamaConfig(
        vocab_size=10,
        hidden_size=8,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=16,
    ).save_pretrained(tmp_path / "llama")
    code, err = run_cli(capsys, "generate", tmp_path / "llama", "--prompt-ids", "1,2")
    assert (
        code == 2
        and "expected a supported hybrid (nemotron_h, bamba), got model_type 'llama'" in err
    )
    (tmp_path / "empty").mkdir()
    NemotronHConfig(vocab_size=97).save_pretrained(tmp_path / "empty")
    code, err = run_cli(capsys, "generate", tmp_path / "empty", "--prompt-ids", "1,2")
    assert code == 2 and "no weights" in err
    other = tiny_nemotron_h("M-")
    other.config.vocab_size = 97
    from transformers import NemotronHForCausalLM

    small = NemotronHForCausalLM(
        NemotronHConfig(
            vocab_size=50,
            hidden_size=32,
            num_hidden_layers=2,
            hybrid_override_pattern="M-",
            mamba_num_heads=4,
            mamba_head_dim=8,
            ssm_state_size=16,
            n_groups=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=8,
            intermediate_size=48,
        )
    )
    small.save_pretrained(tmp_path / "small_vocab")
    code, err = run_cli(
        capsys,
        "generate",
        root / "target",
        "--prompt-ids",
        "1,2,3",
        "--draft",
        tmp_path / "small_vocab",
    )
    assert code == 2 and "vocabulary of 50 tokens, expected the target's 97" in err
    code, err = run_cli(capsys, "generate", root / "target", "--prompt-ids", "1,200")
    assert code == 2 and "expected a non-empty list of ids in [0, 97)" in err
    from replaylab.generate import generate

    # floats were truncated to ids ([1.7, 2.9] decoded [1, 2]); an int or text raised inside
    for ids, error, match in (
        ([1.7, 2.9], TypeError, r"prompt_ids\[0\]: expected an integer, got float 1.7"),
        ([1, True], TypeError, r"prompt_ids\[1\]: expected an integer, got a boolean"),
        (5, TypeError, r"prompt_ids: expected a list of integer token ids, got int 5"),
        ("12", TypeError, r"prompt_ids: expected a list of integer token ids, got str '12'"),
    ):
        with pytest.raises(error, match=match):
            generate(root / "target", ids, max_new_tokens=2)
    with pytest.raises(TypeError, match=r"max_new_tokens: expected an integer, got str '3'"):
        generate(root / "target", [1, 2], max_new_tokens="3")
    for kw, match in (  # each raised deep inside (an AssertionError, "Invalid device string")
        (dict(device="bogus"), r"device: expected a torch device such as 'cpu' or 'cuda', got 'bogus'"),
        (dict(dtype="float16"), r"dtype: expected a floating-point torch.dtype or None, got 'float16'"),
        (dict(engine=1), r"engine: expected 'auto', True or False, got 1"),
    ):  # fmt: skip
        with pytest.raises(ValueError, match=match):
            generate(root / "target", [1, 2], **kw)
    if not torch.cuda.is_available():
        with pytest.raises(
            ValueError, match=r"device: cuda asked for, but this machine has no CUDA"
        ):
            generate(root / "target", [1, 2], device="cuda")
    code, err = run_cli(
        capsys, "generate", root / "target", "--prompt-ids", "1,99999999999999999999"
    )
    assert code == 2 and "expected a non-empty list of ids in [0, 97)" in err  # an overflow before
    from replaylab.model import HybridLM, load_transformers_hybrid

    model = load_transformers_hybrid(root / "target")
    assert isinstance(model, HybridLM)
    with pytest.raises(TypeError, match=r"source: this is already a replaylab HybridLM"):
        load_transformers_hybrid(model)
    with pytest.raises(TypeError, match=r"source: expected a transformers model or a folder"):
        load_transformers_hybrid(None)


# ---------------------------------------------------------------- text, EOS, the trained pair

MODELS = Path(__file__).resolve().parents[1] / "data" / "models"
TARGET, DRAFT = MODELS / "replaylab-code-10m", MODELS / "replaylab-code-draft"


def copy_folder(src, dst, link_weights=True):
    """A copy of a checkpoint folder whose weights are links (cheap for the 20 MB target)."""
    dst.mkdir()
    for f in src.iterdir():
        if f.suffix == ".safetensors" and link_weights:
            (dst / f.name).symlink_to(f)
        else:
            shutil.copy(f, dst / f.name)
    return dst


def test_generation_stops_at_eos_as_transformers_does(checkpoints, capsys, tmp_path):
    root, target, _ = checkpoints
    full = hf_greedy(target, PROMPT, 12)
    eos = next(t for i, t in enumerate(full) if i >= 3 and t not in full[:i])
    stop = full.index(eos) + 1
    folder = copy_folder(root / "target", tmp_path / "eos")
    config = json.loads((folder / "generation_config.json").read_text())
    (folder / "generation_config.json").write_text(json.dumps({**config, "eos_token_id": eos}))
    ids = torch.tensor([PROMPT])
    with torch.no_grad():
        want = target.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=12,
            do_sample=False,
            eos_token_id=eos,
        )[0, len(PROMPT) :].tolist()
    assert want == full[:stop] and stop < 12  # transformers stops there
    for draft in ("none", "prompt-lookup", root / "draft"):
        args = ["generate", folder, "--prompt-ids", ",".join(map(str, PROMPT))]
        code, out = run_cli(capsys, *args, "--max-new-tokens", 12, "--draft", draft)
        assert code == 0 and out["tokens"] == want and out["stopped_at_eos"], draft
        code, out = run_cli(capsys, *args, "--max-new-tokens", 12, "--draft", draft, "--ignore-eos")
        assert code == 0 and out["tokens"] == full and not out["stopped_at_eos"], draft


def test_text_prompt_on_the_trained_model_equals_transformers(capsys):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    prompt = "def fibonacci(n):"
    tok = AutoTokenizer.from_pretrained(TARGET)
    hf = AutoModelForCausalLM.from_pretrained(TARGET, dtype=torch.float32).eval()
    ids = tok(prompt, return_tensors="pt").input_ids
    with torch.no_grad():
        out = hf.generate(
            ids, attention_mask=torch.ones_like(ids), max_new_tokens=24, do_sample=False
        )
    want = tok.decode(out[0, ids.shape[1] :])
    run = generate(TARGET, prompt=prompt, max_new_tokens=24)
    assert run.extra["text"] == want and run.tokens[0].tolist() == out[0, ids.shape[1] :].tolist()
    assert "\n" in want and want.strip()  # it writes lines of code
    for draft in ("prompt-lookup", DRAFT):
        code = main(
            [
                "generate",
                str(TARGET),
                "--prompt",
                prompt,
                "--max-new-tokens",
                "24",
                "--draft",
                str(draft),
                "--strategy",
                "recompute",
            ]
        )
        printed = capsys.readouterr().out
        assert code == 0 and printed.startswith(prompt + want + "\n--- ")
        assert "drafts accepted" in printed and "stopped at EOS" in printed


def test_bad_text_input_gets_a_clear_error(checkpoints, capsys, tmp_path):
    root, _, _ = checkpoints
    code, err = run_cli(capsys, "generate", TARGET, "--prompt", "")
    assert code == 2 and "prompt: '' encodes to no tokens" in err
    code, err = run_cli(capsys, "generate", root / "target", "--prompt", "def f():")
    assert code == 2 and "no tokenizer.json, so a text prompt cannot be encoded" in err
    # a draft whose tokenizer maps ids to other text
    other = copy_folder(DRAFT, tmp_path / "other_tok")
    spec = json.loads((other / "tokenizer.json").read_text())
    vocab = spec["model"]["vocab"]
    a, b = (k for k, v in vocab.items() if v in (300, 301))
    vocab[a], vocab[b] = vocab[b], vocab[a]
    (other / "tokenizer.json").write_text(json.dumps(spec))
    code, err = run_cli(capsys, "generate", TARGET, "--prompt", "x = 1", "--draft", other)
    assert code == 2 and "draft model: its tokenizer" in err and "differs from the target's" in err
    # a corrupt tokenizer.json
    broken = copy_folder(TARGET, tmp_path / "broken_tok")
    (broken / "tokenizer.json").write_text('{"version": "1.0", "model": ')
    code, err = run_cli(capsys, "generate", broken, "--prompt", "x = 1")
    assert code == 2 and "corrupt tokenizer.json" in err
    # a corrupt safetensors file
    cut = copy_folder(root / "target", tmp_path / "cut", link_weights=False)
    data = (cut / "model.safetensors").read_bytes()
    (cut / "model.safetensors").write_bytes(data[: len(data) // 2])
    code, err = run_cli(capsys, "generate", cut, "--prompt-ids", "1,2,3")
    assert code == 2 and "model.safetensors: corrupt safetensors file" in err
