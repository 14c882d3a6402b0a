# Reference answers for notebook 15, the appendix (format: see 03_branching_strategies.py).

# %% roofline_32k
roofline_answer = 1e3 * cm.decode_floor_seconds(
    nemotron, "replay", 64, bw, **{**roof_kw, "context_len": 32768}
)
