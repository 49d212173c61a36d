"""The abstract reference model of a paged KV-cache allocator, and the named invariants.

Plain lists, dicts and sets that state what the allocator must do.  Nothing
here imports ``kvcore``: the model is an independent statement of the
semantics, not a second copy of the code under test.
"""
