"""``python -m core.data``: make token files from text, inspect one, or build the embedded corpus.

python -m core.data prepare a.txt b.txt out_dir [--val-fraction 0.1] [--tokenizer byte] [--dtype uint16]
python -m core.data prepare docs.jsonl out_dir --tokenizer <HF tokenizer dir>   # Megatron .bin + .idx
python -m core.data info out_dir/train.bin
python -m core.data corpus            # build (once) and print the embedded corpus's paths
"""

from __future__ import annotations

import argparse
import json
import sys

from core.data.corpus import default_corpus
from core.data.dataset import TokenDataset
from core.data.tokens import TOKEN_DTYPES, TOKENIZERS, prepare, prepare_indexed


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m core.data", description=__doc__.split("\n\n")[0].strip("`"))
    sub = ap.add_subparsers(dest="command", required=True)
    p = sub.add_parser("prepare", help="tokenise text files into train.bin / val.bin")
    p.add_argument("inputs", nargs="+", help="text files, concatenated in this order")
    p.add_argument("out_dir", help="directory for train.bin, val.bin and their .json sidecars")
    p.add_argument("--val-fraction", type=float, default=0.1, help="held-out tail of the token stream")
    p.add_argument(
        "--tokenizer",
        default="byte",
        help=f"{', '.join(sorted(TOKENIZERS))}, or a Hugging Face tokenizer directory (tokenizer.json): documents "
        "(.jsonl lines' text, other files whole) into Megatron's indexed format",
    )
    p.add_argument("--dtype", default="uint16", choices=TOKEN_DTYPES)
    i = sub.add_parser("info", help="print a token file's sidecar and checks")
    i.add_argument("path")
    c = sub.add_parser("corpus", help="build (once) the embedded default corpus and print its paths")
    c.add_argument("--cache-dir", default=None)
    return ap


def main(argv: list[str] | None = None) -> int:
    ap = _parser()
    args = ap.parse_args(argv)
    try:
        if args.command == "prepare" and args.tokenizer not in TOKENIZERS:
            train, val = prepare_indexed(
                args.inputs, args.out_dir, tokenizer=args.tokenizer, val_fraction=args.val_fraction
            )
            for path in (train, val):
                print(f"{path}: {TokenDataset(path).n_tokens} tokens")
        elif args.command == "prepare":
            train, val = prepare(
                args.inputs, args.out_dir, val_fraction=args.val_fraction, tokenizer=args.tokenizer, dtype=args.dtype
            )
            for path in (train, val):
                print(f"{path}: {TokenDataset(path).n_tokens} tokens")
        elif args.command == "info":
            ds = TokenDataset(args.path)
            print(json.dumps({**ds.info, "max_token": ds.max_token(), "n_tokens": ds.n_tokens}, indent=1))
        else:
            for path in default_corpus(args.cache_dir):
                print(path)
    except (OSError, ValueError, RuntimeError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
