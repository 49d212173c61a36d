"""The manager machine: requests scheduled, decoded, preempted and freed across N hybrid groups."""

from __future__ import annotations

from hypothesis import event, note, target
from hypothesis import strategies as st
from hypothesis.stateful import Bundle, RuleBasedStateMachine, consumes, initialize, multiple, precondition, rule

from kvcheck.config import TargetConfig
from kvcheck.lockstep import Lockstep
from kvcheck.ops import (
    AddRequest,
    EvictBlocks,
    FailedLoad,
    Finish,
    Operation,
    Preempt,
    ResetPrefixCache,
    Schedule,
    describe_op,
)
from kvcheck.targets import TargetFactory
from stateful_tests.coverage import EXTERNAL_WITH_LOCAL_HIT, LABELS_SEEN, BeforeStep, step_labels
from stateful_tests.strategies import MAX_LIVE_REQUESTS, prompts, target_configs, tokens


def manager_machine(
    make_target: TargetFactory, num_groups: int | None = None, check: bool = True
) -> type[RuleBasedStateMachine]:
    """A state machine class driving ``make_target`` and the model in lockstep.

    The configuration is drawn once per run (``num_groups`` fixes the group
    count).  With ``check`` off the invariants are skipped, for measuring
    what they cost.
    """

    class ManagerMachine(RuleBasedStateMachine):
        requests = Bundle("requests")

        def __init__(self) -> None:
            super().__init__()
            self.lockstep: Lockstep
            self.next_request = 0
            self.held_before_preemption: dict[str, set[int]] = {}
            self.warm_external_hits = 0

        def _step(self, op: Operation) -> None:
            model = self.lockstep.model
            before = BeforeStep.capture(model, op)
            result, _ = self.lockstep.step(op)
            note(f"step {len(self.lockstep.trace)}: {describe_op(op)} -> {result}")
            for label in step_labels(op, result, before, model, self.held_before_preemption):
                event(label)
                LABELS_SEEN[label] += 1
                if label == EXTERNAL_WITH_LOCAL_HIT:
                    self.warm_external_hits += 1 + len(before.free & before.cached)

        def teardown(self) -> None:
            # Steer generation towards the states where cross-group bugs live:
            # a prefix hit taken with externally loaded tokens while the free
            # queue holds cached blocks (a warm pool).
            target(float(self.warm_external_hits), label="external tokens with a hit on a warm pool")

        @initialize(
            target=requests,
            config=target_configs(num_groups),
            warm_start=st.booleans(),
            extra=st.integers(2, 4),
            resume_external_tokens=st.none() | st.integers(0, 8),
        )
        def configure(
            self, config: TargetConfig, warm_start: bool, extra: int, resume_external_tokens: int | None
        ) -> object:
            """Draw the configuration; on a warm start, begin under memory pressure: a request whose
            prefill took every free block was preempted, leaving the pool full of its cached blocks,
            and may have been resumed at once (as a scheduler resumes preempted requests first),
            part of its prompt loaded by a KV connector."""
            note(f"config: {config.describe()}")
            self.lockstep = Lockstep(make_target, config, check=check)
            per_group_tokens = (config.num_blocks - 1) // len(config.groups) * config.block_size
            if not warm_start or per_group_tokens == 0:
                return multiple()
            request_id = self.add_request((0,) * (per_group_tokens + extra))
            self._step(Schedule(request_id, per_group_tokens, 0, 0))
            self._step(Preempt(request_id))
            if resume_external_tokens is not None:
                self._step(Schedule(request_id, extra, resume_external_tokens, 0))
            return request_id

        @precondition(lambda self: len(self.lockstep.model.requests) < MAX_LIVE_REQUESTS)
        @rule(target=requests, prompt=prompts)
        def add_request(self, prompt: tuple[int, ...]) -> str:
            request_id = f"r{self.next_request}"
            self.next_request += 1
            self._step(AddRequest(request_id, prompt))
            return request_id

        @rule(target=requests, source=consumes(requests), extension=prompts)
        def next_turn(self, source: str, extension: tuple[int, ...]) -> str:
            """A conversation turn ends and the next one arrives carrying everything said so far."""
            prompt = (*self.lockstep.model.requests[source].tokens, *extension)
            self.finish(source)
            return self.add_request(prompt)

        @precondition(lambda self: len(self.lockstep.model.requests) < MAX_LIVE_REQUESTS)
        @rule(target=requests, token=tokens)
        def add_request_filling_pool(self, token: int) -> str:
            """A request whose prompt, prefilled at once, takes every free block: the boundary where
            freed blocks are all that is left to allocate from."""
            model = self.lockstep.model
            blocks_per_group = max(1, len(model.pool.free_order) // len(model.groups))
            return self.add_request((token,) * (blocks_per_group * model.block_size))

        @rule(
            request_id=requests,
            num_new_tokens=st.integers(1, 32),
            num_external_tokens=st.integers(0, 8),
            sampled_token=tokens,
        )
        def schedule(self, request_id: str, num_new_tokens: int, num_external_tokens: int, sampled_token: int) -> None:
            self._step(Schedule(request_id, num_new_tokens, num_external_tokens, sampled_token))

        @rule(request_id=requests, sampled_token=tokens)
        def decode(self, request_id: str, sampled_token: int) -> None:
            self._step(Schedule(request_id, 1, 0, sampled_token))

        @rule(request_id=consumes(requests))
        def finish(self, request_id: str) -> None:
            self._step(Finish(request_id))

        @rule(request_id=requests)
        def preempt(self, request_id: str) -> None:
            self._step(Preempt(request_id))

        @rule(request_id=requests)
        def failed_load(self, request_id: str) -> None:
            self._step(FailedLoad(request_id))

        @precondition(lambda self: bool(self.lockstep.model.pool.cache))
        @rule(data=st.data())
        def evict_blocks(self, data: st.DataObject) -> None:
            cached = sorted(self.lockstep.model.pool.cache)
            block_ids = data.draw(st.lists(st.sampled_from(cached), min_size=1, max_size=3, unique=True))
            self._step(EvictBlocks(tuple(block_ids)))

        @precondition(lambda self: len(self.lockstep.model.requests) <= 1)
        @rule()
        def reset_prefix_cache(self) -> None:
            self._step(ResetPrefixCache())

    return ManagerMachine
