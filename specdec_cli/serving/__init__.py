"""specdec's drafting served to other engines: chains drafted from token ids alone, for many sequences at once.

* :mod:`.chains` -- :class:`~.chains.ChainDrafter`: one drafter, state keyed by sequence (llama.cpp's
  ``common_speculative``, vLLM's suffix proposer), shared memory and datastores, each chain sized by what it pays;
* :mod:`.pricing` -- :class:`~.pricing.StepCost`: the engine's step time as a function of the tokens it computes,
  learnt from the run's own steps;
* :mod:`.rows` -- :class:`~.rows.RowTracker`: which sequence a batch row holds, from its tokens (vLLM's proposer
  interface gives no request ids);
* :mod:`.proposer` -- the vLLM ``custom_class`` proposer and its worker extension (loaded by vLLM, in its
  processes);
* :mod:`.vllm_engine` -- ``--engine vllm``: start vLLM with one of its drafters or ours, generate, read the
  statistics back.

Nothing here imports vLLM at module level: the drafter and its tests run without it.
"""

ENV = "SPECDEC_VLLM_DRAFTER"  # the proposer's settings, JSON, inherited by vLLM's worker processes
PROPOSER = "specdec_cli.serving.proposer.SpecdecProposer"  # vLLM's speculative_config["model"] for auto
EXTENSION = "specdec_cli.serving.proposer.SpecdecWorkerExtension"  # vLLM's worker_extension_cls
