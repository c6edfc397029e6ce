"""``specdec methods`` and ``specdec models``: what can be run, with which options."""

from __future__ import annotations

import typer


def register(app: typer.Typer) -> None:
    app.command("methods")(list_methods)
    app.command("models")(list_models)


def list_methods() -> None:
    """List the decoding methods, what each needs, and its --opt options with their defaults."""
    from ..methods import METHODS

    for name, info in METHODS.items():
        needs = ", ".join(filter(None, [f"{info.drafts} draft(s)" if info.drafts else "", "--datastore" if info.datastore else ""]))
        print(f"{name:12s} {info.help}" + (f"  [needs {needs}]" if needs else ""))
        for key, spec in info.options.items():
            paper = f", --budget paper: {spec.paper}" if spec.paper is not None else ""
            default = "derived" if spec.default is None else spec.default
            print(f"{'':14s}--opt {key}={default}{paper}  {spec.help}")


def list_models() -> None:
    """List the model aliases."""
    from ..io.aliases import ALIASES  # torch-free

    for name, alias in ALIASES.items():
        print(f"{name:20s} {alias.hub_id or alias.pypi_gguf}  {alias.note}")
