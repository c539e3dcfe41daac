"""Backing stores: where ciphertext lands. A leaf package: imports nothing of the app but
errors and the vocabulary."""
