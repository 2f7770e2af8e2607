"""Sizes as people read them, one way everywhere (plan, redo, status, logs)."""

TB = 1e12


def human_bytes(n: float) -> str:
    """Binary units up to GiB; from 0.1 TB on, the decimal TB that volumes are sold in, with TiB
    beside it (``df -h`` prints TiB as "T": the two differ by 10% at that scale)."""
    if n >= 0.1 * TB:
        return f"{n / TB:.2f} TB ({n / 2**40:.2f} TiB)"
    for unit in ("B", "KiB", "MiB"):
        if n < 1024:
            return f"{n:.1f} {unit}" if unit != "B" else f"{n:.0f} B"
        n /= 1024
    return f"{n:.1f} GiB"
