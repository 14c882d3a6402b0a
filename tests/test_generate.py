"""``replaylab generate`` on transformers checkpoints: transformers' own greedy tokens, under
every strategy and draft; clear errors for bad input; and transformers' refusal recorded."""

import json

import pytest
import torch
from test_model import tiny_bamba, tiny_nemotron_h

from replaylab.cli import main


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
    root, target, _ = checkpoints
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


def test_transformers_refuses_assisted_generation_for_these_models(checkpoints):
    _, target, _ = checkpoints
    ids = torch.tensor([PROMPT])
    with pytest.raises(ValueError, match="assisted generation is not supported with stateful"):
        target.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=4,
            do_sample=False,
            assistant_model=target,
        )


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
