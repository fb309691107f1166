"""Diagnostic channels shared by the compiler and the runtime: `QDC_LOG=adstack,cache` prints
the messages of those channels to stderr (`adstack`: every adstack sizing decision, compile
time and launch time; `cache`: why a kernel is compiled but not cached)."""
from __future__ import annotations

import os
import sys


def enabled(channel: str) -> bool:
    return channel in os.environ.get("QDC_LOG", "").split(",")


def log(channel: str, message: str) -> None:
    if enabled(channel):
        print(f"[qdc {channel}] {message}", file=sys.stderr)
