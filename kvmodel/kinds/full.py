"""Full attention, plain and over MLA's latent vectors (a spec of its own): every token attends to
every token before it, so a hit needs every block from the first, and nothing is ever released."""

from __future__ import annotations

from kvmodel.kinds.base import Kind


class FullAttention(Kind):
    full_hit = True


FULL = FullAttention("full")
MLA = FullAttention("mla")
KINDS = (FULL, MLA)
