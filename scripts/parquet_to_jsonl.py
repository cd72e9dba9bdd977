#!/usr/bin/env python3
"""Converts a Parquet file's text column to JSON lines for `mxtrain prepare`, which reads .jsonl
and .jsonl.zst but not Parquet (Debian 12 has no Arrow C++ library). Needs pyarrow
(`pip install pyarrow`). Reads one row group at a time, so files larger than memory convert;
writes OUT.tmp and renames it onto OUT at the end.

Usage: python3 scripts/parquet_to_jsonl.py IN.parquet OUT.jsonl [--field text]"""
import argparse
import json
import os
import sys


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("input")
    parser.add_argument("output")
    parser.add_argument("--field", default="text", help="the column that holds the text (default: text)")
    args = parser.parse_args()
    try:
        import pyarrow.parquet as pq
    except ImportError:
        sys.exit("parquet_to_jsonl: pyarrow is missing; install it with: python3 -m pip install pyarrow")
    source = pq.ParquetFile(args.input)
    if args.field not in source.schema_arrow.names:
        sys.exit("parquet_to_jsonl: %s has no column %r (columns: %s); pass --field" % (
            args.input, args.field, ", ".join(source.schema_arrow.names)))
    rows = 0
    temporary = args.output + ".tmp"
    with open(temporary, "w", encoding="utf-8") as out:
        for group in range(source.num_row_groups):
            for text in source.read_row_group(group, columns=[args.field]).column(0).to_pylist():
                if text is None:
                    continue
                out.write(json.dumps({args.field: text}, ensure_ascii=False) + "\n")
                rows += 1
        out.flush()
        os.fsync(out.fileno())
    os.replace(temporary, args.output)
    print("parquet_to_jsonl: %d documents from %s to %s (then: mxtrain prepare --field %s ... %s)" % (
        rows, args.input, args.output, args.field, args.output))


if __name__ == "__main__":
    main()
