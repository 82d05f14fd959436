"""Training data: token files, the embedded corpus, stateless seeded batches and their micro-batches. NumPy only:
the agent and the tests use it without loading MindSpore.

    tokens.py    token files and their JSON sidecars, tokenizers, ``prepare`` (text -> train.bin / val.bin;
                 with a Hugging Face tokenizer, documents -> indexed train / val)
    indexed.py   Megatron's indexed datasets (.bin + .idx, MMIDIDX): read and written
    dataset.py   TokenDataset: a memory-mapped token file; the batch of step k is a pure function of (seed, k);
                 BlendedDataset: several, sampled by weight (data.blend)
    corpus.py    the embedded default corpus (CPython's documentation), tokenised once into the project cache
    batches.py   a rank's rows split into micro-batches
    __main__.py  ``python -m core.data prepare | info | corpus``
"""

from core.data.batches import micro_batches
from core.data.corpus import corpus_text, default_corpus
from core.data.dataset import TokenDataset, datasets_for
from core.data.tokens import TOKEN_DTYPES, TOKENIZERS, ByteTokenizer, get_tokenizer, prepare, sidecar_path, write_tokens

__all__ = [
    "TOKENIZERS",
    "TOKEN_DTYPES",
    "ByteTokenizer",
    "TokenDataset",
    "corpus_text",
    "default_corpus",
    "get_tokenizer",
    "datasets_for",
    "micro_batches",
    "prepare",
    "sidecar_path",
    "write_tokens",
]
