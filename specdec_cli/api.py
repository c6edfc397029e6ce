"""The library API the CLI (and ``bench``) is a thin layer over.

    from specdec_cli import api
    target, drafts = api.load("smollm2-135m", drafts=["int8:"])
    ids = api.encode_prompt(target, "Write a haiku about caches.", max_new_tokens=64)
    drafter = api.make_drafter("sd", target, drafts)
    result = api.run(target, ids, drafter, max_new_tokens=64)
    print(api.decode(target, result.tokens), result.summary())
"""

from __future__ import annotations

from .decoding import Drafter, GenerationResult, generate
from .errors import SpecdecError
from .methods import METHODS, MethodContext, build_drafter
from .models import LoadedModel, load_draft, load_model
from .sampling import SamplingConfig

__all__ = ["load", "encode_prompt", "make_drafter", "run", "decode", "METHODS", "SamplingConfig", "SpecdecError"]


def load(model: str, drafts: list[str] | tuple[str, ...] = (), dtype: str = "auto", device: str = "auto"
         ) -> tuple[LoadedModel, list[LoadedModel]]:
    target = load_model(model, dtype, device)
    return target, [load_draft(d, target, dtype, device) for d in drafts]


def encode_prompt(target: LoadedModel, text: str, *, raw: bool = False, system: str | None = None,
                  max_new_tokens: int = 0, history: list[dict] | None = None) -> list[int]:
    """Token ids for ``text``: the chat template is applied for chat models unless ``raw``.

    ``history`` (earlier ``{"role", "content"}`` turns) allows multi-turn prompts such as MT-Bench's second turn.
    Raises :class:`SpecdecError` for an empty prompt or one that leaves no room in the model's context.
    """
    if not text or not text.strip():
        raise SpecdecError("empty prompt: give a prompt argument, pipe text on stdin, or use --batch-file")
    tok = target.tokenizer
    if target.chat and not raw and getattr(tok, "chat_template", None):
        messages = ([{"role": "system", "content": system}] if system else []) + list(history or [])
        messages.append({"role": "user", "content": text})
        ids = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
        if not isinstance(ids, list):
            ids = ids["input_ids"]
    else:
        ids = tok(text, add_special_tokens=True)["input_ids"]
    ids = [int(i) for i in ids]
    limit = target.context_length
    if len(ids) + max_new_tokens > limit:
        raise SpecdecError(
            f"prompt is too long: {len(ids)} tokens + {max_new_tokens} new tokens exceed the model's context of {limit}")
    return ids


def make_drafter(method: str, target: LoadedModel, drafts: list[LoadedModel] = (), *, datastore: str | None = None,
                 window: int | None = None, options: dict[str, str] | None = None) -> Drafter:
    ctx = MethodContext(target, list(drafts), datastore, window, dict(options or {}))
    return build_drafter(method, ctx)


def run(target: LoadedModel, prompt_ids: list[int], drafter: Drafter, *, max_new_tokens: int = 128,
        sampling: SamplingConfig = SamplingConfig(), seed: int = 0, on_tokens=None) -> GenerationResult:
    if max_new_tokens < 1:
        raise SpecdecError(f"--max-new-tokens must be >= 1, got {max_new_tokens}")
    return generate(target.model, prompt_ids, drafter, max_new_tokens=max_new_tokens, sampling=sampling.validate(),
                    seed=seed, stop_ids=target.stop_ids, on_tokens=on_tokens)


def decode(target: LoadedModel, tokens: list[int]) -> str:
    return target.tokenizer.decode(tokens, skip_special_tokens=True)
