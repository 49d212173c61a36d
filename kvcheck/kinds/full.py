"""Full attention, plain and over MLA's latent vectors (a spec of its own)."""

from __future__ import annotations

from kvcheck.kinds.base import HarnessKind
from kvcore.config import AttentionSpec, FullAttentionSpec, MLAAttentionSpec
from kvmodel.group_spec import GroupSpec
from kvmodel.kinds import full as model


class FullAttention(HarnessKind):
    vllm_spec_name = "FullAttentionSpec"
    mixed_weight = 1
    shrinks_to_full = False

    def kvcore_spec(self, group: GroupSpec, block_size: int) -> AttentionSpec:
        return FullAttentionSpec(block_size)


class Mla(HarnessKind):
    vllm_spec_name = "MLAAttentionSpec"
    mixed_weight = 1

    def kvcore_spec(self, group: GroupSpec, block_size: int) -> AttentionSpec:
        return MLAAttentionSpec(block_size)


FULL = FullAttention(model.FULL)
MLA = Mla(model.MLA)
KINDS = (FULL, MLA)
