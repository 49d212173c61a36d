"""The tally of coverage labels reached in this process."""

from __future__ import annotations

from collections import Counter

LABELS_SEEN: Counter[str] = Counter()
"""Every label reached in this process (each machine run checks those it added)."""
