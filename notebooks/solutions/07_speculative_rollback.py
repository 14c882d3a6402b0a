# Reference answers for notebook 07 (format: see 03_branching_strategies.py).

# %% recompute_break_even
# what AcceptanceExplorer.predictions computes, for k=12 over the slider's grid
below_one = []
for i in range(21):
    w = cm.Workload(batch=explorer.batch, k=12, acceptance=i / 20, interval=explorer.interval)
    plain = cm.plain_decode_seconds_per_token(explorer.shape, w, explorer.hardware, explorer.n_params)
    pred = cm.predict(explorer.shape, w, explorer.hardware, explorer.n_params)
    if plain / pred["recompute"]["seconds_per_token"] < 1:
        below_one.append(i / 20)
break_even_answer = max(below_one)

# %% tokens_per_round
probs = (0.9, 0.8, 0.6, 0.3)
alive, expected = 1.0, 0.0
for p_i in probs:
    alive *= p_i  # all drafts up to i accepted
    expected += alive
tokens_per_round_answer = 1 + expected
