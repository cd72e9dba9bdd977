"""Pairs mxtrain and PyTorch measurements of one benchmark file (JSON lines from bench/vs_torch.sh)
and prints the markdown table the README shows (the same code as scripts/derive.py's
vs-torch-table, which keeps the README's tables equal to the committed files).
Usage: python3 bench/summarize.py FILE.jsonl"""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "scripts"))
import derive  # noqa: E402


def main(path):
    print(derive.vs_torch_table(os.path.relpath(os.path.abspath(path), derive.ROOT)))


if __name__ == "__main__":
    main(sys.argv[1])
