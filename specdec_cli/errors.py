"""User-facing errors: the CLI prints ``str(err)`` as one line on stderr and exits with code 2."""


class SpecdecError(Exception):
    """A problem with the user's input (model, datastore, prompt, options), not a bug."""

    exit_code = 2


class Interrupted(SpecdecError):
    """Ctrl-C (or SIGTERM) with something to say about what was kept."""

    exit_code = 130
