"""The evidence that a group of requests is riskier than the rest: one rule, used by clusters for every
candidate and for every alert it has to explain, and the bars it is held to.

A group of `size` requests holds `bad` of the bad requests. If the group did not matter, its bad requests
would be a random draw of `size` from all of them: hypergeometric. The evidence is the chance of drawing
at least `bad` that way (Fisher's exact test, one-sided): exact at any count, a zero included, where a
normal approximation of the risk ratio's interval breaks down (a group holding every bad request, and none
outside it, is the strongest case, not an undefined one).

Two families of questions, each held to its own bar so that each keeps its error rate:
- exploratory (`bar`): every candidate clusters tries in a window. Each passes when its chance is at most
  `level / candidates` (Bonferroni): with `level` 0.01, a window without any cause reports a cluster at
  most about once in a hundred, however many dimensions and values there are.
- alert-directed (`holm`): the groups firing alerts name, chosen before clustering looks at the requests.
  They are few, so they pay for each other only: Holm's step-down procedure over the pass's alert
  hypotheses, the smallest chance against `level / m`, the next against `level / (m - 1)`, and so on
  until one fails. The chance that any of them passes on traffic where none differs is at most `level`.

A chance is written for people by `written` and `p_written` (`p < 1e-300` when it is smaller than a
double shows, never `0.0e+0`).
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Mapping
from dataclasses import dataclass
from typing import TypeVar

# A value (nearly) every request has is no explanation: there is nothing to compare it with.
MIN_OUTSIDE = 20
MAX_RISK = 1000.0
# The tail's terms are summed until they no longer change the sum at double precision.
_NEGLIGIBLE = 1e-17
# Below this a chance is written as a bound: the exact test's tail underflows to 0 past about 1e-308.
SMALLEST_WRITTEN = 1e-300

K = TypeVar("K", bound=Hashable)


def bar(level: float, candidates: int) -> float:
    """The largest chance each of `candidates` tests may have, for a family-wise `level`."""
    return level / max(candidates, 1)


def holm(chances: Mapping[K, float], level: float) -> dict[K, float]:
    """The bar each hypothesis is held to under Holm's procedure at family-wise `level`: in order of chance
    (then key), the first against level / m, the next against level / (m - 1), … while they pass. From the
    first that fails on, every one keeps that failing bar: each chance there is at least the failed one,
    so none passes, and each is above the bar it is shown with."""
    ordered = sorted(chances, key=lambda k: (chances[k], repr(k)))
    bars: dict[K, float] = {}
    stopped: float | None = None
    for rank, key in enumerate(ordered):
        own = level / (len(ordered) - rank)
        if stopped is None and chances[key] > own:
            stopped = own
        bars[key] = own if stopped is None else stopped
    return bars


def written(chance: float) -> str:
    """A chance as a person reads it: two significant digits, or `< 1e-300` below what a double holds."""
    if chance < SMALLEST_WRITTEN:
        return f"< {SMALLEST_WRITTEN:.0e}"
    return f"{chance:.2g}"


def p_written(chance: float) -> str:
    """A p-value as a sentence quotes it: `p = 0.019`, or `p < 1e-300`."""
    text = written(chance)
    return f"p {text}" if text.startswith("<") else f"p = {text}"


def _log_choose(n: int, k: int) -> float:
    return math.lgamma(n + 1) - math.lgamma(k + 1) - math.lgamma(n - k + 1)


@dataclass(frozen=True)
class Evidence:
    size: int
    bad: int
    outside: int
    bad_outside: int

    @property
    def rate_in(self) -> float:
        return self.bad / self.size if self.size else 0.0

    @property
    def rate_out(self) -> float:
        return self.bad_outside / self.outside if self.outside else 0.0

    @property
    def risk_ratio(self) -> float:
        """As observed, capped so that a group never bad outside stays comparable; 0 without a contrast."""
        if self.outside < MIN_OUTSIDE:
            return 0.0
        if self.rate_out > 0:
            return min(self.rate_in / self.rate_out, MAX_RISK)
        return MAX_RISK if self.rate_in > 0 else 0.0

    @property
    def excess(self) -> float:
        """Bad requests beyond what the rest of the window's rate would put in a group this size."""
        return self.bad - self.size * self.rate_out

    @property
    def p_value(self) -> float:
        """The chance that a random `size` of the window's requests holds at least `bad` of its bad ones."""
        n, total_bad = self.size + self.outside, self.bad + self.bad_outside
        if self.outside < MIN_OUTSIDE or self.bad == 0 or self.bad * n <= self.size * total_bad:
            return 1.0  # no contrast, or no more bad requests than chance puts there
        log_first = (
            _log_choose(total_bad, self.bad)
            + _log_choose(n - total_bad, self.size - self.bad)
            - _log_choose(n, self.size)
        )
        term, total, k = 1.0, 1.0, self.bad
        # P(X = k + 1) / P(X = k) for the hypergeometric; past the mode every ratio is below 1.
        while k < min(total_bad, self.size):
            term *= (total_bad - k) * (self.size - k) / ((k + 1) * (n - total_bad - self.size + k + 1))
            total += term
            k += 1
            if term < _NEGLIGIBLE * total:
                break
        return min(1.0, math.exp(log_first + math.log(total)))
