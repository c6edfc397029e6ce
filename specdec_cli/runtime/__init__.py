"""Running a model on this machine: forwards with explicit positions and tree masks (``forward``), the KV caches
(``kvcache``: growing; ``static_cache``: fixed-size, optionally compiled), the tree shape a forward needs
(``positions``), the CPU linear kernels (``kernels``), the measured forward-time profile (``profile``), facts about
the machine (``machine``) and numba (``jit``)."""
