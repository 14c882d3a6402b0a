"""The serving engine beside the teaching cache.

engine       DecodeEngine: the facade; checks (``checks``), then calls the parts below
layouts      what the engine serves (layer kinds, the fused path's layouts), its paths and
             its default strategy per layout
slots        SlotTable: host positions, counts, the rollback cursor (``cursor``)
pools        preallocated memory per layer and slot, by family
strategies   one class per strategy (snapshot, recompute, replay) and their registry
runner       ModelRunner: the reference forward and CUDA graphs; ``fused``: the fused one
prefill      a prompt through the pools; ``admission``: a chunk at a time between steps
speculation  batched speculative decoding and acceptance; ``drafters``: batched drafters;
             ``device_rounds``: the rounds on the device (replay)
request      a request; ``scheduler``: continuous batching under one byte budget (``budget``),
             each round's k chosen by its measured rate with ``adaptive_k``
prefix       a prefix cache of KV and recurrent state over the slots
"""

from replaylab.serving.adaptive_k import AdaptiveK
from replaylab.serving.admission import Admission
from replaylab.serving.cursor import provisional_room, rollback_cursor
from replaylab.serving.drafters import (
    BatchModelDrafter,
    BatchPromptLookupDrafter,
    BatchSyntheticDrafter,
)
from replaylab.serving.engine import DecodeEngine, EngineStats
from replaylab.serving.layouts import default_strategy, fused_reason, unsupported_reason
from replaylab.serving.prefix import EnginePrefixCache, allowed_block_sizes
from replaylab.serving.request import Request
from replaylab.serving.scheduler import Scheduler, admissible, request_bytes, slot_bytes
from replaylab.serving.strategies import STRATEGIES

__all__ = [
    "AdaptiveK",
    "Admission",
    "BatchModelDrafter",
    "BatchPromptLookupDrafter",
    "BatchSyntheticDrafter",
    "DecodeEngine",
    "EnginePrefixCache",
    "allowed_block_sizes",
    "EngineStats",
    "STRATEGIES",
    "Request",
    "Scheduler",
    "admissible",
    "request_bytes",
    "slot_bytes",
    "rollback_cursor",
    "provisional_room",
    "default_strategy",
    "fused_reason",
    "unsupported_reason",
]
