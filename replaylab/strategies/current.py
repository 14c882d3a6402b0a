"""The part snapshot and recompute share: each layer's memory at the current position, advanced
by the layer's own scan, with copies of it kept at chosen positions."""

from __future__ import annotations

from replaylab.recurrent import LayerState, window_after, windows_per_token
from replaylab.strategies.base import StateStore

__all__ = ["CurrentStateStore", "copy_nbytes"]


def copy_nbytes(copy) -> int:
    """Bytes of one kept copy {layer: LayerState} (None: the zero state, kept for free)."""
    return sum(s.nbytes() for s in (copy or {}).values())


class CurrentStateStore(StateStore):
    """Holds ``LayerState`` at the current position per layer. Subclasses say which positions
    to copy (``wants_states``) and keep the copies (``keep``)."""

    def __init__(self, specs, batch, dtype, device, config):
        super().__init__(specs, batch, dtype, device, config)
        self.current = {l: s.zero_state(batch, dtype, self.device) for l, s in specs.items()}

    def state(self, layer):
        return self.current[layer]

    def wants_states(self, position, T) -> bool:
        """Whether ``keep`` needs the states after each of T tokens from ``position``."""
        return False

    def keep(self, layer, position, states):
        """Called with ``states``: p -> LayerState for each new position p (when wanted)."""

    def advance(self, layer, position, inputs):
        spec, now = self.specs[layer], self.current[layer]
        entries = spec.prepare(now.conv, inputs)
        conv_in = entries[spec.conv_field]
        T = conv_in.shape[1]
        want = self.wants_states(position, T)
        result = spec.scan(now.ssm, entries, return_states=want)
        if want:
            windows = windows_per_token(now.conv, conv_in)
            self.keep(
                layer,
                position,
                {
                    position + j + 1: LayerState(result.states[:, j].clone(), windows[:, j].clone())
                    for j in range(T)
                },
            )
        self.current[layer] = LayerState(result.state, window_after(now.conv, conv_in))
        return result.y

    def begin_forward(self, position):
        # advance() replaces LayerStates, never writes into them: references are enough
        return position, dict(self.current)

    def abort_forward(self, mark):
        position, current = mark
        self.current = current
        self.drop_after(position)

    def drop_after(self, position):
        """Forget copies kept for positions after ``position``."""

    def _load(self, copy):
        for layer, kept in copy.items():
            self.current[layer] = kept.clone()

    def _zero(self):
        for layer, spec in self.specs.items():
            self.current[layer] = spec.zero_state(self.batch, self.dtype, self.device)

    def _gather(self, indices):
        self.batch = int(indices.numel())
        for layer in self.current:
            self.current[layer] = self.current[layer].index(indices)

    def current_bytes(self):
        return {
            "ssm_state": sum(s.ssm.numel() * s.ssm.element_size() for s in self.current.values()),
            "conv_state": sum(
                s.conv.numel() * s.conv.element_size() for s in self.current.values()
            ),
        }
