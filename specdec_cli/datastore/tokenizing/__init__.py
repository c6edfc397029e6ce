"""Corpus -> token ids, fast and exact: tokenizer worker processes (``tokenize``), tokenization by cached pieces
(``pieces``) and where text may be cut for it (``cuts``)."""
