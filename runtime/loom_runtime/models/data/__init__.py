"""Data files that ship with the model package (the tiny checkpoint's tokenizer corpus).

Holds files only; never code.
"""
