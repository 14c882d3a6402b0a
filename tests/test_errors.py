"""Bad input to the scans gets a ValueError naming the argument, what it got and what it
expected; never a silent wrong result."""

import pytest
import torch

from replaylab.scan import s6_scan, ssd_scan, ssd_step


def good(batch=2, T=5, H=4, P=3, N=6, G=2):
    return dict(
        x=torch.randn(batch, T, H, P),
        dt=torch.randn(batch, T, H),
        A=-torch.rand(H),
        B=torch.randn(batch, T, G, N),
        C=torch.randn(batch, T, G, N),
    )


@pytest.mark.parametrize(
    "name, bad, message",
    [
        ("dt", torch.randn(2, 5, 3), r"dt: expected shape \(batch=2, T=5, H=4\), got \(2, 5, 3\)"),
        ("A", torch.randn(4, 1), r"A: expected 1 dims with shape \(H=4\), got shape \(4, 1\)"),
        ("B", torch.randn(2, 5, 3, 6), r"B: G=3 groups must divide H=4 heads"),
        (
            "C",
            torch.randn(2, 5, 2, 7),
            r"C: expected shape \(batch=2, T=5, G=2, N=6\), got \(2, 5, 2, 7\)",
        ),
        ("B", torch.randn(2, 5, 2, 6, dtype=torch.float64), r"B: expected dtype torch.float32"),
        (
            "x",
            torch.randn(2, 5, 4),
            r"x: expected 4 dims with shape \(batch, T, H, P\), got shape \(2, 5, 4\)",
        ),
        ("A", torch.arange(4), r"A: expected a floating-point tensor, got dtype torch.int64"),
    ],
)
def test_ssd_scan_names_the_bad_argument(name, bad, message):
    inp = good()
    inp[name] = bad
    with pytest.raises(ValueError, match=message):
        ssd_scan(**inp)


def test_wrong_initial_state_shape():
    with pytest.raises(ValueError, match=r"state: expected shape \(batch=2, H=4, P=3, N=6\)"):
        ssd_scan(**good(), initial_state=torch.zeros(2, 4, 3, 5))


def test_step_state_shape_and_device_checks():
    inp = {k: v[:, 0] if v.dim() > 1 else v for k, v in good().items()}
    with pytest.raises(
        ValueError,
        match=r"state: expected 4 dims with shape \(batch=2, H=4, P=3, N=6\), got shape \(2, 4, 3\)",
    ):
        ssd_step(torch.zeros(2, 4, 3), **inp)
    meta_A = torch.empty(4, device="meta")
    with pytest.raises(ValueError, match=r"one device, got .*A on meta"):
        ssd_step(torch.zeros(2, 4, 3, 6), **{**inp, "A": meta_A})


def test_nonfinite_values_are_reported_only_when_asked():
    inp = good()
    inp["dt"][0, 2, 1] = float("nan")
    ssd_scan(**inp)  # no check requested: runs (the NaN propagates, as in any kernel)
    with pytest.raises(ValueError, match=r"dt: 1 of 40 values are NaN or inf"):
        ssd_scan(**inp, check_nonfinite=True)
    state = torch.zeros(2, 4, 3, 6)
    state[1, 0, 0, 0] = float("inf")
    with pytest.raises(ValueError, match=r"initial_state: 1 of 144 values are NaN or inf"):
        ssd_scan(**good(), initial_state=state, check_nonfinite=True)


def test_s6_checks():
    u = torch.randn(2, 5, 8)
    args = dict(
        u=u,
        dt=torch.randn(2, 5, 8),
        A=-torch.rand(8, 4),
        B=torch.randn(2, 5, 4),
        C=torch.randn(2, 5, 4),
    )
    with pytest.raises(ValueError, match=r"A: expected shape \(D=8, N\), got \(7, 4\)"):
        s6_scan(**{**args, "A": -torch.rand(7, 4)})
    with pytest.raises(
        ValueError, match=r"C: expected shape \(batch=2, T=5, N=4\), got \(2, 5, 3\)"
    ):
        s6_scan(**{**args, "C": torch.randn(2, 5, 3)})
