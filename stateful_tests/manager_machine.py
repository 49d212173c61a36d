"""The manager machine: requests scheduled, decoded, preempted and freed across N hybrid groups."""

from __future__ import annotations

from hypothesis import event, note
from hypothesis import strategies as st
from hypothesis.stateful import Bundle, RuleBasedStateMachine, consumes, initialize, multiple, precondition, rule

from kvcheck.coverage.before import BeforeStep
from kvcheck.coverage.step import step_labels
from kvcheck.coverage.tally import LABELS_SEEN
from kvcheck.lockstep import Lockstep
from kvcheck.targets import TargetFactory
from kvmodel.ops import (
    AddRequest,
    EvictBlocks,
    FailedLoad,
    Finish,
    FinishAsyncLoad,
    Operation,
    Preempt,
    ProcessOutput,
    ResetPrefixCache,
    Schedule,
    SpecDecode,
    StartAsyncLoad,
    StepResult,
    describe_op,
)

from .strategies import MAX_LIVE_REQUESTS, block_aligned_prompts, prompts, target_configs, tokens

MAX_PREFILL_CHUNKS = 8
"""The most steps one chunked prefill takes (a prompt of a few blocks needs fewer)."""


def manager_machine(
    make_target: TargetFactory, num_groups: int | str | None = None, check: bool = True, drafter_and_async: bool = True
) -> type[RuleBasedStateMachine]:
    """A state machine class driving ``make_target`` and the model in lockstep.

    The configuration is drawn once per run (``num_groups`` fixes the group
    count).  With ``check`` off the invariants are skipped, and without
    ``drafter_and_async`` no configuration has a drafter, lookahead or async
    scheduling: both for measuring what they cost.
    """

    class ManagerMachine(RuleBasedStateMachine):
        requests = Bundle("requests")

        def __init__(self) -> None:
            super().__init__()
            self.lockstep: Lockstep
            self.next_request = 0
            self.held_before_preemption: dict[str, set[int]] = {}
            self.prompts: dict[str, tuple[int, ...]] = {}

        def _step(self, op: Operation) -> StepResult:
            model = self.lockstep.model
            before = BeforeStep.capture(model, op)
            result, _ = self.lockstep.step(op)
            note(f"step {len(self.lockstep.trace)}: {describe_op(op)} -> {result}")
            for label in step_labels(op, result, before, model, self.held_before_preemption):
                event(label)
                LABELS_SEEN[label] += 1
            return result

        @initialize(
            target=requests,
            data=st.data(),
            warm_start=st.sampled_from((False, True, True, True)),
            extra=st.integers(2, 4),
            resume_external_tokens=st.sampled_from((None, *range(9))),
        )
        def configure(
            self, data: st.DataObject, warm_start: bool, extra: int, resume_external_tokens: int | None
        ) -> object:
            """Draw the configuration; on a warm start (three runs in four), begin under memory
            pressure: a request whose prefill took every block was preempted, leaving the pool
            full of its blocks (cached when caching is on), and is usually resumed as soon as the
            scheduler would (it resumes preempted requests first: at once, or under async scheduling
            once its prefill's output is processed), part of its prompt loaded by a KV connector."""
            # A warm pool is mostly one of cached blocks: caching is on in two warm starts in three.
            caching = data.draw(st.sampled_from((None, True)), label="caching") if warm_start else None
            configs = target_configs(num_groups, warm_start, caching, drafter_and_async)
            config = data.draw(configs, label="config")
            note(f"config: {config.describe()}")
            self.lockstep = Lockstep(make_target, config, check=check)
            per_group_tokens = (config.num_blocks - 1) // len(config.groups) * config.block_size
            if not warm_start or per_group_tokens == 0:
                return multiple()
            request_id = self._add((0,) * (per_group_tokens + extra))
            self._step(Schedule(request_id, per_group_tokens, 0, 0))
            self._step(Preempt(request_id))
            if resume_external_tokens is not None:
                if config.async_scheduling:
                    # The scheduler resumes it only once its prefill's output, in flight, is processed.
                    self._step(ProcessOutput())
                self._step(Schedule(request_id, extra, resume_external_tokens, 0))
            return request_id

        @precondition(lambda self: len(self.lockstep.model.requests) < MAX_LIVE_REQUESTS)
        @rule(target=requests, data=st.data())
        def add_request(self, data: st.DataObject) -> str:
            """A request arrives: a new prompt (some of them a whole number of blocks long, where the
            num_tokens - 1 cap and the EAGLE drop bite), or one seen before in this run (the same
            question asked again, or another sample of it, n > 1), whose hit may then cover every
            block the first one computed."""
            fresh = prompts | block_aligned_prompts(self.lockstep.config.scheduler_block_size)
            seen = sorted(set(self.prompts.values()))
            fresh_or_seen = fresh | st.sampled_from(seen) if seen else fresh
            return self._add(data.draw(fresh_or_seen, label="prompt"))

        def _add(self, prompt: tuple[int, ...]) -> str:
            request_id = f"r{self.next_request}"
            self.next_request += 1
            self._step(AddRequest(request_id, prompt))
            self.prompts[request_id] = prompt
            return request_id

        @rule(target=requests, source=consumes(requests), extension=prompts)
        def next_turn(self, source: str, extension: tuple[int, ...]) -> str:
            """A conversation turn ends and the next one arrives carrying everything said so far."""
            prompt = (*self.lockstep.model.requests[source].tokens, *extension)
            self.finish(source)
            return self._add(prompt)

        @precondition(lambda self: len(self.lockstep.model.requests) < MAX_LIVE_REQUESTS)
        @rule(target=requests, token=tokens)
        def add_request_filling_pool(self, token: int) -> str:
            """A request whose prompt, prefilled at once, takes every free block: the boundary where
            freed blocks are all that is left to allocate from."""
            model = self.lockstep.model
            blocks_per_group = max(1, len(model.pool.free_order) // len(model.groups))
            return self._add((token,) * (blocks_per_group * model.block_size))

        @rule(
            request_id=requests,
            num_new_tokens=st.integers(1, 32),
            num_external_tokens=st.integers(0, 8),
            sampled_token=tokens,
        )
        def schedule(self, request_id: str, num_new_tokens: int, num_external_tokens: int, sampled_token: int) -> None:
            """One scheduler step of a request.  Beside an align-mode Mamba group a connector loads the drawn
            external tokens when they are odd, or when the request's lookup ends inside a block (a sub-block
            hit, which the load cuts back when it reaches past the hit, or else keeps whole: both are
            rare otherwise); otherwise it loads none, and, with synchronous scheduling, the step is joined
            by the waiting request sharing the longest prefix with it (vLLM's ``schedule()`` admitting
            several in one pass), which may not hit a state the first cached in the step.  The joining
            request is chosen from what was drawn, not drawn itself, so the search over every other
            configuration stays as it is."""
            model = self.lockstep.model
            loads = num_external_tokens % 2 or not model.aligned_mamba or self._lookup_ends_inside_a_block(request_id)
            self._step(Schedule(request_id, num_new_tokens, num_external_tokens if loads else 0, sampled_token))
            if loads or self.lockstep.config.async_scheduling:
                return
            scheduled = model.requests.get(request_id)
            waiting = [r for r, request in model.requests.items() if r != request_id and request.waiting]
            if scheduled is None or not waiting:
                return

            def shared(other: str) -> tuple[int, int]:
                tokens = model.requests[other].tokens
                common = next((i for i, (a, b) in enumerate(zip(tokens, scheduled.tokens)) if a != b), None)
                return (min(len(tokens), len(scheduled.tokens)) if common is None else common, int(other[1:]))

            self._step(Schedule(max(waiting, key=shared), num_new_tokens, 0, sampled_token, same_step=True))

        def _lookup_ends_inside_a_block(self, request_id: str) -> bool:
            """Whether a waiting request's lookup finds a hit ending inside a scheduler block (the model's lookup,
            which changes nothing)."""
            model = self.lockstep.model
            request = model.requests.get(request_id)
            if request is None or request.running or request.loading or not model.partial_hits:
                return False
            hit_length, _ = model.find_hit(request_id)
            return bool(hit_length % model.config.scheduler_block_size)

        @rule(request_id=requests, chunk_blocks=st.integers(1, 3), sampled_token=tokens)
        def chunked_prefill(self, request_id: str, chunk_blocks: int, sampled_token: int) -> None:
            """The scheduler prefills a request in chunks of one token budget (1 to 3 scheduler blocks),
            one step each, until its prompt is computed or a step is refused, as vLLM's chunked prefill
            splits a prompt longer than the budget across steps."""
            model = self.lockstep.model
            budget = chunk_blocks * self.lockstep.config.scheduler_block_size
            for _ in range(MAX_PREFILL_CHUNKS):
                request = model.requests.get(request_id)
                if request is None or request.loading or request.num_computed_tokens >= request.num_prompt_tokens:
                    return
                if self._step(Schedule(request_id, budget, 0, sampled_token)).admitted is not True:
                    return

        @rule(request_id=requests, sampled_token=tokens)
        def decode(self, request_id: str, sampled_token: int) -> None:
            self._step(Schedule(request_id, 1, 0, sampled_token))

        @precondition(lambda self: bool(self.lockstep.model.decode_ready()))
        @rule(data=st.data(), num_steps=st.integers(2, 10), sampled_token=tokens)
        def decode_several(self, data: st.DataObject, num_steps: int, sampled_token: int) -> None:
            """A running request decodes several tokens, one step each, as it does alone in a batch:
            the generated tokens pile up past the prompt (where R-SWA opens its gap)."""
            request_id = data.draw(st.sampled_from(self.lockstep.model.decode_ready()), label="request")
            for _ in range(num_steps):
                self._step(Schedule(request_id, 1, 0, sampled_token))

        @precondition(lambda self: bool(self.lockstep.model.decode_ready()))
        @rule(data=st.data(), num_draft_tokens=st.integers(1, 4), sampled_token=tokens)
        def spec_decode(self, data: st.DataObject, num_draft_tokens: int, sampled_token: int) -> None:
            """A drafter proposed tokens for a running request at its last token (beside an align-mode
            Mamba group, at least as many as reach where its last step ended); the verifier accepts
            some of them, and the rest are rolled back."""
            request_id = data.draw(st.sampled_from(self.lockstep.model.decode_ready()), label="request")
            num_draft_tokens = max(num_draft_tokens, self.lockstep.model.min_draft_tokens(request_id))
            accepted = data.draw(st.integers(0, num_draft_tokens), label="accepted")
            self._step(SpecDecode(request_id, num_draft_tokens, accepted, sampled_token))

        @precondition(lambda self: bool(self.lockstep.model.pipeline.steps))
        @rule()
        def process_output(self) -> None:
            """The oldest step in flight returns its output (async scheduling)."""
            self._step(ProcessOutput())

        @precondition(lambda self: bool(self.lockstep.model.pipeline.steps))
        @rule(data=st.data(), num_new_tokens=st.integers(1, 8), sampled_token=tokens)
        def schedule_ahead(self, data: st.DataObject, num_new_tokens: int, sampled_token: int) -> None:
            """The async scheduler runs a step ahead: a request with a step in flight is scheduled
            again before that step's output returns (its window must still cover that step)."""
            model = self.lockstep.model
            in_flight = sorted(
                {s.request_id for s in model.pipeline.steps if s.request is model.requests.get(s.request_id)}
            )
            if in_flight:
                request_id = data.draw(st.sampled_from(in_flight), label="request")
                self._step(Schedule(request_id, num_new_tokens, 0, sampled_token))

        @rule(request_id=requests, num_external_tokens=st.integers(1, 8))
        def start_async_load(self, request_id: str, num_external_tokens: int) -> None:
            """A KV connector starts loading part of a waiting request's prompt asynchronously."""
            self._step(StartAsyncLoad(request_id, num_external_tokens))

        @precondition(lambda self: any(m.loading for m in self.lockstep.model.requests.values()))
        @rule(data=st.data())
        def finish_async_load(self, data: st.DataObject) -> None:
            loading = sorted(r for r, m in self.lockstep.model.requests.items() if m.loading)
            self._step(FinishAsyncLoad(data.draw(st.sampled_from(loading), label="request")))

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

        @rule()
        def reset_prefix_cache(self) -> None:
            """Reset the prefix cache, as after a weight update; refused while any block is held."""
            self._step(ResetPrefixCache())

    return ManagerMachine
