"""RACES atomic environments: number_theory (divisibility, primes, modular arithmetic and
integer sequences).

Covers gcd/lcm with fixed partners and over lists, prime factorizations (as int_list or
int_set), divisor functions, primality and prime counting, residues, the Chinese remainder
theorem, modular inverses, powers and orders modulo fixed primes, and Fibonacci numbers.
Plain digit and rational arithmetic live in `numbers`; binary representations in `bits`.

Input constraints keep every mapper under a few milliseconds: factorizations use trial division
on inputs up to 10**9 (at most ~16,000 divisions), primality tests on larger inputs use a
Miller-Rabin test whose twelve prime bases make it exact far beyond 10**12. Each mapper carries
its own copy of the helper it needs, since mappers must be self-contained.
"""

from __future__ import annotations

import random

from tirl.envs.core import atomic
from tirl.envs.types import Bool, Int, IntList, IntSet

_SMALL_PRIMES = (2, 3, 5, 7, 11, 13, 17, 19, 23, 29, 31, 37, 41, 43, 47)
_PERFECT = (6, 28, 496, 8128, 33550336)


def _fibonacci_numbers(limit: int) -> tuple[int, ...]:
    out, a, b = [], 0, 1
    while a <= limit:
        out.append(a)
        a, b = b, a + b
    return tuple(out)


_FIBONACCI = _fibonacci_numbers(10**12)


def _is_prime(n: int) -> bool:
    """Miller-Rabin with the first twelve primes as bases: exact for n < 3.3 * 10**24."""
    if n < 2:
        return False
    bases = (2, 3, 5, 7, 11, 13, 17, 19, 23, 29, 31, 37)
    for p in bases:
        if n % p == 0:
            return n == p
    d, s = n - 1, 0
    while d % 2 == 0:
        d, s = d // 2, s + 1
    for a in bases:
        x = pow(a, d, n)
        if x in (1, n - 1):
            continue
        for _ in range(s - 1):
            x = x * x % n
            if x == n - 1:
                break
        else:
            return False
    return True


def _smooth_number(rng: random.Random, level: int) -> int:
    """A product of small primes, so that factorizations have several, repeated factors."""
    limit = (100, 10**5, 10**9)[min(level, 3) - 1]
    n = 1
    for _ in range(2 + 3 * level):
        p = rng.choice(_SMALL_PRIMES[: 4 + 3 * level])
        if n * p > limit:
            break
        n *= p
    return max(n, 2)


def _factor_sampler(rng: random.Random, level: int) -> int:
    """Inputs in [2, 10**9]: smooth numbers, numbers of every size, and a few large primes."""
    r = rng.random()
    if r < 0.4:
        return _smooth_number(rng, level)
    if r < 0.9 or level < 3:
        return rng.randint(2, (100, 10**5, 10**9)[min(level, 3) - 1])
    n = rng.randint(10**8, 10**9)
    while not _is_prime(n):
        n += 1
    return n


def _prime_or_not_sampler(rng: random.Random, level: int) -> int:
    """Half primes, half odd composites or other numbers, growing with the level."""
    bound = (100, 10**5, 10**9)[min(level, 3) - 1]
    n = rng.randint(2, bound)
    if rng.random() < 0.5:
        while not _is_prime(n):
            n += 1
    return n


def _perfect_sampler(rng: random.Random, level: int) -> int:
    if rng.random() < 0.3:
        return rng.choice(_PERFECT[: 2 + level])
    return _factor_sampler(rng, level)


def _fibonacci_sampler(rng: random.Random, level: int) -> int:
    bound = (100, 10**6, 10**12)[min(level, 3) - 1]
    if rng.random() < 0.5:
        return rng.choice([f for f in _FIBONACCI if 0 < f <= bound])
    return rng.randint(1, bound)


# --- gcd and lcm ----------------------------------------------------------------------------


@atomic(
    "number_theory",
    Int(),
    Int(1, 360),
    "Compute the greatest common divisor of the input and 360 (the gcd of 0 and 360 is 360; "
    "the sign of the input does not matter).",
    sampler=lambda rng, level: rng.randint(-(10**level), 10 ** (level + 1)),
)
def gcd_with_360(n):
    import math

    return math.gcd(n, 360)


@atomic(
    "number_theory",
    Int(-(10**9), 10**9),
    Int(0, 12 * 10**9),
    "Compute the least common multiple of the absolute value of the input and 12 (0 if the "
    "input is 0).",
)
def lcm_with_12(n):
    import math

    return math.lcm(n, 12)


@atomic(
    "number_theory",
    IntList(min_len=1, max_len=64),
    Int(0, 10**9),
    "Compute the greatest common divisor of all the numbers in the input list, ignoring their "
    "signs (0 if every number is 0).",
    sampler=lambda rng, level: tuple(
        rng.randint(-(10**level), 10**level) * rng.choice((2, 6, 12, 35))
        for _ in range(rng.randint(2, 2 + 2 * level))
    ),
)
def gcd_of_list(xs):
    import math

    g = 0
    for x in xs:
        g = math.gcd(g, x)
    return g


@atomic(
    "number_theory",
    IntList(min_len=1, max_len=8, lo=1, hi=100),
    Int(1, 10**17),
    "Compute the least common multiple of all the numbers in the input list.",
    sampler=lambda rng, level: tuple(
        rng.randint(1, 6 + 8 * level) for _ in range(rng.randint(2, 2 + 2 * level))
    ),
)
def lcm_of_list(xs):
    import math

    m = 1
    for x in xs:
        m = math.lcm(m, x)
    return m


# --- factorizations and divisors ------------------------------------------------------------


@atomic(
    "number_theory",
    Int(2, 10**9),
    IntList(min_len=1, max_len=30, lo=2, hi=10**9),
    "List the prime factors of the input in increasing order, each repeated as often as it "
    "divides the input (so 12 is [2, 2, 3]).",
    sampler=_factor_sampler,
)
def prime_factors(n):
    out = []
    d = 2
    while d * d <= n:
        while n % d == 0:
            out.append(d)
            n //= d
        d += 1 if d == 2 else 2
    if n > 1:
        out.append(n)
    return tuple(out)


@atomic(
    "number_theory",
    Int(2, 10**9),
    IntSet(min_size=1, max_size=9, lo=2, hi=10**9),
    "Give the set of distinct primes that divide the input.",
    sampler=_factor_sampler,
)
def prime_divisor_set(n):
    out = set()
    d = 2
    while d * d <= n:
        while n % d == 0:
            out.add(d)
            n //= d
        d += 1 if d == 2 else 2
    if n > 1:
        out.add(n)
    return frozenset(out)


@atomic(
    "number_theory",
    Int(2, 10**9),
    IntList(min_len=1, max_len=9, lo=1, hi=29),
    "Factor the input into primes and list the exponents of its distinct prime factors, in "
    "increasing order of the primes (so 360 = 2^3 * 3^2 * 5 gives [3, 2, 1]).",
    sampler=_factor_sampler,
)
def prime_exponents(n):
    out = []
    d = 2
    while d * d <= n:
        if n % d == 0:
            e = 0
            while n % d == 0:
                e += 1
                n //= d
            out.append(e)
        d += 1 if d == 2 else 2
    if n > 1:
        out.append(1)
    return tuple(out)


@atomic(
    "number_theory",
    Int(2, 10**9),
    Int(2, 10**9),
    "Give the smallest prime that divides the input.",
    sampler=_factor_sampler,
)
def smallest_prime_factor(n):
    d = 2
    while d * d <= n:
        if n % d == 0:
            return d
        d += 1 if d == 2 else 2
    return n


@atomic(
    "number_theory",
    Int(2, 10**9),
    Int(2, 10**9),
    "Give the largest prime that divides the input.",
    sampler=_factor_sampler,
)
def largest_prime_factor(n):
    d = 2
    largest = 1
    while d * d <= n:
        while n % d == 0:
            largest = d
            n //= d
        d += 1 if d == 2 else 2
    return n if n > 1 else largest


@atomic(
    "number_theory",
    Int(2, 10**9),
    Int(2, 10**9),
    "Add up the prime factors of the input, each counted as often as it divides the input "
    "(so 12 = 2 * 2 * 3 gives 7).",
    sampler=_factor_sampler,
)
def sum_of_prime_factors(n):
    total = 0
    d = 2
    while d * d <= n:
        while n % d == 0:
            total += d
            n //= d
        d += 1 if d == 2 else 2
    return total + (n if n > 1 else 0)


@atomic(
    "number_theory",
    Int(1, 10**9),
    Int(1, 10**9),
    "Give the radical of the input: the product of its distinct prime factors (1 for the input 1).",
    sampler=lambda rng, level: (
        rng.choice((4, 8, 9, 12, 18, 25, 27, 49)) * rng.randint(1, 10 ** (2 * level))
        if rng.random() < 0.8
        else rng.randint(1, 10**level)
    ),
)
def radical(n):
    r = 1
    d = 2
    while d * d <= n:
        if n % d == 0:
            r *= d
            while n % d == 0:
                n //= d
        d += 1 if d == 2 else 2
    return r * n


@atomic(
    "number_theory",
    Int(1, 10000),
    IntList(min_len=1, max_len=64, lo=1, hi=10000),
    "List all positive divisors of the input in increasing order.",
    sampler=lambda rng, level: rng.randint(1, (30, 500, 10000)[min(level, 3) - 1]),
)
def divisors(n):
    return tuple(d for d in range(1, n + 1) if n % d == 0)


@atomic(
    "number_theory",
    Int(1, 10000),
    IntSet(min_size=1, max_size=32, lo=1, hi=10000),
    "Give the set of odd positive divisors of the input.",
    sampler=lambda rng, level: rng.randint(1, (30, 500, 10000)[min(level, 3) - 1]),
)
def odd_divisors(n):
    return frozenset(d for d in range(1, n + 1, 2) if n % d == 0)


@atomic(
    "number_theory",
    Int(1, 10**9),
    Int(1, 1344),
    "Count the positive divisors of the input (1 and the input itself included).",
    sampler=_factor_sampler,
)
def divisor_count(n):
    count = 1
    d = 2
    while d * d <= n:
        e = 0
        while n % d == 0:
            e += 1
            n //= d
        count *= e + 1
        d += 1 if d == 2 else 2
    return count * (2 if n > 1 else 1)


@atomic(
    "number_theory",
    Int(1, 10**9),
    Int(1, 6 * 10**9),
    "Add up all positive divisors of the input (1 and the input itself included).",
    sampler=_factor_sampler,
)
def divisor_sum(n):
    total = 1
    d = 2
    while d * d <= n:
        term, power = 1, 1
        while n % d == 0:
            power *= d
            term += power
            n //= d
        total *= term
        d += 1 if d == 2 else 2
    return total * (n + 1 if n > 1 else 1)


@atomic(
    "number_theory",
    Int(1, 10**9),
    Int(0, 5 * 10**9),
    "Add up the proper divisors of the input: its positive divisors other than the input "
    "itself (0 for the input 1).",
    sampler=_perfect_sampler,
)
def proper_divisor_sum(n):
    m, total = n, 1
    d = 2
    while d * d <= m:
        term, power = 1, 1
        while m % d == 0:
            power *= d
            term += power
            m //= d
        total *= term
        d += 1 if d == 2 else 2
    return total * (m + 1 if m > 1 else 1) - n


@atomic(
    "number_theory",
    Int(1, 10**9),
    Bool(),
    "Decide whether the input is a perfect number: one equal to the sum of its positive "
    "divisors other than itself.",
    sampler=_perfect_sampler,
)
def is_perfect(n):
    m, total = n, 1
    d = 2
    while d * d <= m:
        term, power = 1, 1
        while m % d == 0:
            power *= d
            term += power
            m //= d
        total *= term
        d += 1 if d == 2 else 2
    return total * (m + 1 if m > 1 else 1) - n == n


@atomic(
    "number_theory",
    Int(1, 10**9),
    Int(-1, 1),
    "Compare the sum of the input's positive divisors other than itself with the input: give "
    "-1 if the sum is smaller (deficient), 0 if equal (perfect), 1 if larger (abundant).",
    sampler=_perfect_sampler,
)
def abundance_sign(n):
    m, total = n, 1
    d = 2
    while d * d <= m:
        term, power = 1, 1
        while m % d == 0:
            power *= d
            term += power
            m //= d
        total *= term
        d += 1 if d == 2 else 2
    s = total * (m + 1 if m > 1 else 1) - n
    return (s > n) - (s < n)


@atomic(
    "number_theory",
    Int(1, 10**9),
    Int(1, 10**9),
    "Compute Euler's totient of the input: how many of the integers 1, 2, ..., n are coprime to "
    "the input n.",
    sampler=_factor_sampler,
)
def euler_phi(n):
    result = n
    d = 2
    while d * d <= n:
        if n % d == 0:
            result -= result // d
            while n % d == 0:
                n //= d
        d += 1 if d == 2 else 2
    if n > 1:
        result -= result // n
    return result


@atomic(
    "number_theory",
    Int(1, 60),
    IntList(min_len=1, max_len=60, lo=1, hi=60),
    "List, in increasing order, the integers from 1 to the input n that are coprime to n (for "
    "the input 1 the list is [1]).",
    sampler=lambda rng, level: rng.randint(1, (12, 30, 60)[min(level, 3) - 1]),
)
def coprime_residues(n):
    import math

    return tuple(k for k in range(1, n + 1) if math.gcd(k, n) == 1)


@atomic(
    "number_theory",
    Int(1, 10**9),
    Bool(),
    "Decide whether the input is squarefree: no square of a prime divides it (1 is squarefree).",
    sampler=_factor_sampler,
)
def is_squarefree(n):
    d = 2
    while d * d <= n:
        if n % d == 0:
            n //= d
            if n % d == 0:
                return False
        d += 1 if d == 2 else 2
    return True


@atomic(
    "number_theory",
    Int(1, 10**9),
    Int(-1, 1),
    "Compute the Moebius function of the input: 0 if the square of some prime divides it, "
    "otherwise 1 if it has an even number of prime factors and -1 if odd (the value at 1 is "
    "1).",
    sampler=_factor_sampler,
)
def mobius(n):
    sign = 1
    d = 2
    while d * d <= n:
        if n % d == 0:
            n //= d
            if n % d == 0:
                return 0
            sign = -sign
        d += 1 if d == 2 else 2
    return -sign if n > 1 else sign


@atomic(
    "number_theory",
    Int(0, 10**12),
    Int(0, 10**12),
    "Count the trailing zeros of the factorial of the input (n! = 1 x 2 x ... x n), that is, "
    "the exponent of the largest power of 10 dividing it.",
    sampler=lambda rng, level: rng.randint(0, 10 ** (2 * level)),
)
def factorial_trailing_zeros(n):
    count = 0
    while n:
        n //= 5
        count += n
    return count


# --- primes ---------------------------------------------------------------------------------


@atomic(
    "number_theory",
    Int(),
    Bool(),
    "Decide whether the input is a prime number (negative numbers, 0 and 1 are not prime).",
    sampler=_prime_or_not_sampler,
)
def is_prime(n):
    if n < 2:
        return False
    for p in (2, 3, 5, 7, 11, 13, 17, 19, 23, 29, 31, 37):
        if n % p == 0:
            return n == p
    d, s = n - 1, 0
    while d % 2 == 0:
        d, s = d // 2, s + 1
    for a in (2, 3, 5, 7, 11, 13, 17, 19, 23, 29, 31, 37):
        x = pow(a, d, n)
        if x in (1, n - 1):
            continue
        for _ in range(s - 1):
            x = x * x % n
            if x == n - 1:
                break
        else:
            return False
    return True


@atomic(
    "number_theory",
    Int(),
    Int(2, 10**12 + 39),
    "Give the smallest prime number strictly greater than the input.",
    sampler=_prime_or_not_sampler,
)
def next_prime(n):
    def prime(m):
        if m < 2:
            return False
        for p in (2, 3, 5, 7, 11, 13, 17, 19, 23, 29, 31, 37):
            if m % p == 0:
                return m == p
        d, s = m - 1, 0
        while d % 2 == 0:
            d, s = d // 2, s + 1
        for a in (2, 3, 5, 7, 11, 13, 17, 19, 23, 29, 31, 37):
            x = pow(a, d, m)
            if x in (1, m - 1):
                continue
            for _ in range(s - 1):
                x = x * x % m
                if x == m - 1:
                    break
            else:
                return False
        return True

    m = max(n + 1, 2)
    while not prime(m):
        m += 1
    return m


@atomic(
    "number_theory",
    Int(3, 10**12),
    Int(2, 10**12),
    "Give the largest prime number strictly less than the input.",
    sampler=lambda rng, level: max(3, _prime_or_not_sampler(rng, level)),
)
def previous_prime(n):
    def prime(m):
        if m < 2:
            return False
        for p in (2, 3, 5, 7, 11, 13, 17, 19, 23, 29, 31, 37):
            if m % p == 0:
                return m == p
        d, s = m - 1, 0
        while d % 2 == 0:
            d, s = d // 2, s + 1
        for a in (2, 3, 5, 7, 11, 13, 17, 19, 23, 29, 31, 37):
            x = pow(a, d, m)
            if x in (1, m - 1):
                continue
            for _ in range(s - 1):
                x = x * x % m
                if x == m - 1:
                    break
            else:
                return False
        return True

    m = n - 1
    while not prime(m):
        m -= 1
    return m


@atomic(
    "number_theory",
    Int(1, 1000),
    Int(2, 7919),
    "Give the n-th prime number, where n is the input and the first prime is 2.",
    sampler=lambda rng, level: rng.randint(1, (10, 100, 1000)[min(level, 3) - 1]),
)
def nth_prime(n):
    sieve = bytearray([1]) * 8000
    sieve[0] = sieve[1] = 0
    for i in range(2, 90):
        if sieve[i]:
            sieve[i * i :: i] = bytearray(len(range(i * i, 8000, i)))
    count = 0
    for i, flag in enumerate(sieve):
        count += flag
        if count == n:
            return i
    raise AssertionError("unreachable: the 1000th prime is 7919")


@atomic(
    "number_theory",
    Int(0, 10**5),
    Int(0, 9592),
    "Count the prime numbers less than or equal to the input.",
    sampler=lambda rng, level: rng.randint(0, (30, 1000, 10**5)[min(level, 3) - 1]),
)
def prime_count(n):
    if n < 2:
        return 0
    sieve = bytearray([1]) * (n + 1)
    sieve[0] = sieve[1] = 0
    i = 2
    while i * i <= n:
        if sieve[i]:
            sieve[i * i :: i] = bytearray(len(range(i * i, n + 1, i)))
        i += 1
    return sum(sieve)


@atomic(
    "number_theory",
    Int(0, 100),
    IntList(min_len=0, max_len=25, lo=2, hi=97),
    "List all prime numbers less than or equal to the input, in increasing order.",
    sampler=lambda rng, level: rng.randint(0, (15, 40, 100)[min(level, 3) - 1]),
)
def primes_up_to(n):
    return tuple(p for p in range(2, n + 1) if all(p % d for d in range(2, p)))


# --- modular arithmetic ---------------------------------------------------------------------


@atomic(
    "number_theory",
    Int(),
    IntList(min_len=5, max_len=5, lo=0, hi=10),
    "List the remainders of the input when divided by 2, 3, 5, 7 and 11, in that order, each "
    "remainder between 0 and the divisor minus 1 (so -1 gives [1, 2, 4, 6, 10]).",
    sampler=lambda rng, level: rng.randint(-(10 ** (level + 1)), 10 ** (2 * level)),
)
def residues_mod_small_primes(n):
    return tuple(n % p for p in (2, 3, 5, 7, 11))


@atomic(
    "number_theory",
    IntList(min_len=3, max_len=3),
    Int(0, 104),
    "The input [a, b, c] lists remainders modulo 3, 5 and 7. Find the unique integer x from 0 "
    "to 104 such that x - a is divisible by 3, x - b by 5 and x - c by 7.",
    sampler=lambda rng, level: (
        (rng.randint(0, 2), rng.randint(0, 4), rng.randint(0, 6))
        if level < 3
        else tuple(rng.randint(-50, 50) for _ in range(3))
    ),
)
def chinese_remainder_3_5_7(abc):
    a, b, c = abc
    return next(x for x in range(105) if x % 3 == a % 3 and x % 5 == b % 5 and x % 7 == c % 7)


@atomic(
    "number_theory",
    Int(),
    Int(0, 96),
    "Give the inverse of the input modulo 97: the number y from 1 to 96 with (input * y) mod "
    "97 = 1. If the input is divisible by 97 it has no inverse; give 0 then.",
    sampler=lambda rng, level: rng.randint(-(10**level), 10 ** (level + 1)),
)
def inverse_mod_97(n):
    return pow(n, -1, 97) if n % 97 else 0


@atomic(
    "number_theory",
    Int(0, 10**12),
    Int(0, 999),
    "Compute 3 raised to the power of the input, modulo 1000 (the last three digits, as a "
    "number from 0 to 999).",
    sampler=lambda rng, level: rng.randint(0, 10 ** (2 * level)),
)
def pow3_mod_1000(n):
    return pow(3, n, 1000)


@atomic(
    "number_theory",
    Int(),
    Int(0, 100),
    "Compute the cube of the input modulo 101, as a remainder from 0 to 100.",
    sampler=lambda rng, level: rng.randint(-(10**level), 10 ** (level + 1)),
)
def cube_mod_101(n):
    return pow(n, 3, 101)


@atomic(
    "number_theory",
    Int(),
    Int(0, 100),
    "Give the multiplicative order of the input modulo 101: the smallest k >= 1 such that the "
    "input raised to the power k leaves remainder 1 when divided by 101 (0 if the input is "
    "divisible by 101).",
    sampler=lambda rng, level: rng.randint(-(10**level), 10 ** (level + 1)),
)
def order_mod_101(n):
    a = n % 101
    if a == 0:
        return 0
    k, x = 1, a
    while x != 1:
        x, k = x * a % 101, k + 1
    return k


@atomic(
    "number_theory",
    Int(),
    Bool(),
    "Decide whether the input is a nonzero square modulo 101: whether some integer y not "
    "divisible by 101 has y * y leaving the same remainder as the input when divided by 101 "
    "(false if the input is divisible by 101).",
    sampler=lambda rng, level: rng.randint(-(10**level), 10 ** (level + 1)),
)
def is_quadratic_residue_mod_101(n):
    return n % 101 != 0 and pow(n, 50, 101) == 1


# --- squares and sequences ------------------------------------------------------------------


@atomic(
    "number_theory",
    Int(),
    Bool(),
    "Decide whether the input is a perfect square, the square of an integer (0 is; negative "
    "numbers are not).",
    sampler=lambda rng, level: (
        rng.randint(0, 10 ** (2 * level)) ** 2 // (1 if rng.random() < 0.5 else 10**level)
        if rng.random() < 0.6
        else rng.randint(-(10**level), 10 ** (3 * level))
    ),
)
def is_perfect_square(n):
    import math

    return n >= 0 and math.isqrt(n) ** 2 == n


@atomic(
    "number_theory",
    Int(-(10**6), 10**6),
    Bool(),
    "Decide whether the input can be written as a sum a^2 + b^2 of the squares of two integers "
    "(0 is allowed as a or b; negative numbers cannot).",
    sampler=lambda rng, level: rng.randint(-(10**level), 10 ** (2 * level)),
)
def is_sum_of_two_squares(n):
    import math

    return n >= 0 and any(
        math.isqrt(n - a * a) ** 2 == n - a * a for a in range(math.isqrt(n // 2) + 1)
    )


@atomic(
    "number_theory",
    Int(0, 58),
    Int(0, 591286729879),
    "Give the n-th Fibonacci number F(n) for the input n, where F(0) = 0, F(1) = 1 and "
    "F(n) = F(n-1) + F(n-2).",
    sampler=lambda rng, level: rng.randint(0, (12, 30, 58)[min(level, 3) - 1]),
)
def fibonacci(n):
    a, b = 0, 1
    for _ in range(n):
        a, b = b, a + b
    return a


@atomic(
    "number_theory",
    Int(1, 10**12),
    Int(2, 59),
    "With Fibonacci numbers F(0) = 0, F(1) = 1, F(k) = F(k-1) + F(k-2), give the largest index "
    "k such that F(k) is less than or equal to the input (for the input 1 this is 2).",
    sampler=_fibonacci_sampler,
)
def fibonacci_index(n):
    a, b, k = 1, 2, 2  # F(k), F(k+1), k
    while b <= n:
        a, b, k = b, a + b, k + 1
    return k


@atomic(
    "number_theory",
    Int(),
    Bool(),
    "Decide whether the input is a Fibonacci number, one of 0, 1, 2, 3, 5, 8, 13, ... where "
    "each number is the sum of the two before it.",
    sampler=_fibonacci_sampler,
)
def is_fibonacci(n):
    a, b = 0, 1
    while a < n:
        a, b = b, a + b
    return a == n
