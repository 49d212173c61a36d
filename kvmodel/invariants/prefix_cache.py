"""The invariants of the prefix cache: its map, its events, the hits it gives and what a hit's blocks hold."""

from __future__ import annotations

from collections import Counter

from kvmodel.config import TargetConfig
from kvmodel.invariants.against_model import same_result
from kvmodel.invariants.check import EventReplay, InvariantViolation, StepCheck, fail
from kvmodel.observation import ClearedEvent, RemovedEvent, StoredEvent
from kvmodel.ops import Schedule


def has_partial_keys(config: TargetConfig, group_id: int) -> bool:
    """Whether group ``group_id`` may cache a block under a hash boundary inside it (a partial key): a
    full-attention group with blocks larger than the hashes (the prompt's last boundary), and an
    align-mode Mamba group with blocks larger than the hashes (the state there; with sub-block hits off
    beside a window hashed finer, vLLM 0.33.0 still keys the prompt's last hash boundary)."""
    if config.group_block_size(group_id) == config.hash_size:
        return False
    rules = config.groups[group_id].rules
    return rules.full_hit or rules.aligned_states


def cache_map_consistent(check: StepCheck) -> None:
    """Every prefix-cache entry points to a block whose hash is that key, every hashed block is
    in the map, and every key covers whole blocks (and the lookahead tokens hashes cover).

    Guards: a reused block keeping its stale hash; eviction that clears the
    block but not the map entry (or the reverse)."""
    from_map = {(g, prefix, b) for g, prefix, b in check.sut.cache_entries}
    from_blocks = {(g, prefix, b) for b, keys in check.sut.block_cache_keys.items() for g, prefix in keys}
    if from_map != from_blocks:
        stale = sorted(from_map - from_blocks, key=repr)[:3]
        missing = sorted(from_blocks - from_map, key=repr)[:3]
        fail(
            check,
            "cache_map_consistent",
            f"map entries without a matching block hash: {stale}; hashed blocks missing from the map: {missing}",
        )
    config = check.config
    lookahead = config.num_hash_lookahead_tokens
    hash_size = config.hash_size
    for group_id, prefix, block_id in sorted(from_map, key=repr):
        covered = len(prefix) - lookahead
        block_size = config.group_block_size(group_id)
        # A partial key (blocks larger than the hashes) ends on a hash boundary.
        partial = has_partial_keys(config, group_id)
        unit = hash_size if partial else block_size
        if covered <= 0 or covered % unit:
            after = f" and the {lookahead} tokens after them" if lookahead else ""
            whole = f"whole {unit}-token {'hashes' if partial else 'blocks'}"
            fail(
                check,
                "cache_map_consistent",
                f"block {block_id} (group {group_id}) is cached under a {len(prefix)}-token prefix, not {whole}{after}",
            )


def events_match_cache(check: StepCheck) -> None:
    """Replayed from the first step, the KV cache event stream rebuilds exactly the prefix cache's
    entries: each (group, prefix) as many times as blocks are cached under it.  No event removes an
    entry the stream does not hold, and every stored event is well formed: its entries extend its
    parent, one per whole block it covers, over its own tokens.

    Guards: an eviction or reset that is not reported (an external cache or
    router keeps routing to blocks that are gone); a store reported twice or
    never; a store naming the wrong parent or tokens."""
    if not check.config.enable_kv_cache_events:
        return
    events = check.sut.events
    replay = check.event_replay if check.event_replay is not None else EventReplay()
    if not replay.continues(events):
        replay.restart()
    view = replay.view
    try:
        for index in range(len(replay.replayed), len(events)):
            event = events[index]
            if isinstance(event, ClearedEvent):
                view.clear()
            elif isinstance(event, RemovedEvent):
                key = (event.group, event.prefix)
                if view[key] <= 0:
                    fail(
                        check,
                        "events_match_cache",
                        f"event {index} removes group {event.group} prefix {list(event.prefix)}, which the "
                        "stream does not hold (never stored, or removed already)",
                    )
                view[key] -= 1
            else:
                _check_stored_event(check, index, event)
                view.update((event.group, prefix) for prefix in event.prefixes)
    except InvariantViolation:
        replay.restart()  # the view holds part of the failing step's events: a later check starts over
        raise
    replay.replayed = events
    held = Counter((group, prefix) for group, prefix, _ in check.sut.cache_entries)
    if view != held:  # Counter equality counts a missing entry as 0
        unheld = sorted((view - held).items())[:3]
        unreported = sorted((held - view).items())[:3]
        fail(
            check,
            "events_match_cache",
            f"the event stream holds (group, prefix) x count {unheld} beyond the cache (stored twice, or a "
            f"removal not reported); the cache holds {unreported} beyond the stream (a store not reported)",
        )


def _check_stored_event(check: StepCheck, index: int, event: StoredEvent) -> None:
    config = check.config
    group_block_size = config.group_block_size(event.group)
    lookahead = config.num_hash_lookahead_tokens

    def bad(detail: str) -> None:
        fail(check, "events_match_cache", f"stored event {index} (group {event.group}) {detail}")

    # A partial entry's store speaks of the one hash unit ending at its boundary.
    sizes = {group_block_size}
    if has_partial_keys(config, event.group):
        sizes.add(config.hash_size)
    if event.block_size not in sizes:
        bad(f"says blocks of {event.block_size} tokens, not {' or '.join(map(str, sorted(sizes)))}")
    block_size = event.block_size
    if len(event.token_ids) % block_size or not event.token_ids:
        bad(f"covers {len(event.token_ids)} tokens, not a positive number of whole blocks")
    start = 0
    if event.parent is not None:
        if len(event.parent) <= lookahead or (len(event.parent) - lookahead) % block_size:
            bad(f"names a {len(event.parent)}-token parent prefix, not whole blocks")
        start = (len(event.parent) - lookahead) // block_size
    # The tokens the event speaks of: the parent's blocks, then its own.
    tokens = (event.parent or ())[: start * block_size] + event.token_ids
    end = start + len(event.token_ids) // block_size
    if event.parent is not None and tokens[: len(event.parent)] != event.parent[: len(tokens)]:
        bad(f"covers tokens {list(event.token_ids)} that do not follow its parent {list(event.parent)}")
    if (event.lookahead_token_ids is None) != (lookahead == 0):
        bad(f"has lookahead tokens {event.lookahead_token_ids} with hashes looking {lookahead} tokens ahead")
    last = start - 1
    for entry, prefix in enumerate(event.prefixes):
        position = (len(prefix) - lookahead) // block_size - 1
        whole = len(prefix) > lookahead and (len(prefix) - lookahead) % block_size == 0
        if not whole or not last < position < end:
            bad(f"stores a {len(prefix)}-token prefix, not the next whole block among positions {start}..{end - 1}")
        cut = (position + 1) * block_size
        if prefix[:cut] != tokens[:cut] or (event.parent is not None and prefix[: len(event.parent)] != event.parent):
            bad(f"stores prefix {list(prefix)}, which is not its parent and tokens {list(tokens[:cut])}")
        if event.lookahead_token_ids is not None and event.lookahead_token_ids[entry] != prefix[cut:]:
            bad(f"gives lookahead tokens {list(event.lookahead_token_ids[entry])} for prefix {list(prefix)}")
        last = position


def hit_is_sound_and_maximal(check: StepCheck) -> None:
    """A prefix hit returns only blocks cached under the request's own prefix, is block-aligned,
    stays below the request's last token, and is the longest prefix every group accepts.

    Guards: a hit ignoring its length cap; a sliding-window hit needing too
    few or too many blocks; a hybrid hit one group does not accept."""
    sut, model = check.sut_result, check.model_result
    if not isinstance(check.op, Schedule) or model.hit_length is None:
        return
    if sut.hit_length != model.hit_length:
        fail(
            check,
            "hit_is_sound_and_maximal",
            f"hit length of {check.op.request_id} differs",
            model.hit_length,
            sut.hit_length,
        )
    if sut.hit_block_ids != model.hit_block_ids:
        fail(
            check,
            "hit_is_sound_and_maximal",
            f"hit blocks of {check.op.request_id} differ",
            model.hit_block_ids,
            sut.hit_block_ids,
        )


def hit_block_never_written(check: StepCheck) -> None:
    """After a waiting request's admitted step, no group's table holds, at the position where the hit
    ends inside a block, the hit's own block: the request writes its next tokens there, so a block
    shared through the prefix cache must have been replaced by a private copy.

    Guards: a hit that ends inside a larger group's block (aligned to the hash
    size, not the scheduler block size; a partial hit without its copy on
    write), whose cached tokens the request then overwrites (the target's own
    hit and tables, checked without the model)."""
    result = check.sut_result
    hit_length, hit_blocks = result.hit_length, result.hit_block_ids
    if not result.admitted or not hit_length or hit_blocks is None:
        return
    request_id: str = getattr(check.op, "request_id", "")  # an admitted step names its request
    tables = check.sut.tables.get(request_id)
    if tables is None:
        return
    for group_id, (hit, table) in enumerate(zip(hit_blocks, tables)):
        block_size = check.config.group_block_size(group_id)
        position = hit_length // block_size
        inside = hit_length % block_size and position < min(len(hit), len(table)) and hit[position] != 0
        if inside and table[position] == hit[position]:
            fail(
                check,
                "hit_block_never_written",
                f"request {request_id} group {group_id}: its {hit_length}-token hit ends inside block "
                f"{hit[position]} (position {position}, {block_size}-token blocks), which its table still "
                "holds for the tokens it writes next",
                "a private copy",
                hit[position],
            )


def cached_tokens_probe_changes_nothing(check: StepCheck) -> None:
    """``get_num_cached_tokens``, asked of a waiting request before its lookup (releases with the probe),
    changes no observed state and answers what the model's lookup finds.

    Guards: a probe that touches its hit blocks (a reference taken, a free-queue entry moved), records
    the request's lookup, or queues an event, so that asking whether a request would hit changes what
    the next request hits; a probe that answers other than the lookup that follows it."""
    if check.sut_result.probe_changed:
        detail = "get_num_cached_tokens changed the observed state"
        fail(check, "cached_tokens_probe_changes_nothing", detail, (), check.sut_result.probe_changed)
    detail = "get_num_cached_tokens answered other than the model's lookup"
    same_result(check, "probed_tokens", "cached_tokens_probe_changes_nothing", detail)
