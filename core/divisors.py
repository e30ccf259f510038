"""Divisors of a size, for splitting work and for error messages that say what would divide."""

from __future__ import annotations


def divisors(n: int) -> list[int]:
    """Divisors of n in increasing order, by trial division up to sqrt(n): n = 10^12 takes 10^6 steps."""
    small, large = [], []
    d = 1
    while d * d <= n:
        if n % d == 0:
            small.append(d)
            if d != n // d:
                large.append(n // d)
        d += 1
    return small + large[::-1]


def divisors_near(n: int, wanted: int, count: int = 5) -> str:
    """The ``count`` divisors of n closest to ``wanted``, in increasing order, comma-separated."""
    near = sorted(divisors(n), key=lambda d: (abs(d - wanted), d))[:count]
    return ", ".join(map(str, sorted(near)))
