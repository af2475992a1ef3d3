"""Small helpers for what rlstore prints."""


def plural(count: int, noun: str, many: str | None = None) -> str:
    """'1 run', '2 runs', '1,000 episodes' (`many` for irregular plurals)."""
    return f"{count:,} {noun if count == 1 else many or noun + 's'}"


def size(nbytes: float) -> str:
    """'512 KiB', '30.5 MiB', '7.2 GiB'."""
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20)):
        if nbytes >= scale:
            return f"{nbytes / scale:.1f} {unit}"
    return f"{nbytes / 2**10:.0f} KiB"
