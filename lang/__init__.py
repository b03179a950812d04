"""The radixrt frontend language (built by a later issue). Imports no torch."""
