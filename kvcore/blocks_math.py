"""Token and block arithmetic shared by every module."""


def ceil_div(n_tokens: int, block_size: int) -> int:
    """The number of ``block_size`` blocks that hold ``n_tokens`` tokens."""
    return -(-n_tokens // block_size)
