"""Triton kernels (built by a later issue). Imports without triton installed."""
