"""Triton kernels for the replay path, installed as ``replaylab.kernels``.

Each kernel sits beside a PyTorch reference with the same signature. On a machine without a
GPU, ``import replaylab`` switches on Triton's interpreter so the kernels run on CPU tensors.
"""
