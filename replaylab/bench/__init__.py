"""Benchmarks, one harness: ``replaylab bench {kernels,sweep,decode}`` (or ``python -m
replaylab.bench ...``).

    cli         the subcommands and their arguments
    timing      median times under CUDA graphs, device-copy bandwidth, spreads of repeats
    provenance  device, library versions, date and command for every result file
    peers       mamba-ssm and flash-linear-attention, loaded where they import
    kernels     replay kernels against the peers, side by side, on an 8B-class layer (GPU)
    decode      end-to-end decoding under every strategy beside transformers (GPU or CPU)
    stream      a Poisson request stream over the serving scheduler, per strategy, with and
                without speculation; sustainable rate and the speculation crossover

The bytes each kernel provider must move come from ``replaylab.costmodel.kernel_bytes``.
"""
