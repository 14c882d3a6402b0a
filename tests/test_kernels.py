"""Triton replay kernels against their PyTorch references (the reference scan), under Triton's
interpreter on CPU (small shapes) and natively on a GPU. Outputs are poisoned before the
kernels write them; sizes are awkward on purpose (P, N, H not powers of two, T and log lengths
not either, ragged logs, branches sharing a checkpoint slot)."""

import math

import pytest
import torch

from replaylab import assert_close
from replaylab.kernels.mamba2 import fold, fold_ref, replay_step, replay_step_ref
from replaylab.testing import DEVICE

DTYPES = [torch.float32, torch.bfloat16, torch.float16]


def case(
    batch=3,
    H=6,
    P=5,
    N=7,
    G=3,
    Lmax=24,
    T=3,
    dtype=torch.float32,
    log_len=(0, 11, 19),
    slots=(1, 0, 1),
    n_slots=2,
):
    r = lambda *s: torch.randn(*s, device=DEVICE)  # noqa: E731
    return dict(
        states=r(n_slots, H, P, N),
        slots=torch.tensor(slots, dtype=torch.int32, device=DEVICE),
        log_x=r(batch, Lmax, H, P).to(dtype),
        log_dt=r(batch, Lmax, H) - 1,
        log_B=r(batch, Lmax, G, N).to(dtype),
        log_C=r(batch, Lmax, G, N).to(dtype),
        log_len=torch.tensor(log_len, dtype=torch.int32, device=DEVICE),
        x=r(batch, T, H, P).to(dtype),
        dt=r(batch, T, H) - 1,
        B=r(batch, T, G, N).to(dtype),
        C=r(batch, T, G, N).to(dtype),
        A=-torch.rand(H, device=DEVICE) * 3,
        D=r(H),
        dt_bias=torch.rand(H, device=DEVICE) - 0.5,
    )


def cloned(c):
    return {k: v.clone() for k, v in c.items()}


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("T", [1, 3])
def test_replay_step_matches_reference_and_appends_to_the_log(dtype, T):
    c = case(T=T, dtype=dtype)
    tri, ref = cloned(c), cloned(c)
    tri_y = torch.full_like(c["x"], float("nan"))
    replay_step(**tri, dt_limit=(0.001, math.inf), out=tri_y)
    ref_y = replay_step_ref(**ref, dt_limit=(0.001, math.inf))
    assert_close(tri_y, ref_y, dtype=dtype, name="y")
    for name in ("log_x", "log_dt", "log_B", "log_C", "log_len", "states"):
        assert torch.equal(tri[name], ref[name]), name
    assert tri["log_len"].tolist() == [n + T for n in c["log_len"].tolist()]


@pytest.mark.parametrize("kernel", ["per_token", "verify"])
@pytest.mark.parametrize("T", [2, 8])
def test_both_kernels_for_verification_match_the_reference(kernel, T):
    c = case(batch=3, H=4, P=16, N=16, G=2, Lmax=40, T=T, log_len=(0, 13, 21))
    tri, ref = cloned(c), cloned(c)
    tri_y = torch.full_like(c["x"], float("nan"))
    replay_step(**tri, out=tri_y, kernel=kernel)
    assert_close(tri_y, replay_step_ref(**ref), name=f"y ({kernel})")
    for name in ("log_x", "log_dt", "log_B", "log_C", "log_len"):
        assert torch.equal(tri[name], ref[name]), name


def test_replay_step_then_step_again_equals_one_scan():
    c = case(T=2, log_len=(0, 3, 7))
    ref = cloned(c)
    y1 = replay_step(**c)
    c2 = {k: v for k, v in case(T=2, log_len=(0, 0, 0)).items() if k in ("x", "dt", "B", "C")}
    y2 = replay_step(**{**c, **c2})
    ref_y1 = replay_step_ref(**ref)
    ref_y2 = replay_step_ref(**{**ref, **c2})
    assert_close(torch.cat([y1, y2], 1), torch.cat([ref_y1, ref_y2], 1), name="y over two steps")


@pytest.mark.parametrize("dtype", DTYPES)
def test_fold_matches_reference_and_writes_only_its_slots(dtype):
    c = case(dtype=dtype, Lmax=37)
    fold_len = torch.tensor([0, 5, 37], dtype=torch.int32, device=DEVICE)
    dst = torch.tensor([2, 3, 4], dtype=torch.int32, device=DEVICE)
    states = torch.cat([c["states"], torch.full((3, 6, 5, 7), float("nan"), device=DEVICE)])
    tri_states, ref_states = states.clone(), states.clone()
    args = (
        c["slots"],
        None,
        dst,
        c["log_x"],
        c["log_dt"],
        c["log_B"],
        fold_len,
        c["A"],
        c["dt_bias"],
        True,
        (0.001, math.inf),
    )
    fold(tri_states, args[0], tri_states, *args[2:])
    fold_ref(ref_states, args[0], ref_states, *args[2:])
    assert_close(tri_states, ref_states, dtype=torch.float32, name="folded states")
    assert torch.equal(tri_states[:2], states[:2])  # source slots untouched
    assert torch.equal(tri_states[2], states[1])  # j = 0: a copy of the checkpoint


@pytest.mark.gpu
@pytest.mark.parametrize("batch", [1, 32])
def test_full_size_8b_layer(batch):
    c = case(
        batch=batch,
        H=128,
        P=64,
        N=128,
        G=8,
        Lmax=80,
        T=4,
        dtype=torch.bfloat16,
        log_len=[(i * 7) % 64 for i in range(batch)],
        slots=list(range(batch)),
        n_slots=batch,
    )
    ref = cloned(c)
    assert_close(replay_step(**c), replay_step_ref(**ref), dtype=torch.bfloat16, name="y")


def test_bad_input_is_named():
    c = case()
    with pytest.raises(ValueError, match=r"slots: expected values in \[0, 2\), got \[1, 0, 5\]"):
        replay_step(**{**c, "slots": torch.tensor([1, 0, 5], dtype=torch.int32)})
    with pytest.raises(
        ValueError, match=r"log_len: appending needs log_len \+ tokens appended <= Lmax=24"
    ):
        replay_step(**{**c, "log_len": torch.tensor([0, 1, 22], dtype=torch.int32)})
    with pytest.raises(ValueError, match=r"states: expected float32 checkpoint states"):
        replay_step(**{**c, "states": c["states"].double()})
    # a negative length wrote log row -1 (it aborted the process under the interpreter)
    for log_len in ([0, -1, 2], [0, 1, 25]):
        with pytest.raises(ValueError, match=r"log_len: expected values in \[0, 24\], got"):
            replay_step(**{**c, "log_len": torch.tensor(log_len, dtype=torch.int32)})
    for fold_len in ([0, -1, 2], [0, 1, 25]):  # the fold names its own lengths
        with pytest.raises(ValueError, match=r"fold_len: expected values in \[0, 24\], got"):
            fold(c["states"], c["slots"], c["states"], c["slots"], c["log_x"], c["log_dt"],
                 c["log_B"], torch.tensor(fold_len, dtype=torch.int32), c["A"])  # fmt: skip


def test_shapes_that_disagree_are_refused_by_name_before_the_log_changes():
    """The kernels index every tensor by offsets from the shapes of x and the log: a tensor
    that disagrees read and wrote outside itself (heap corruption under the interpreter)."""
    c = case()
    H, P, G, N = 6, 5, 3, 7
    bad = [  # each size is listed in every tensor that has it: the odd one out shows
        ("x", torch.randn(3, 3, H + 1, P), r"H: the tensors disagree on this size: .*, x 7,"),
        ("dt", torch.randn(3, 3, H - 1), r"H: the tensors disagree .*, dt 5,"),
        ("B", torch.randn(3, 3, G, N + 4), r"N: the tensors disagree .*log_C 7, B 11, C 7"),
        (
            "C",
            torch.randn(3, 2, G, N),
            r"T: the tensors disagree on this size: x 3, dt 3, B 3, C 2",
        ),
        ("A", torch.randn(1), r"H: the tensors disagree .*, A 1,"),
        ("D", torch.randn(H + 2), r"H: the tensors disagree .*, D 8,"),
        ("dt_bias", torch.randn(2), r"H: the tensors disagree .*, dt_bias 2"),
        (
            "states",
            torch.randn(2, H, P, N + 1),
            r"N: the tensors disagree on this size: states 8, log_B 7",
        ),
        (
            "log_B",
            torch.randn(3, 24, G, N + 4),
            r"N: the tensors disagree on this size: states 7, log_B 11, log_C 7",
        ),
        (
            "log_C",
            torch.randn(3, 24, G),
            r"log_C: expected 4 dims \(batch, Lmax, G, N\), got shape \(3, 24, 3\)",
        ),
        ("out", torch.empty(1, 1, 1, 1), r"H: the tensors disagree .*, dt_bias 6, out 1"),
    ]
    for name, value, match in bad:
        given = cloned(c)
        before = cloned(given)
        with pytest.raises(ValueError, match=match):
            replay_step(**{**given, name: value})
        for key in ("log_x", "log_dt", "log_B", "log_C", "log_len", "states"):
            assert torch.equal(given[key], before[key]), (name, key)
    with pytest.raises(
        ValueError, match=r"N: the tensors disagree on this size: states 7, log_B 11"
    ):
        fold(c["states"], c["slots"], c["states"], c["slots"], c["log_x"], c["log_dt"],
             torch.randn(3, 24, G, N + 4), c["log_len"], c["A"])  # fmt: skip
    with pytest.raises(
        ValueError, match=r"log_B, log_C, B, C: their G=4 groups do not divide H=6 heads"
    ):
        replay_step(**case(G=4))
    c4 = case(G=4)
    with pytest.raises(ValueError, match=r"^log_B: their G=4 groups do not divide H=6 heads"):
        fold(c4["states"], c4["slots"], c4["states"], c4["slots"], c4["log_x"], c4["log_dt"],
             c4["log_B"], c4["log_len"], c4["A"])  # fmt: skip
    with pytest.raises(ValueError, match=r"N: the tensors disagree on this size: out 3, log_B 7"):
        fold(c["states"], c["slots"], torch.zeros(2, H, P, 3), c["slots"], c["log_x"],
             c["log_dt"], c["log_B"], c["log_len"], c["A"])  # fmt: skip


def test_permuted_views_as_inputs():
    """Inputs as the model makes them: channel-major views of a transposed conv output."""
    H, G, P, N, T = 3, 3, 8, 8, 5
    conv = torch.randn(1, H * P + 2 * G * N, T, device=DEVICE).transpose(1, 2)
    x = conv[..., : H * P].unflatten(-1, (H, P))
    B = conv[..., H * P : H * P + G * N].unflatten(-1, (G, N))
    C = conv[..., H * P + G * N :].unflatten(-1, (G, N))
    c = case(batch=1, H=H, G=G, P=P, N=N, T=T, log_len=(3,), slots=(0,), n_slots=1)
    c.update(x=x, B=B, C=C)
    ref = cloned({k: v.contiguous() for k, v in c.items()})
    assert_close(replay_step(**cloned(c)), replay_step_ref(**ref), name="y")


def test_inputs_in_another_dtype_than_the_log_and_offsets_that_would_overflow():
    c = case(T=2, dtype=torch.float32)
    mixed = cloned(c)
    for name in ("x", "B", "C"):
        mixed[name] = mixed[name].bfloat16()  # a bf16 model over an fp32 log
    rounded = cloned(c)
    for name in ("x", "B", "C"):
        rounded[name] = rounded[name].bfloat16().float()
    y = replay_step(**mixed)
    assert y.dtype == torch.bfloat16  # outputs in the inputs' dtype
    assert_close(y, replay_step(**rounded), dtype=torch.bfloat16, name="y")
    big = dict(cloned(c), log_x=c["log_x"][:, :1].expand(3, 2**25, 6, 5))  # no memory
    with pytest.raises(ValueError, match=r"exceed the kernels' 32-bit offsets"):
        replay_step(**big, check=False)


@pytest.mark.gpu
@pytest.mark.parametrize("T", [1, 5])
def test_full_size_append_equals_a_separate_append(T):
    """append=True (the fused engine's path) gives the outputs of append=False and writes
    exactly the new inputs at the cursor, at the 8B layer's size, compiled."""
    batch = 2
    c = case(
        batch=batch,
        H=128,
        P=64,
        N=128,
        G=8,
        Lmax=21,
        T=T,
        dtype=torch.bfloat16,
        log_len=[11, 3],
        slots=[0, 1],
        n_slots=batch,
    )
    c["log_dt"], c["dt"] = c["log_dt"].bfloat16(), c["dt"].bfloat16()
    plain, appended = cloned(c), cloned(c)
    y0 = replay_step(**plain, append=False)
    y1 = replay_step(**appended, append=True, advance=False)
    assert torch.equal(y0, y1)
    assert torch.equal(appended["log_len"], c["log_len"])
    for b, n in enumerate(c["log_len"].tolist()):
        for name in ("x", "dt", "B", "C"):
            log = appended[f"log_{name}"][b]
            assert torch.equal(log[n : n + T], c[name][b]), (name, b)
            assert torch.equal(log[:n], c[f"log_{name}"][b, :n]), (name, b)


@pytest.mark.parametrize("kernel", ["exact", "per_token"])
def test_padding_tokens_leave_the_ring_as_it_was(kernel):
    """A ragged batch: sequence b appends only its first append_count[b] tokens (0: none);
    the outputs of those tokens do not change, and the ring rows past them keep their values.
    (Under "exact" a padding token after the first reads the rows padding did not write: its
    output is undefined, as a padding token's is.)"""
    c = case(T=3, log_len=(0, 20, 19), Lmax=22)  # 19 + 3 would wrap onto entry 0
    count = torch.tensor([3, 1, 0], dtype=torch.int32, device=DEVICE)
    tri, ref = cloned(c), cloned(c)
    tri_y = replay_step(**tri, kernel=kernel, advance=False, append_count=count)
    ref_y = replay_step_ref(**ref, advance=False, append_count=count)
    defined = torch.arange(3, device=DEVICE)[None, :] <= count[:, None]  # up to the first pad
    defined = defined[:, :, None, None].expand_as(tri_y)
    assert_close(tri_y[defined], ref_y[defined], name="y")
    for name in ("log_x", "log_dt", "log_B", "log_C"):
        assert torch.equal(tri[name], ref[name]), name
        for b, (n, k) in enumerate(zip(c["log_len"].tolist(), count.tolist())):
            new, untouched = torch.arange(n, n + k) % 22, torch.arange(n + k, n + 3) % 22
            assert torch.equal(tri[name][b, new], c[name[4:]][b, :k].to(tri[name].dtype)), name
            assert torch.equal(tri[name][b, untouched], c[name][b, untouched]), (name, b)


@pytest.mark.parametrize("kernel", ["exact", "per_token"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_verify_rounds_as_single_steps_do(dtype, kernel):
    """T tokens in one call give bit for bit the outputs of T one-token calls, each after the
    previous tokens were appended: a verify agrees exactly with decoding the same tokens.
    "exact" runs T launches of the one-token kernel; the one-launch loop ("per_token") runs
    one compiled loop body for every T (T a runtime bound: an unrolled loop rounded
    differently from single steps on an H200 in fp32)."""
    c = case(T=4, dtype=dtype, log_len=(0, 5, 17), slots=(0, 1, 1))
    together = cloned(c)
    y_all = replay_step(**together, dt_limit=(0.001, math.inf), kernel=kernel)
    apart = cloned(c)
    for t in range(4):
        one = {k: apart[k][:, t : t + 1].contiguous() for k in ("x", "dt", "B", "C")}
        y_t = replay_step(**{**apart, **one}, dt_limit=(0.001, math.inf))
        assert torch.equal(y_t[:, 0], y_all[:, t]), t
    for name in ("log_x", "log_dt", "log_B", "log_C", "log_len"):
        assert torch.equal(apart[name], together[name]), name


@pytest.mark.gpu
@pytest.mark.parametrize("kernel", ["exact", "per_token"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_verify_rounds_as_single_steps_do_compiled_at_full_size(kernel, dtype):
    c = case(
        batch=2,
        H=128,
        P=64,
        N=128,
        G=8,
        Lmax=24,
        T=5,
        dtype=dtype,
        log_len=(3, 11),
        slots=(0, 1),
        n_slots=2,
    )
    together, apart = cloned(c), cloned(c)
    y_all = replay_step(**together, dt_limit=(0.001, math.inf), check=False, kernel=kernel)
    for t in range(5):
        one = {k: apart[k][:, t : t + 1].contiguous() for k in ("x", "dt", "B", "C")}
        y_t = replay_step(**{**apart, **one}, dt_limit=(0.001, math.inf), check=False)
        assert torch.equal(y_t[:, 0], y_all[:, t]), t
