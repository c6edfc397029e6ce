"""REST's suffix-array datastores: building them (``build``), the compiled longest-suffix search (``search``)
and retrieval of continuations (``retrieval``)."""
