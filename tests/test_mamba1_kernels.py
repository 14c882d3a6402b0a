"""Mamba-1 (Jamba) kernels against a float64 oracle (the reference scan from the checkpoint over
log + new tokens; for the snapshot step ``state_update``, from the state over the new tokens)
and their PyTorch references, under Triton's interpreter on
CPU (``import replaylab`` switches it on without a GPU) or natively on a GPU. Sizes are awkward
on purpose (D, N not powers of two, D spanning several channel blocks), rings wrap, branches
share a checkpoint slot; outputs the kernels write are compared with poisoned copies."""

import pytest
import torch

from replaylab import assert_close
from replaylab.kernels.mamba1 import (
    fold,
    fold_ref,
    replay_step,
    replay_step_ref,
    state_update,
    state_update_ref,
)
from replaylab.scan import s6_scan
from replaylab.testing import DEVICE

I32 = dict(dtype=torch.int32, device=DEVICE)
BLOCK = 8  # small channel blocks: D=20 spans three programs, the last one masked


def case(batch=3, Dn=20, N=5, Lmax=11, T=3, log_len=(0, 4, 9), head=(0, 9, 4), slots=(1, 0, 1),
         n_slots=2, dtype=torch.float32, seed=0):  # fmt: skip
    g = torch.Generator().manual_seed(seed)
    r = lambda *s: torch.randn(*s, generator=g).to(DEVICE)  # noqa: E731
    return dict(
        states=r(n_slots, Dn, N),
        slots=torch.tensor(slots, **I32),
        log_x=r(batch, Lmax, Dn).to(dtype),
        log_dt=(r(batch, Lmax, Dn) - 1).to(dtype),
        log_B=r(batch, Lmax, N).to(dtype),
        log_len=torch.tensor(log_len, **I32),
        x=r(batch, T, Dn).to(dtype),
        dt=(r(batch, T, Dn) - 1).to(dtype),
        B=r(batch, T, N).to(dtype),
        C=r(batch, T, N).to(dtype),
        A=-torch.rand(Dn, N, generator=g).to(DEVICE) * 2 - 0.1,
        D=r(Dn),
        dt_bias=(torch.rand(Dn, generator=g).to(DEVICE) - 0.5),
        log_head=torch.tensor(head, **I32),
    )


def cloned(c):
    return {k: v.clone() for k, v in c.items()}


def rows(c, b, n, start=0):
    return (int(c["log_head"][b]) + start + torch.arange(n, device=DEVICE)) % c["log_x"].shape[1]


def oracle_y(c):
    """float64 reference scan from each checkpoint over the log entries, then the new tokens."""
    ys = []
    for b in range(c["x"].shape[0]):
        old = rows(c, b, int(c["log_len"][b]))
        xs, dts, Bs = (
            torch.cat([c[f"log_{k}"][b, old], c[k][b].to(c[f"log_{k}"].dtype)])
            for k in ("x", "dt", "B")
        )
        Cs = torch.cat([Bs[: len(old)], c["C"][b].to(Bs.dtype)])
        y = s6_scan(
            xs[None].double(),
            dts[None].double(),
            c["A"].double(),
            Bs[None].double(),
            Cs[None].double(),
            c["D"].double(),
            dt_bias=c["dt_bias"].double(),
            dt_softplus=True,
            initial_state=c["states"][int(c["slots"][b])][None].double(),
            compute_dtype=torch.float64,
        ).y
        ys.append(y[0, len(old) :])
    return torch.stack(ys)


def oracle_fold(c, fold_len, src):
    out = []
    for b, j in enumerate(fold_len.tolist()):
        rr = rows(c, b, j)
        out.append(
            s6_scan(
                c["log_x"][b, rr][None].double(),
                c["log_dt"][b, rr][None].double(),
                c["A"].double(),
                c["log_B"][b, rr][None].double(),
                c["log_B"][b, rr][None].double(),
                dt_bias=c["dt_bias"].double(),
                dt_softplus=True,
                initial_state=c["states"][int(src[b])][None].double(),
                compute_dtype=torch.float64,
            ).state[0]
        )
    return out


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(
    "T, log_len, head",
    [(1, (0, 4, 9), (0, 9, 4)), (3, (0, 4, 8), (0, 9, 4)), (2, (0, 0, 0), (3, 0, 10))],
)
def test_replay_step_matches_float64_oracle_and_reference(dtype, T, log_len, head):
    """Log lengths 0 .. 9, rings that wrap (head 9 with 4 entries, head 4 with 8 + T entries
    past the end of an 11-row ring), one slot read by two sequences; no state written."""
    c = case(T=T, log_len=log_len, head=head, dtype=dtype)
    tri, ref = cloned(c), cloned(c)
    tri_y = replay_step(**tri, block_d=BLOCK)
    ref_y = replay_step_ref(**ref)
    want = oracle_y(c)
    assert tri_y.dtype == dtype
    assert_close(tri_y.double(), want, dtype=dtype, name="y vs float64 oracle")
    assert_close(tri_y, ref_y, dtype=dtype, name="y vs reference")
    assert torch.equal(tri["states"], c["states"])  # no state written
    for name in ("log_x", "log_dt", "log_B", "log_len", "log_head"):
        assert torch.equal(tri[name], ref[name]), name
    for b, n in enumerate(log_len):  # the new tokens sit after the log; the rest is as it was
        new, kept = rows(c, b, T, start=n), rows(c, b, n)
        for name in ("x", "dt", "B"):
            assert torch.equal(tri[f"log_{name}"][b, new], c[name][b]), (name, b)
            assert torch.equal(tri[f"log_{name}"][b, kept], c[f"log_{name}"][b, kept]), (name, b)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_verify_equals_single_steps_bit_for_bit(dtype):
    """T tokens in one call give exactly the outputs (and ring) of T one-token calls, each
    after the previous token was appended: speculation can be lossless."""
    T = 4
    c = case(T=T, log_len=(0, 3, 6), head=(2, 9, 6), dtype=dtype)  # 6 + 4 wraps an 11-row ring
    together = cloned(c)
    y_all = replay_step(**together, block_d=BLOCK)
    apart = cloned(c)
    for t in range(T):
        one = {k: c[k][:, t : t + 1].contiguous() for k in ("x", "dt", "B", "C")}
        y_t = replay_step(**{**apart, **one}, block_d=BLOCK)
        assert torch.equal(y_t[:, 0], y_all[:, t]), t
        apart["log_len"] += 1
    for name in ("log_x", "log_dt", "log_B"):
        assert torch.equal(apart[name], together[name]), name


def test_padding_tokens_append_nothing():
    """append_count: sequence b appends only its first count[b] tokens; ring rows the padding
    would have written (wrapping onto the oldest entries) keep their values, and the outputs
    of the real tokens do not change."""
    T = 3
    c = case(T=T, log_len=(2, 9, 7), head=(0, 1, 3))  # row (1 + 9 + t) % 11 wraps onto row 0
    count = torch.tensor([3, 1, 0], **I32)
    tri, ref = cloned(c), cloned(c)
    tri_y = replay_step(**tri, append_count=count, block_d=BLOCK)
    ref_y = replay_step_ref(**ref, append_count=count)
    assert torch.equal(tri_y, replay_step(**cloned(c), append=False, block_d=BLOCK))
    assert_close(tri_y, ref_y, name="y")
    for b, (n, k) in enumerate(zip(c["log_len"].tolist(), count.tolist())):
        written, untouched = rows(c, b, k, start=n), rows(c, b, T - k, start=n + k)
        for name in ("x", "dt", "B"):
            log = tri[f"log_{name}"]
            assert torch.equal(log, ref[f"log_{name}"]), name
            assert torch.equal(log[b, written], c[name][b, :k]), (name, b)
            assert torch.equal(log[b, untouched], c[f"log_{name}"][b, untouched]), (name, b)
    plain = cloned(c)
    replay_step(**plain, append=False, block_d=BLOCK)
    for name in ("log_x", "log_dt", "log_B"):
        assert torch.equal(plain[name], c[name]), name  # append=False: the ring as it was


def test_branches_sharing_a_checkpoint():
    """Two branches read slot 0 with logs of their own (and a third its own slot): each
    equals the oracle from the shared checkpoint, which stays as it was."""
    c = case(batch=3, log_len=(5, 2, 5), head=(0, 0, 8), slots=(0, 0, 1), T=2)
    c["log_x"][1, :2] = c["log_x"][0, :2]  # branch 1 forks from branch 0 after two tokens
    tri = cloned(c)
    y = replay_step(**tri, block_d=BLOCK)
    assert_close(y.double(), oracle_y(c), dtype=torch.float32, name="y")
    assert torch.equal(tri["states"], c["states"])


@pytest.mark.parametrize("in_place", [False, True])
def test_fold_matches_float64_oracle(in_place):
    """Fold j = 0, 4 and 11 (a full, wrapped ring) entries; in place (dest is states, equal
    slots) or into other slots; j = 0 in place leaves its slot unchanged."""
    c = case(n_slots=3, head=(0, 9, 4), slots=(0, 1, 2))
    fold_len = torch.tensor([0, 4, 11], **I32)
    src = c["slots"]
    if in_place:
        tri_states, ref_states, dest_slots = c["states"].clone(), c["states"].clone(), src
        tri_dest, ref_dest = tri_states, ref_states
    else:
        tri_states, ref_states = c["states"].clone(), c["states"].clone()
        tri_dest = torch.full((4, 20, 5), float("nan"), device=DEVICE)
        ref_dest = tri_dest.clone()
        dest_slots = torch.tensor([3, 0, 1], **I32)
    args = (c["log_x"], c["log_dt"], c["log_B"], fold_len, c["A"], c["dt_bias"])
    kw = dict(log_head=c["log_head"])
    out = fold(tri_states, src, tri_dest, dest_slots, *args, **kw, block_d=BLOCK)
    fold_ref(ref_states, src, ref_dest, dest_slots, *args, **kw)
    assert out is tri_dest
    want = oracle_fold(c, fold_len, src)
    for b, s in enumerate(want):
        got = tri_dest[int(dest_slots[b])]
        assert_close(got.double(), s, dtype=torch.float32, name=f"fold row {b}")
        assert_close(got, ref_dest[int(dest_slots[b])], name=f"fold vs reference, row {b}")
    assert torch.equal(tri_dest[int(dest_slots[0])], c["states"][0])  # j = 0: the checkpoint
    if not in_place:
        assert torch.equal(tri_states, c["states"])  # sources untouched
        assert torch.isnan(tri_dest[2]).all()  # a slot no row writes


def test_fold_then_step_equals_step_from_the_old_checkpoint():
    """Folding j entries and moving the ring's head by j changes outputs only by rounding."""
    c = case(log_len=(3, 6, 9), head=(0, 7, 4), slots=(0, 1, 2), n_slots=3)
    j = torch.tensor([3, 2, 5], **I32)
    before = replay_step(**cloned(c), append=False, block_d=BLOCK)
    folded = cloned(c)
    fold(folded["states"], folded["slots"], folded["states"], folded["slots"], folded["log_x"],
         folded["log_dt"], folded["log_B"], j, folded["A"], folded["dt_bias"],
         log_head=folded["log_head"], block_d=BLOCK)  # fmt: skip
    folded["log_head"] = (folded["log_head"] + j) % c["log_x"].shape[1]
    folded["log_len"] -= j
    after = replay_step(**folded, append=False, block_d=BLOCK)
    assert_close(after, before, name="y after a fold")


def snapshot_case(dtype=torch.float32, T=3, batch=3, n_slots=4, seed=1):
    """``state_update``'s arguments: a pool of ``n_slots`` states (rows past the batch are not
    the kernel's), T new tokens, counts 0, 2 and T (a ragged step's padding), drafts."""
    c = case(batch=batch, T=T, dtype=dtype, n_slots=n_slots, seed=seed)
    return dict(
        state=c["states"],
        **{k: c[k] for k in ("x", "dt", "B", "C", "A", "D", "dt_bias")},
        drafts=torch.full((n_slots, T + 1, *c["states"].shape[1:]), float("nan"), device=DEVICE),
        counts=torch.tensor([0, 2, T][:batch], **I32),
    )


def oracle_states(c):
    """float64 reference scan of each row from its state: (y (batch, T, D), the states after
    each token (batch, T, D, N))."""
    batch = c["x"].shape[0]
    result = s6_scan(*(c[k].double() for k in ("x", "dt", "A", "B", "C", "D")),
                     dt_bias=c["dt_bias"].double(), dt_softplus=True,
                     initial_state=c["state"][:batch].double(), return_states=True,
                     compute_dtype=torch.float64)  # fmt: skip
    return result.y, result.states


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_state_update_matches_float64_oracle_and_reference(dtype):
    """The snapshot step: y, the state written (the one after counts[b] tokens: 0, 2, T) and
    the drafts (the state after each token) against float64 and the PyTorch reference; the
    pool's rows past the batch and the drafts past T are left alone."""
    c = snapshot_case(dtype)
    tri, ref = cloned(c), cloned(c)
    tri_y = state_update(**tri, block_d=BLOCK)
    ref_y = state_update_ref(**ref)
    want_y, want_states = oracle_states(c)
    assert tri_y.dtype == dtype
    assert_close(tri_y.double(), want_y, dtype=dtype, name="y vs float64 oracle")
    assert_close(tri_y, ref_y, dtype=dtype, name="y vs reference")
    T = c["x"].shape[1]
    for b, n in enumerate(c["counts"].tolist()):
        want = c["state"][b].double() if n == 0 else want_states[b, n - 1]
        assert_close(tri["state"][b].double(), want, dtype=torch.float32, name=f"state {b}")
        assert_close(tri["state"][b], ref["state"][b], name=f"state {b} vs reference")
        assert_close(tri["drafts"][b, :T].double(), want_states[b], dtype=torch.float32,
                     name=f"drafts {b}")  # fmt: skip
    assert torch.equal(tri["state"][0], c["state"][0])  # count 0: the state as it was
    assert torch.equal(tri["state"][3], c["state"][3])  # not a row of the batch
    assert torch.isnan(tri["drafts"][:, T]).all() and torch.isnan(tri["drafts"][3]).all()
    strided = {n: c[n].transpose(-1, -2).contiguous().transpose(-1, -2) for n in ("x", "B", "C")}
    assert not strided["x"].is_contiguous()  # a verify's views of the mixer's projections
    again = {**cloned(c), **strided}
    assert torch.equal(state_update(**again, block_d=BLOCK), tri_y)
    assert torch.equal(again["state"], tri["state"])
    plain = cloned(c)
    y = state_update(**{**plain, "drafts": None, "counts": None}, block_d=BLOCK)
    assert torch.equal(y, tri_y)  # counts move only the state written
    assert torch.equal(plain["state"][:3], tri["drafts"][:3, T - 1])  # no counts: after T


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_snapshot_verify_equals_single_steps_and_replays_bits(dtype):
    """T tokens in one ``state_update`` give the outputs and states of T one-token calls bit
    for bit (a snapshot's speculation is lossless), and each token's y is the bits of
    ``replay_step`` from the first state with the earlier tokens in its log: the three kernels
    share one update, so the strategies' Mamba-1 outputs agree bit for bit."""
    T = 4
    c = snapshot_case(dtype, T=T)
    together = cloned(c)
    y_all = state_update(**{**together, "counts": None}, block_d=BLOCK)
    apart = cloned(c)
    batch = c["x"].shape[0]
    slots = torch.arange(batch, **I32)
    for t in range(T):
        one = {k: c[k][:, t : t + 1].contiguous() for k in ("x", "dt", "B", "C")}
        y_t = state_update(**{**apart, **one, "drafts": None, "counts": None}, block_d=BLOCK)
        assert torch.equal(y_t[:, 0], y_all[:, t]), t
        assert torch.equal(apart["state"][:batch], together["drafts"][:batch, t]), t
        log = {f"log_{k}": c[k][:, : max(t, 1)].contiguous() for k in ("x", "dt", "B")}
        replayed = replay_step(c["state"], slots, **log, log_len=torch.full((batch,), t, **I32),
                               **one, **{k: c[k] for k in ("A", "D", "dt_bias")}, append=False,
                               block_d=BLOCK)  # fmt: skip
        assert torch.equal(replayed[:, 0], y_all[:, t]), t


@pytest.mark.parametrize(
    "change, message",
    [
        (lambda c: dict(counts=torch.tensor([0, 4, 1], **I32)),
         r"counts: expected values in \[0, 3\], got \[0, 4, 1\]"),
        (lambda c: dict(counts=c["counts"].long()),
         r"counts: expected int32 of shape \(3,\), got torch.int64 \(3,\)"),
        (lambda c: dict(drafts=c["drafts"][:, :2].contiguous()),
         r"drafts: 4 slots x 2 tokens, need at least \(3, 3\)"),
        (lambda c: dict(state=c["state"][:2].contiguous()),
         r"state: 2 rows, need one per sequence \(3\)"),
        (lambda c: dict(state=c["state"].double()),
         r"state: expected a contiguous float32 pool, got torch.float64"),
        (lambda c: dict(C=c["C"][..., :4].contiguous()),
         r"C: expected shape \(batch=3, T=3, N=5\), got \(3, 3, 4\)"),
        (lambda c: dict(A=c["A"][:, :4].contiguous()),
         r"A: expected shape \(D=20, N=5\), got \(20, 4\)"),
    ],
)  # fmt: skip
def test_bad_state_update_input_is_named_before_anything_changes(change, message):
    c = snapshot_case()
    for kernel in (state_update, state_update_ref):
        bad = {**cloned(c), **change(c)}
        with pytest.raises(ValueError, match=message):
            kernel(**bad)
        assert torch.equal(bad["state"], c["state"]) or bad["state"].shape != c["state"].shape
        assert torch.isnan(bad["drafts"]).all()


def _bad(c, **change):
    return {**cloned(c), **change}


@pytest.mark.parametrize(
    "change, message",
    [
        (lambda c: dict(A=c["A"][:, :4]), r"A: expected shape \(D=20, N=5\), got \(20, 4\)"),
        (
            lambda c: dict(log_x=c["log_x"][..., :19].contiguous()),
            r"log_x: expected shape \(batch=3, Lmax, D=20\), got \(3, 11, 19\)",
        ),
        (
            lambda c: dict(log_B=c["log_B"][:, :, :4].contiguous()),
            r"log_B: expected shape \(batch=3, Lmax=11, N=5\), got \(3, 11, 4\)",
        ),
        (
            lambda c: dict(states=c["states"].double()),
            r"states: expected float32 checkpoint states, got torch.float64",
        ),
        (
            lambda c: dict(slots=torch.tensor([1, 0, 2], **I32)),
            r"slots: expected values in \[0, 1\], got \[1, 0, 2\]",
        ),
        (
            lambda c: dict(log_len=torch.tensor([0, 12, 1], **I32)),
            r"log_len: expected values in \[0, 11\], got \[0, 12, 1\]",
        ),
        (
            lambda c: dict(log_len=torch.tensor([0, 9, 1], **I32)),
            r"log_len: appending needs log_len \+ tokens appended <= Lmax=11, got log_len "
            r"\[0, 9, 1\] \+ 3",
        ),
        (
            lambda c: dict(slots=c["slots"].long()),
            r"slots: expected int32 of shape \(3,\), got torch.int64 \(3,\)",
        ),
        (
            lambda c: dict(log_head=torch.tensor([0, 11, 1], **I32)),
            r"log_head: expected values in \[0, 10\], got \[0, 11, 1\]",
        ),
        (
            lambda c: dict(append_count=torch.tensor([0, 4, 1], **I32)),
            r"append_count: expected values in \[0, 3\], got \[0, 4, 1\]",
        ),
    ],
)
def test_bad_input_is_named(change, message):
    c = case()
    with pytest.raises(ValueError, match=message):
        replay_step(**_bad(c, **change(c)))
    with pytest.raises(ValueError, match=message):
        replay_step_ref(**_bad(c, **change(c)))


def test_bad_fold_input_is_named():
    c = case(n_slots=3, slots=(0, 1, 2))
    args = lambda **k: dict(  # noqa: E731
        dict(
            states=c["states"],
            src_slots=c["slots"],
            dest=c["states"],
            dest_slots=c["slots"],
            log_x=c["log_x"],
            log_dt=c["log_dt"],
            log_B=c["log_B"],
            fold_len=torch.tensor([1, 2, 3], **I32),
            A=c["A"],
            dt_bias=c["dt_bias"],
        ),
        **k,
    )
    with pytest.raises(ValueError, match=r"fold_len: expected values in \[0, 11\], got"):
        fold(**args(fold_len=torch.tensor([1, 12, 0], **I32)))
    with pytest.raises(ValueError, match=r"dest_slots: rows that write must write distinct"):
        fold(**args(dest_slots=torch.tensor([0, 0, 2], **I32)))
    with pytest.raises(ValueError, match=r"dest_slots: row 0 writes slot 1 that row 1 reads"):
        fold(**args(dest_slots=torch.tensor([1, 2, 0], **I32)))
    with pytest.raises(ValueError, match=r"dest_slots: expected values in \[0, 2\]"):
        fold(**args(dest_slots=torch.tensor([0, 1, 3], **I32)))
    with pytest.raises(ValueError, match=r"dt_bias: expected shape \(D=20\), got \(19,\)"):
        fold_ref(**args(dt_bias=c["dt_bias"][:19]))


@pytest.mark.skipif(torch.cuda.is_available(), reason="a CPU smoke test (interpreter)")
def test_the_gpu_benchmark_runs_on_cpu_at_a_tiny_size():
    from replaylab.bench.mamba1_kernels import run, summary

    result = run(batches=(2,), Ls=(4,), shape=dict(D=16, N=4), device="cpu")
    (entry,) = result["batches"]
    res = entry["L"][4]
    assert res["step"]["log_len"] == 2 and res["step_full"]["log_len"] == 3
    amortised = res["step"]["us"] + res["fold"]["us"] / 4
    assert res["amortised"]["us"] == pytest.approx(amortised)
    assert res["amortised"]["bytes_per_token"] == res["step"]["bytes"] + res["fold"]["bytes"] / 4
    assert entry["copy"]["bytes"] == 2 * 2 * 16 * 4 * 4
    assert entry["check"]["update_equals_replay_step"]  # the snapshot step: replay's bits
    assert res["amortised"]["speedup_vs_update"] == pytest.approx(entry["update"]["us"] / amortised)
    if "us" in entry.get("ssu", {}):  # mamba-ssm installed: its output agrees with ours
        assert entry["check"]["max_abs_diff_vs_ssu"] < 0.05
        assert "speedup_vs_ssu" in res["amortised"]
    assert result["provenance"]["command"].startswith("replaylab.bench.mamba1_kernels.run(")
    assert len(summary(result)) == 3
