"""Small helpers for what rlstore prints."""


def plural(count: int, noun: str, many: str | None = None) -> str:
    """'1 run', '2 runs', '1,000 episodes' (`many` for irregular plurals)."""
    return f"{count:,} {noun if count == 1 else many or noun + 's'}"
