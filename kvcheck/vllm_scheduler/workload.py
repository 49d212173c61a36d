"""Workloads: what users ask of an engine, step by step, rather than which allocator calls to make.

A workload is requests arriving before given engine steps, each with its prompt and the tokens it will
sample (its ``max_tokens`` is their number, so it stops by length), and aborts.  The scheduler decides
everything else: whom to admit, how to chunk a prompt, whom to preempt when the pool runs dry.
"""

from __future__ import annotations

import random

import attrs

from kvmodel.config_checks import int_tuple


@attrs.frozen
class Arrival:
    """Request ``request_id`` arrives before engine step ``step`` with ``prompt``; the model samples
    ``outputs`` one by one, and the request stops once it has them all."""

    step: int
    request_id: str
    prompt: tuple[int, ...] = attrs.field(converter=int_tuple)
    outputs: tuple[int, ...] = attrs.field(converter=int_tuple)

    def __attrs_post_init__(self) -> None:
        if not self.prompt:
            raise ValueError(f"arrival {self.request_id!r}: the prompt is empty")
        if not self.outputs:
            raise ValueError(f"arrival {self.request_id!r}: no output token (max_tokens would be 0)")


@attrs.frozen
class Abort:
    """The user aborts request ``request_id`` before engine step ``step`` (nothing, if it is done)."""

    step: int
    request_id: str


@attrs.frozen
class Workload:
    """Arrivals and aborts, in step order."""

    arrivals: tuple[Arrival, ...]
    aborts: tuple[Abort, ...] = ()

    def __attrs_post_init__(self) -> None:
        ids = [arrival.request_id for arrival in self.arrivals]
        repeated = sorted({rid for rid in ids if ids.count(rid) > 1})
        if repeated:
            raise ValueError(f"requests arrive twice: {repeated}")
        unknown = sorted({abort.request_id for abort in self.aborts} - set(ids))
        if unknown:
            raise ValueError(f"aborts of requests that never arrive: {unknown}")

    @property
    def last_step(self) -> int:
        """The last step before which something arrives or is aborted."""
        return max([a.step for a in self.arrivals] + [a.step for a in self.aborts], default=0)


TOKEN_ALPHABET = 3
"""Token ids drawn from a few values, so prompts and outputs share prefixes."""


def random_workload(
    rng: random.Random,
    max_requests: int = 8,
    max_prompt_tokens: int = 24,
    max_outputs: int = 8,
    steps: int = 12,
    max_tokens: int | None = None,
) -> Workload:
    """A workload of up to ``max_requests`` requests arriving over the first ``steps`` engine steps:
    fresh prompts over a small alphabet, a third of them continuing an earlier request's prompt and
    outputs (the next turn of a conversation, whose prefix is cached), a few repeating one; up to
    ``max_outputs`` tokens sampled each; one request in eight aborted a few steps after it arrives.
    With ``max_tokens``, no request's prompt and outputs together are longer (a continuation keeps its
    prompt's end)."""
    arrivals: list[Arrival] = []
    aborts: list[Abort] = []
    for index in range(rng.randint(1, max_requests)):
        step = rng.randint(0, steps)
        fresh = tuple(rng.randrange(TOKEN_ALPHABET) for _ in range(rng.randint(1, max_prompt_tokens)))
        earlier = [a for a in arrivals if a.step <= step]
        roll = rng.random()
        if earlier and roll < 1 / 3:
            source = rng.choice(earlier)
            prompt = (*source.prompt, *source.outputs, *fresh[: rng.randint(1, 8)])
        elif earlier and roll < 1 / 2:
            prompt = rng.choice(earlier).prompt
        else:
            prompt = fresh
        outputs = tuple(rng.randrange(TOKEN_ALPHABET) for _ in range(rng.randint(1, max_outputs)))
        if max_tokens is not None:
            outputs = outputs[: max(1, max_tokens // 2)]
            prompt = prompt[-max(1, max_tokens - len(outputs)) :]
        arrivals.append(Arrival(step, f"r{index}", prompt, outputs))
        if rng.random() < 1 / 8:
            aborts.append(Abort(step + rng.randint(0, 4), f"r{index}"))
    arrivals.sort(key=lambda a: a.step)
    aborts.sort(key=lambda a: a.step)
    return Workload(tuple(arrivals), tuple(aborts))
