"""Training the library's hybrid model on code, one concept per module:

    corpus       texts with names, the train / held-out split, the held-out text file
    tokenizer    byte-level BPE, the token stream, the prepared data folder
    loop         TrainConfig, the fixed data order, initialisation, ``fit``
    evaluate     held-out loss over a token stream, the bigram baseline
    export       a folder transformers loads
    pipeline     ``train``: corpus to exported folder with its log; MODEL_SIZES
    acceptance   draft acceptance on held-out prompts
    provenance   device, versions, date; provenance stamped into a model folder
    cards        the shipped pair's model cards from metrics.json
    report       measure the shipped pair, then write the cards

``replaylab.train`` re-exports the public names; ``replaylab train`` is the command.
"""
