"""The training data as the model sees it: loading, chat and instruction rows to labelled
sequences, packing, tokenizers, and `gpuplan data`'s preview of it."""
