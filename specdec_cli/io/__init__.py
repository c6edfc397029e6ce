"""The outside world, read and written safely: models (hub, local, GGUF, draft copies) and their aliases, the
network check, corpora and prompt sets, JSON lines, learned state from files, atomic writes. Imports nothing of
specdec above :mod:`specdec_cli.errors`."""
