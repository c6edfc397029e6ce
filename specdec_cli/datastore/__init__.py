"""Suffix-array datastores for REST: build (``build.py``), on-disk format (``format.py``), retrieval (``retrieval.py``).

The format is documented in docs/datastore-format.md; the method in docs/rest.md.
"""

from .build import build_suffix_array_datastore
from .format import FORMAT_VERSION, token_width
from .retrieval import SuffixArrayDatastore

__all__ = ["build_suffix_array_datastore", "SuffixArrayDatastore", "FORMAT_VERSION", "token_width"]
