"""Test-wide setup.

TRITON_INTERPRET must be set before any Triton kernel module is imported, so that the
kernel tests run the real Triton code on the CPU interpreter.
"""
import os

os.environ.setdefault("TRITON_INTERPRET", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
