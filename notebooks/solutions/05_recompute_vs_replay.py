# Reference answers for notebook 05 (format: see 03_branching_strategies.py).

# %% recompute_store
from replaylab.teaching.exercises import ScanInputs


class MyRecomputeStore:
    """The recompute strategy for one Mamba-2 layer (see the stub)."""

    def __init__(self, layer, batch, interval):
        self.layer, self.interval = layer, interval
        self.state = layer.zero_state(batch)
        self.position = 0
        self.checkpoints = {0: self.state.clone()}
        self.inputs = []  # every token's inputs since position 0, as ScanInputs pieces

    def advance(self, inputs):
        result = self.layer.scan(self.state, inputs, return_states=True)
        for j in range(len(inputs)):
            p = self.position + j + 1
            if p % self.interval == 0:
                self.checkpoints[p] = result.states[:, j].clone()
        self.inputs.append(inputs)
        self.state, self.position = result.state, self.position + len(inputs)
        return result.y

    def restore(self, p):
        c = max(q for q in self.checkpoints if q <= p)
        kept = ScanInputs.cat(self.inputs)[:p] if self.inputs else None
        state = self.checkpoints[c].clone()
        if p > c:
            state = self.layer.scan(state, kept[c:p]).state
        self.checkpoints = {q: s for q, s in self.checkpoints.items() if q <= p}
        self.inputs = [kept] if p else []
        self.state, self.position = state, p
        return p - c


# %% replay_log
from replaylab.teaching.exercises import ScanInputs


class MyReplayLog:
    """One layer's replay memory: a checkpoint and the scan inputs since it (see the stub)."""

    def __init__(self, layer, checkpoint):
        self.layer, self.checkpoint = layer, checkpoint
        self.entries = []  # ScanInputs pieces, in order

    def __len__(self):
        return sum(len(e) for e in self.entries)

    def append(self, inputs):
        self.entries.append(inputs)

    def truncate_to(self, j):
        self.entries = [ScanInputs.cat(self.entries)[:j]] if j else []

    def state(self, j=None):
        j = len(self) if j is None else j
        if j == 0:
            return self.checkpoint.clone()  # a copy: the caller may change what it gets
        return self.layer.scan(self.checkpoint, ScanInputs.cat(self.entries)[:j]).state


# %% zero_rerun
zero_rerun_answer = [r["distance"] for r in rows["recompute"] if r["recomputed_tokens"] == 0]
