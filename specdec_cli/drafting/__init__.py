"""Draft sources that ``auto`` combines: n-gram positions of a token buffer (the request's own context and the
memory of past outputs), and the union tree that merges every source's candidates into one draft."""
