"""Argument types shared by the command line's subcommands (``cli``, ``crosscompile``, ``warmup``)."""
from __future__ import annotations

import argparse


def parse_shape(text: str) -> tuple[int, int]:
    """``ROWSxCOLS`` -> (rows, cols), both positive, else an argparse usage error."""
    try:
        rows, cols = (int(part) for part in text.lower().split("x"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a shape like 4096x50257, got {text!r}") from None
    if rows < 1 or cols < 1:
        raise argparse.ArgumentTypeError(f"shape {text!r} must be positive")
    return rows, cols


def parse_tensor_shape(text: str) -> tuple[int, ...]:
    """``AxBx...`` (one or more sizes) -> the sizes, each positive, else an argparse usage error."""
    try:
        sizes = tuple(int(part) for part in text.lower().split("x"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a shape like 4096x50257 or 8x16x1024x1024, got {text!r}") from None
    if any(size < 1 for size in sizes):
        raise argparse.ArgumentTypeError(f"shape {text!r} must be positive")
    return sizes
