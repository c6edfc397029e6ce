"""The CLI's commands, one module per command group, each with ``register(app)``; ``options`` declares the
shared flags once and ``common`` holds one-line errors and prompt reading. Thin over :mod:`specdec_cli.api` and
:mod:`specdec_cli.bench`."""
