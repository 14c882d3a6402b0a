"""The Gated DeltaNet replay kernels and snapshot step (``replaylab.kernels.gdn``) against the
float64 token recurrence (``replaylab.scan.gdn_scan``) and their PyTorch references, under Triton's
interpreter on CPU and natively on a GPU. Sizes are awkward on purpose (K, V not powers of
two, value heads sharing key heads, ragged and wrapped logs, branches sharing a slot)."""

import pytest
import torch

from replaylab import assert_close
from replaylab.gated_deltanet import l2_normalize
from replaylab.kernels.gdn import (
    corrected_updates,
    fold,
    fold_ref,
    replay_step,
    replay_step_ref,
    state_update,
    state_update_ref,
)
from replaylab.scan import gdn_scan
from replaylab.testing import DEVICE


def tokens(batch, T, H=4, Hk=2, K=12, V=10, dtype=torch.float32, seed=0):
    """Random q, k (unit norm, q scaled as the model does), v, g <= 0, β in (0, 1)."""
    gen = torch.Generator().manual_seed(seed)
    r = lambda *s: torch.randn(*s, generator=gen)  # noqa: E731
    q = l2_normalize(r(batch, T, Hk, K)) * K**-0.5
    k = l2_normalize(r(batch, T, Hk, K))
    out = dict(
        q=q.to(dtype),
        k=k.to(dtype),
        v=r(batch, T, H, V).to(dtype),
        g=-torch.rand(batch, T, H, generator=gen) * 0.5,
        beta=torch.rand(batch, T, H, generator=gen).to(dtype),
    )
    return {name: t.to(DEVICE) for name, t in out.items()}


def oracle(state, toks):
    """o and final state in float64 by the token recurrence."""
    f64 = {name: t.double() for name, t in toks.items()}
    return gdn_scan(**f64, initial_state=state.double(), compute_dtype=torch.float64)


def empty_log(batch, Lmax, H=4, Hk=2, K=12, V=10, dtype=torch.float32):
    return dict(
        log_k=torch.zeros(batch, Lmax, Hk, K, dtype=dtype, device=DEVICE),
        log_u=torch.zeros(batch, Lmax, H, V, device=DEVICE),
        log_g=torch.zeros(batch, Lmax, H, device=DEVICE),
    )


def run_tokens(step, states, slots, log, log_len, toks, head=None, chunk=1):
    """Feed ``toks`` through ``step`` ``chunk`` tokens at a time; returns the outputs."""
    T = toks["v"].shape[1]
    outs = []
    for start in range(0, T, chunk):
        part = {name: t[:, start : start + chunk] for name, t in toks.items()}
        outs.append(step(states, slots, **log, log_len=log_len, **part, log_head=head))
    return torch.cat(outs, 1)


@pytest.mark.parametrize("step", [replay_step, replay_step_ref], ids=["triton", "ref"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_decode_from_checkpoint_and_log_equals_the_float64_recurrence(step, dtype):
    batch, T, Lmax = 3, 13, 16
    states = torch.randn(2, 4, 12, 10, device=DEVICE) * 0.3
    slots = torch.tensor([1, 0, 1], dtype=torch.int32, device=DEVICE)  # rows 0, 2 share slot 1
    toks = tokens(batch, T, dtype=dtype)
    log = empty_log(batch, Lmax, dtype=dtype)
    log_len = torch.zeros(batch, dtype=torch.int32, device=DEVICE)
    head = torch.tensor([0, 5, 15], dtype=torch.int32, device=DEVICE)  # ring wraps
    o = run_tokens(step, states, slots, log, log_len, toks, head)
    assert log_len.tolist() == [T] * batch
    want = oracle(states[slots.long()], toks).y
    tol = 2e-5 if dtype == torch.float32 else 2e-2
    assert_close(o.double(), want, atol=tol, rtol=tol)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_verify_rows_are_single_steps_bit_for_bit(dtype):
    """A verify of 3 tokens (one launch) gives bit for bit what 3 one-token steps give, outputs
    and ring, over a ring that wraps, with logs of different lengths."""
    verify_equals_single_steps(batch=2, H=4, Hk=2, K=12, V=10, T=3, dtype=dtype)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_verify_rows_are_single_steps_bit_for_bit_compiled_at_full_size(dtype):
    """Qwen3.5-class heads (16 key heads of 128 shared by 32 value heads of 128), T = 5."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device (run on the GPU machine)")
    verify_equals_single_steps(batch=3, H=32, Hk=16, K=128, V=128, T=5, dtype=dtype)


def verify_equals_single_steps(batch, H, Hk, K, V, T, dtype, Lmax=20):
    gen = torch.Generator().manual_seed(1)
    states = (torch.randn(batch, H, K, V, generator=gen) * 0.3).to(DEVICE)
    slots = torch.arange(batch, dtype=torch.int32, device=DEVICE)
    log = empty_log(batch, Lmax, H, Hk, K, V, dtype=dtype)
    for name, t in log.items():
        fill = torch.randn(t.shape, generator=gen) * (0.1 if name == "log_u" else 1.0)
        t.copy_(-fill.abs() * 0.3 if name == "log_g" else fill)
    log["log_k"].copy_(l2_normalize(log["log_k"].float()).to(dtype))
    head = torch.tensor([0, 17, 9][:batch], dtype=torch.int32, device=DEVICE)  # rows wrap
    start = torch.tensor([0, 6, 11][:batch], dtype=torch.int32, device=DEVICE)
    toks = tokens(batch, 8, H, Hk, K, V, dtype=dtype, seed=2)
    outs, logs = [], []
    for chunk in (1, T):
        ring = {name: t.clone() for name, t in log.items()}
        log_len = start.clone()
        outs.append(run_tokens(replay_step, states, slots, ring, log_len, toks, head, chunk))
        logs.append(ring)
    assert torch.equal(outs[0], outs[1])
    for name in logs[0]:
        assert torch.equal(logs[0][name], logs[1][name]), name


@pytest.mark.parametrize("step", [replay_step, replay_step_ref], ids=["triton", "ref"])
def test_padding_appends_nothing(step):
    batch, Lmax = 2, 8
    states = torch.randn(batch, 4, 12, 10, device=DEVICE)
    slots = torch.arange(batch, dtype=torch.int32, device=DEVICE)
    log = empty_log(batch, Lmax)
    for t in log.values():
        t.normal_()
    before = {name: t.clone() for name, t in log.items()}
    log_len = torch.tensor([2, 5], dtype=torch.int32, device=DEVICE)
    count = torch.tensor([0, 2], dtype=torch.int32, device=DEVICE)
    step(states, slots, **log, log_len=log_len, **tokens(batch, 3), append_count=count)
    for name in log:
        assert torch.equal(log[name][0], before[name][0]), name  # sequence 0: all padding
        assert torch.equal(log[name][1, :5], before[name][1, :5]), name
        assert torch.equal(log[name][1, 7:], before[name][1, 7:]), name  # its third token
        assert not torch.equal(log[name][1, 5:7], before[name][1, 5:7]), name


@pytest.mark.parametrize("fold_fn", [fold, fold_ref], ids=["triton", "ref"])
def test_fold_writes_the_state_after_the_logged_tokens(fold_fn):
    batch, T, Lmax = 3, 11, 16
    states = torch.randn(3, 4, 12, 10, device=DEVICE) * 0.3
    slots = torch.tensor([2, 0, 2], dtype=torch.int32, device=DEVICE)
    toks = tokens(batch, T, seed=2)
    log = empty_log(batch, Lmax)
    log_len = torch.zeros(batch, dtype=torch.int32, device=DEVICE)
    head = torch.tensor([9, 0, 3], dtype=torch.int32, device=DEVICE)
    run_tokens(replay_step_ref, states, slots, log, log_len, toks, head)
    fold_len = torch.tensor([11, 4, 0], dtype=torch.int32, device=DEVICE)
    out = torch.full((4, 4, 12, 10), float("nan"), device=DEVICE)
    dst = torch.tensor([1, 3, 0], dtype=torch.int32, device=DEVICE)
    fold_fn(states, slots, out, dst, **log, fold_len=fold_len, log_head=head)
    for b in range(batch):
        j = int(fold_len[b])
        part = {name: t[b : b + 1, :j] for name, t in toks.items()}
        want = oracle(states[int(slots[b])][None], part).state[0]
        assert_close(out[int(dst[b])].double(), want, atol=2e-5, rtol=2e-5)
    assert out[2].isnan().all()  # no sequence writes slot 2


def test_fold_in_place_folds_only_the_named_sequences():
    batch, T, Lmax = 2, 6, 8
    states = torch.randn(batch, 4, 12, 10, device=DEVICE) * 0.3
    slots = torch.arange(batch, dtype=torch.int32, device=DEVICE)
    toks = tokens(batch, T, seed=3)
    log = empty_log(batch, Lmax)
    log_len = torch.zeros(batch, dtype=torch.int32, device=DEVICE)
    run_tokens(replay_step, states, slots, log, log_len, toks)
    before = states.clone()
    fold(states, slots, states, slots, **log, fold_len=torch.tensor([T, 0]).int().to(DEVICE))
    assert torch.equal(states[1], before[1])
    assert_close(states[0].double(), oracle(before[:1], {n: t[:1] for n, t in toks.items()}).state[0], atol=2e-5, rtol=2e-5)  # fmt: skip


def test_corrected_updates_fill_a_log_that_replays_like_decode():
    batch, T, Lmax = 2, 7, 8
    states = torch.randn(batch, 4, 12, 10, device=DEVICE) * 0.3
    slots = torch.arange(batch, dtype=torch.int32, device=DEVICE)
    toks = tokens(batch, T + 1, seed=4)
    prompt = {n: t[:, :T] for n, t in toks.items()}
    u, final = corrected_updates(states, prompt["k"], prompt["v"], prompt["g"], prompt["beta"])
    assert_close(final.double(), oracle(states, prompt).state, atol=2e-5, rtol=2e-5)
    log = empty_log(batch, Lmax)
    log["log_k"][:, :T], log["log_u"][:, :T], log["log_g"][:, :T] = prompt["k"], u, prompt["g"]
    log_len = torch.full((batch,), T, dtype=torch.int32, device=DEVICE)
    last = {n: t[:, T:] for n, t in toks.items()}
    o = replay_step(states, slots, **log, log_len=log_len, **last)
    assert_close(o.double(), oracle(states, toks).y[:, T:], atol=2e-5, rtol=2e-5)


@pytest.mark.parametrize("T", [1, 16, 37])
def test_the_chunked_form_gives_the_token_recurrences_updates(T):
    """``gdn_chunked_scan(..., return_updates=True)`` solves for the corrected updates u_t that
    ``corrected_updates`` builds token by token: both equal those of the float64 recurrence's
    states to fp32 rounding, chunks of every fill (T = 37: two whole chunks of 16 and a part); and
    ``GatedDeltaNetSpec.corrected_updates`` switches to the chunked form at
    ``UPDATES_CHUNKED_MIN_TOKENS``."""
    from replaylab.gated_deltanet import GatedDeltaNetSpec
    from replaylab.scan import gdn_chunked_scan

    states = torch.randn(2, 4, 12, 10, device=DEVICE) * 0.3
    toks = tokens(2, T, seed=6)
    fields = [toks[f] for f in ("k", "v", "g", "beta")]
    # the float64 oracle: u_t = β_t (v_t - α_t S_{t-1}ᵀ k_t) from the recurrence's states
    run = gdn_scan(**{n: t.double() for n, t in toks.items()}, initial_state=states.double(),
                   return_states=True, compute_dtype=torch.float64)  # fmt: skip
    before = torch.cat([states.double()[:, None], run.states[:, :-1]], 1)  # S_{t-1}
    k64 = toks["k"].double().repeat_interleave(2, dim=2)  # 2 value heads per key head
    read = torch.einsum("bthkv,bthk->bthv", before, k64) * toks["g"].double().exp()[..., None]
    want = toks["beta"].double()[..., None] * (toks["v"].double() - read)
    want_state = run.state
    loop, _ = corrected_updates(states, *fields)
    chunked = gdn_chunked_scan(None, *fields, initial_state=states, chunk_size=16,
                               return_updates=True)  # fmt: skip
    assert chunked.updates.dtype == torch.float32 and chunked.updates.shape == fields[1].shape
    assert_close(chunked.updates.double(), want, atol=2e-5, rtol=2e-5)
    assert_close(loop.double(), want, atol=2e-5, rtol=2e-5)
    assert_close(chunked.state.double(), want_state, atol=2e-5, rtol=2e-5)

    spec = GatedDeltaNetSpec.__new__(GatedDeltaNetSpec)  # only the class's thresholds are read
    spec.UPDATES_CHUNKED_MIN_TOKENS = T
    assert torch.equal(spec.corrected_updates(states, toks), chunked.updates)
    spec.UPDATES_CHUNKED_MIN_TOKENS = T + 1
    assert torch.equal(spec.corrected_updates(states, toks), loop)


def test_bad_input_names_both_values():
    batch, Lmax = 2, 4
    states = torch.zeros(batch, 4, 12, 10, device=DEVICE)
    slots = torch.arange(batch, dtype=torch.int32, device=DEVICE)
    log = empty_log(batch, Lmax)
    log_len = torch.zeros(batch, dtype=torch.int32, device=DEVICE)
    toks = tokens(batch, 1)
    with pytest.raises(ValueError, match=r"v: expected \(2, 1, 4, 10\).*got \(2, 1, 4, 9\)"):
        replay_step(states, slots, **log, log_len=log_len, **{**toks, "v": toks["v"][..., :9]})
    with pytest.raises(ValueError, match="states' H=4 is not a multiple of log_k's Hk=3"):
        bad = {**log, "log_k": torch.zeros(batch, Lmax, 3, 12, device=DEVICE)}
        replay_step(states, slots, **bad, log_len=log_len, **toks)
    with pytest.raises(
        ValueError, match="k: dtype torch.bfloat16 differs from log_k's torch.float32"
    ):
        replay_step(states, slots, **log, log_len=log_len, **{**toks, "k": toks["k"].bfloat16()})
    with pytest.raises(ValueError, match="states: expected float32"):
        replay_step(states.double(), slots, **log, log_len=log_len, **toks)
    with pytest.raises(
        ValueError, match=r"out: expected v's shape \(2, 1, 4, 10\), got \(1, 1, 1, 1\)"
    ):
        replay_step(states, slots, **log, log_len=log_len, **toks, out=torch.empty(1, 1, 1, 1))
    with pytest.raises(
        ValueError, match=r"log_len: appending needs log_len \+ tokens appended <= Lmax=4"
    ):
        full = torch.full((batch,), Lmax, dtype=torch.int32, device=DEVICE)
        replay_step(states, slots, **log, log_len=full, **toks)
    with pytest.raises(ValueError, match=r"slots: expected values in \[0, 1\], got \[0, 2\]"):
        far = torch.tensor([0, 2], dtype=torch.int32, device=DEVICE)
        replay_step(states, far, **log, log_len=log_len, **toks)
    with pytest.raises(ValueError, match=r"fold_len: expected values in \[0, 4\], got \[5, 0\]"):
        over = torch.tensor([5, 0], dtype=torch.int32, device=DEVICE)
        fold(states, slots, states, slots, **log, fold_len=over)


def snapshot_case(dtype=torch.float32, T=3, batch=3, slots=4, seed=1):
    """``state_update``'s arguments: a pool of ``slots`` states (rows past the batch are not
    the kernel's), T new tokens, counts 0, 2 and T (a ragged step's padding), NaN drafts."""
    toks = tokens(batch, T, dtype=dtype, seed=seed)
    gen = torch.Generator().manual_seed(seed + 100)
    return dict(
        state=torch.randn(slots, 4, 12, 10, generator=gen).to(DEVICE),
        **toks,
        drafts=torch.full((slots, T + 1, 4, 12, 10), float("nan"), device=DEVICE),
        counts=torch.tensor([0, 2, T][:batch], dtype=torch.int32, device=DEVICE),
    )


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_state_update_matches_the_float64_recurrence_and_reference(dtype):
    """The snapshot step (K = 12, V = 10 over blocks of 4 values, two value heads a key head):
    o, the state written (after counts[b] = 0, 2, T tokens) and the drafts (the state after
    each token) against float64 and the PyTorch reference; rows past the batch and drafts past
    T are left alone."""
    c = snapshot_case(dtype)
    tri = {n: t.clone() for n, t in c.items()}
    ref = {n: t.clone() for n, t in c.items()}
    o = state_update(**tri, block_v=4)
    o_ref = state_update_ref(**ref)
    batch, T = c["v"].shape[:2]
    toks = {n: c[n] for n in ("q", "k", "v", "g", "beta")}
    f64 = {n: t.double() for n, t in toks.items()}
    want = gdn_scan(**f64, initial_state=c["state"][:batch].double(), return_states=True,
                    compute_dtype=torch.float64)  # fmt: skip
    assert o.dtype == dtype
    assert_close(o.double(), want.y, dtype=dtype, name="o vs float64")
    assert_close(o, o_ref, dtype=dtype, name="o vs reference")
    for b, n in enumerate(c["counts"].tolist()):
        after = c["state"][b].double() if n == 0 else want.states[b, n - 1]
        assert_close(tri["state"][b].double(), after, dtype=torch.float32, name=f"state {b}")
        assert_close(tri["state"][b], ref["state"][b], name=f"state {b} vs reference")
        assert_close(tri["drafts"][b, :T].double(), want.states[b], dtype=torch.float32,
                     name=f"drafts {b}")  # fmt: skip
    assert torch.equal(tri["state"][0], c["state"][0])  # count 0: the state as it was
    assert torch.equal(tri["state"][3], c["state"][3])  # not a row of the batch
    assert torch.isnan(tri["drafts"][:, T]).all() and torch.isnan(tri["drafts"][3]).all()
    strided = {n: c[n].transpose(-1, -2).contiguous().transpose(-1, -2) for n in ("q", "k", "v")}
    assert not strided["v"].is_contiguous()  # a verify's views of the mixer's projections
    again = {**{n: t.clone() for n, t in c.items()}, **strided}
    assert torch.equal(state_update(**again, block_v=4), o)
    assert torch.equal(again["state"], tri["state"])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_snapshot_verify_equals_single_steps_bit_for_bit(dtype):
    """T tokens in one ``state_update`` give the outputs and states of T one-token calls bit
    for bit: a snapshot's speculation is lossless."""
    T = 4
    c = snapshot_case(dtype, T=T)
    batch = c["v"].shape[0]
    together = {n: t.clone() for n, t in c.items()}
    o_all = state_update(**{**together, "counts": None}, block_v=4)
    apart = c["state"].clone()
    for t in range(T):
        one = {n: c[n][:, t : t + 1] for n in ("q", "k", "v", "g", "beta")}
        o_t = state_update(apart, **one, block_v=4)
        assert torch.equal(o_t[:, 0], o_all[:, t]), t
        assert torch.equal(apart[:batch], together["drafts"][:batch, t]), t
    assert torch.equal(apart, together["state"])


def test_bad_state_update_input_is_named_before_anything_changes():
    c = snapshot_case()
    cases = [
        (dict(v=c["v"][..., :9]), r"v: expected \(3, 3, 4, 10\) .*got \(3, 3, 4, 9\)"),
        (dict(counts=torch.tensor([0, 4, 1], dtype=torch.int32, device=DEVICE)),
         r"counts: expected values in \[0, 3\], got \[0, 4, 1\]"),
        (dict(counts=c["counts"].long()), r"counts: expected int32 of shape \(3,\)"),
        (dict(drafts=c["drafts"][:, :2].contiguous()),
         r"drafts: 4 slots x 2 tokens, need at least \(3, 3\)"),
        (dict(state=c["state"][:2].contiguous()), r"state: 2 rows, need one per sequence \(3\)"),
        (dict(state=c["state"].double()), r"state: expected a contiguous float32 pool"),
        (dict(q=c["q"][:, :, :1].repeat(1, 1, 3, 1), k=c["k"][:, :, :1].repeat(1, 1, 3, 1)),
         r"heads: the state's H=4 is not a multiple of q's Hk=3"),
    ]  # fmt: skip
    for change, message in cases:
        for kernel in (state_update, state_update_ref):
            bad = {**{n: t.clone() for n, t in c.items()}, **change}
            with pytest.raises(ValueError, match=message):
                kernel(**bad)
            assert torch.isnan(bad["drafts"]).all(), message
            if bad["state"].shape == c["state"].shape:
                assert torch.equal(bad["state"], c["state"]), message
