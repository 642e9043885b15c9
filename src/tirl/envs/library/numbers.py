"""RACES atomic environments: numbers (integer arithmetic, decimal digits, number names and
rationals).

Covers digit manipulation, rounding and clamping, small closed-form sums, English words and
Roman numerals, and exact rational arithmetic (`Fraction`), with environments that cross kinds
(int -> int_list, int -> str, int -> rational, rational -> int, int_list -> rational) so that
chains can move between types. Divisibility, primes and modular arithmetic live in
`number_theory`; binary representations in `bits`.

Every mapper is self-contained (it imports what it uses), and its input constraints keep it
fast and its output short. Where an operation is undefined for some valid input (the reciprocal
of 0), the instruction states the value used instead.
"""

from __future__ import annotations

import random

from tirl.envs.core import atomic
from tirl.envs.types import Bool, Int, IntList, Rational, Str

_WORD_ALPHABET = "abcdefghijklmnopqrstuvwxyz -"
_ROMAN = "IVXLCDM"


def _n_digit_number(rng: random.Random, level: int, max_digits: int = 12) -> int:
    """A non-negative integer whose number of digits grows with the level (1-3, 4-7, 8-12)."""
    lo, hi = ((1, 3), (4, 7), (8, max_digits))[min(level, 3) - 1]
    digits = rng.randint(min(lo, max_digits), min(hi, max_digits))
    return rng.randint(10 ** (digits - 1) if digits > 1 else 0, 10**digits - 1)


def _digit_sampler(rng: random.Random, level: int) -> int:
    return _n_digit_number(rng, level)


def _signed_digit_sampler(rng: random.Random, level: int) -> int:
    n = _n_digit_number(rng, level)
    return -n if rng.random() < 0.4 else n


def _palindrome_sampler(rng: random.Random, level: int) -> int:
    """Half palindromes (up to 12 digits), half plain numbers."""
    n = _n_digit_number(rng, level, 6)
    if rng.random() < 0.5:
        s = str(n)
        return int(s + s[::-1][1:]) if rng.random() < 0.5 else int(s + s[::-1])
    return _n_digit_number(rng, level)


def _below_million_sampler(rng: random.Random, level: int) -> int:
    """Numbers up to 10**6, a quarter of them palindromes or just below a power of ten."""
    n = _n_digit_number(rng, level, 6)
    r = rng.random()
    if r < 0.15:
        return int(str(n)[: (len(str(n)) + 1) // 2] + str(n)[: len(str(n)) // 2][::-1])
    if r < 0.25:
        return 10 ** len(str(n)) - rng.randint(1, 3)
    return n


def _roman_of(n: int) -> str:
    out = []
    for value, symbol in (
        (1000, "M"), (900, "CM"), (500, "D"), (400, "CD"), (100, "C"), (90, "XC"),
        (50, "L"), (40, "XL"), (10, "X"), (9, "IX"), (5, "V"), (4, "IV"), (1, "I"),
    ):  # fmt: skip
        while n >= value:
            out.append(symbol)
            n -= value
    return "".join(out)


def _roman_sampler(rng: random.Random, level: int) -> str:
    return _roman_of(rng.randint(1, (40, 400, 3999)[min(level, 3) - 1]))


def _fraction_pair_sampler(rng: random.Random, level: int) -> tuple[int, int]:
    bound = (12, 100, 1000)[min(level, 3) - 1]
    common = rng.randint(1, bound)
    return rng.randint(1, bound) * common, rng.randint(1, bound) * common


# --- digits ---------------------------------------------------------------------------------


@atomic(
    "numbers",
    Int(-(10**12), 10**12),
    Int(0, 108),
    "Compute the sum of the decimal digits of the input, ignoring its sign.",
    sampler=_signed_digit_sampler,
)
def digit_sum(n):
    return sum(int(c) for c in str(abs(n)))


@atomic(
    "numbers",
    Int(0, 10**12),
    IntList(min_len=1, max_len=13, lo=0, hi=9),
    "List the decimal digits of the input, most significant first.",
    sampler=_digit_sampler,
)
def digits(n):
    return tuple(int(c) for c in str(n))


@atomic(
    "numbers",
    IntList(min_len=1, max_len=12, lo=0, hi=9),
    Int(0, 10**12 - 1),
    "Read the input list as the decimal digits of a number, most significant first, and give "
    "that number (leading zeros are dropped, so [0, 4, 2] is 42).",
    sampler=lambda rng, level: tuple(int(c) for c in str(_n_digit_number(rng, level))),
)
def from_digits(ds):
    value = 0
    for d in ds:
        value = 10 * value + d
    return value


@atomic(
    "numbers",
    Int(-(10**12), 10**12),
    Int(-(10**12), 10**12),
    "Reverse the order of the decimal digits of the input, dropping any leading zeros this "
    "creates (so 1200 becomes 21), and keep the input's sign.",
    sampler=_signed_digit_sampler,
)
def reverse_digits(n):
    r = int(str(abs(n))[::-1])
    return -r if n < 0 else r


@atomic(
    "numbers",
    Int(-(10**12), 10**12),
    Int(1, 13),
    "Count the decimal digits of the input, ignoring its sign (0 has one digit).",
    sampler=_signed_digit_sampler,
)
def digit_count(n):
    return len(str(abs(n)))


@atomic(
    "numbers",
    Int(0, 10**12),
    Int(0, 9),
    "Compute the digital root of the input: add up its decimal digits, and repeat on the result "
    "until a single digit remains.",
    sampler=_digit_sampler,
)
def digital_root(n):
    while n >= 10:
        n = sum(int(c) for c in str(n))
    return n


@atomic(
    "numbers",
    Int(0, 10**12),
    Int(0, 9**12),
    "Multiply together the decimal digits of the input (a single-digit input is its own product).",
    sampler=_digit_sampler,
)
def digit_product(n):
    product = 1
    for c in str(n):
        product *= int(c)
    return product


@atomic(
    "numbers",
    Int(0, 10**12),
    Int(0, 10**12),
    "Rearrange the decimal digits of the input into decreasing order and give the number they "
    "form.",
    sampler=_digit_sampler,
)
def largest_digit_arrangement(n):
    return int("".join(sorted(str(n), reverse=True)))


@atomic(
    "numbers",
    Int(-(10**12), 10**12),
    IntList(min_len=10, max_len=10, lo=0, hi=13),
    "For each digit 0, 1, ..., 9 in that order, count how many times it occurs in the decimal "
    "form of the input (ignoring the sign), and list the ten counts.",
    sampler=_signed_digit_sampler,
)
def digit_histogram(n):
    s = str(abs(n))
    return tuple(s.count(str(d)) for d in range(10))


@atomic(
    "numbers",
    Int(0, 10**12),
    Int(-54, 54),
    "Compute the alternating sum of the decimal digits of the input, starting from the last "
    "(units) digit: units digit minus tens digit plus hundreds digit, and so on.",
    sampler=_digit_sampler,
)
def alternating_digit_sum(n):
    total = 0
    for i, c in enumerate(reversed(str(n))):
        total += int(c) if i % 2 == 0 else -int(c)
    return total


@atomic(
    "numbers",
    Int(0, 10**12),
    Bool(),
    "Decide whether the decimal form of the input reads the same forwards and backwards.",
    sampler=_palindrome_sampler,
)
def is_palindrome(n):
    return str(n) == str(n)[::-1]


@atomic(
    "numbers",
    Int(0, 10**6),
    Int(1, 1000001),
    "Find the smallest number greater than the input whose decimal form reads the same "
    "forwards and backwards.",
    sampler=_below_million_sampler,
)
def next_palindrome(n):
    m = n + 1
    while str(m) != str(m)[::-1]:
        m += 1
    return m


@atomic(
    "numbers",
    Int(0, 10**12),
    IntList(min_len=1, max_len=26, lo=0, hi=2),
    "Write the input in base 3 and list its base-3 digits, most significant first (0 is [0]).",
    sampler=_digit_sampler,
)
def base3_digits(n):
    out = []
    while True:
        out.append(n % 3)
        n //= 3
        if n == 0:
            return tuple(reversed(out))


@atomic(
    "numbers",
    Int(0, 10**12),
    Str(alphabet="0123456", min_len=1, max_len=16),
    "Write the input in base 7, most significant digit first, with no leading zeros.",
    sampler=_digit_sampler,
)
def to_base7(n):
    s = ""
    while True:
        s = str(n % 7) + s
        n //= 7
        if n == 0:
            return s


# --- arithmetic on integers -----------------------------------------------------------------


@atomic(
    "numbers",
    Int(),
    Int(0, 10**12),
    "Give the absolute value of the input.",
    sampler=lambda rng, level: (
        -_n_digit_number(rng, level) if rng.random() < 0.8 else rng.randint(0, 99)
    ),
)
def absolute_value(n):
    return abs(n)


@atomic(
    "numbers",
    Int(),
    Int(-100, 100),
    "Clamp the input to the range from -100 to 100: a value below -100 becomes -100, a value "
    "above 100 becomes 100, and any other value stays as it is.",
    sampler=lambda rng, level: rng.randint(-(60 * 3**level), 60 * 3**level),
)
def clamp_to_hundred(n):
    return max(-100, min(100, n))


@atomic(
    "numbers",
    Int(),
    Int(),
    "Round the input to the nearest multiple of 10; a value exactly halfway between two "
    "multiples (ending in 5) is rounded away from zero.",
    sampler=_signed_digit_sampler,
)
def round_to_tens(n):
    r = (abs(n) + 5) // 10 * 10
    return -r if n < 0 else r


@atomic(
    "numbers",
    Int(),
    Int(),
    "Round the input down to a multiple of 100: give the largest multiple of 100 that is less "
    "than or equal to it (so -150 becomes -200).",
    sampler=_signed_digit_sampler,
)
def floor_to_hundreds(n):
    return n // 100 * 100


@atomic(
    "numbers",
    Int(1, 10**6),
    Int(0, 600),
    "Count the steps the Collatz process takes to bring the input down to 1, where one step "
    "halves an even number and turns an odd number x into 3x + 1 (the input 1 takes 0 steps).",
    sampler=lambda rng, level: rng.randint(1, (30, 1000, 10**6)[min(level, 3) - 1]),
)
def collatz_steps(n):
    steps = 0
    while n != 1:
        n = n // 2 if n % 2 == 0 else 3 * n + 1
        steps += 1
    return steps


@atomic(
    "numbers",
    Int(0, 14),
    Int(1, 87178291200),
    "Compute the factorial of the input, the product 1 x 2 x ... x n (the factorial of 0 is 1).",
)
def factorial(n):
    import math

    return math.factorial(n)


@atomic(
    "numbers",
    Int(0, 10**12),
    Int(0, 10**6),
    "Give the integer square root of the input: the largest integer whose square does not "
    "exceed it.",
    sampler=_digit_sampler,
)
def integer_sqrt(n):
    import math

    return math.isqrt(n)


@atomic(
    "numbers",
    Int(0, 10**6),
    Int(0, 500000500000),
    "Compute the sum 1 + 2 + ... + n of all integers from 1 up to the input n (0 for the input 0).",
    sampler=lambda rng, level: rng.randint(0, (20, 1000, 10**6)[min(level, 3) - 1]),
)
def triangular_number(n):
    return n * (n + 1) // 2


@atomic(
    "numbers",
    Int(0, 10**4),
    Int(0, 333383335000),
    "Compute the sum of the squares 1^2 + 2^2 + ... + n^2 of all integers from 1 up to the "
    "input n (0 for the input 0).",
    sampler=lambda rng, level: rng.randint(0, (12, 300, 10**4)[min(level, 3) - 1]),
)
def sum_of_squares(n):
    return n * (n + 1) * (2 * n + 1) // 6


# --- names of numbers -----------------------------------------------------------------------


@atomic(
    "numbers",
    Int(0, 10**9 - 1),
    Str(alphabet=_WORD_ALPHABET, min_len=3, max_len=200),
    "Write the input in English words, all lowercase, single spaces between words, with no "
    '"and" and no commas, hyphenating the numbers 21 to 99 that are not multiples of ten '
    '(so 1234 is "one thousand two hundred thirty-four" and 0 is "zero").',
    sampler=lambda rng, level: _n_digit_number(rng, level, 9),
)
def to_english_words(n):
    ones = (
        "zero one two three four five six seven eight nine ten eleven twelve thirteen "
        "fourteen fifteen sixteen seventeen eighteen nineteen"
    ).split()
    tens = "_ _ twenty thirty forty fifty sixty seventy eighty ninety".split()

    def below_thousand(k):
        words = []
        if k >= 100:
            words += [ones[k // 100], "hundred"]
            k %= 100
        if k >= 20:
            words.append(tens[k // 10] + ("-" + ones[k % 10] if k % 10 else ""))
        elif k > 0:
            words.append(ones[k])
        return words

    if n == 0:
        return "zero"
    words = []
    for scale, name in ((10**6, "million"), (10**3, "thousand"), (1, "")):
        chunk = n // scale % 1000
        if chunk:
            words += below_thousand(chunk) + ([name] if name else [])
    return " ".join(words)


@atomic(
    "numbers",
    Int(1, 3999),
    Str(alphabet=_ROMAN, min_len=1, max_len=15),
    "Write the input as a Roman numeral in standard form, using I, V, X, L, C, D, M and the "
    "subtractive pairs IV, IX, XL, XC, CD, CM (so 1994 is MCMXCIV).",
    sampler=lambda rng, level: rng.randint(1, (40, 400, 3999)[min(level, 3) - 1]),
)
def to_roman(n):
    out = []
    for value, symbol in (
        (1000, "M"), (900, "CM"), (500, "D"), (400, "CD"), (100, "C"), (90, "XC"),
        (50, "L"), (40, "XL"), (10, "X"), (9, "IX"), (5, "V"), (4, "IV"), (1, "I"),
    ):  # fmt: skip
        while n >= value:
            out.append(symbol)
            n -= value
    return "".join(out)


@atomic(
    "numbers",
    Str(alphabet=_ROMAN, min_len=1, max_len=20),
    Int(-20000, 20000),
    "Read the input as a Roman numeral (I=1, V=5, X=10, L=50, C=100, D=500, M=1000): add up "
    "the values of its symbols, except that a symbol immediately followed by a symbol of larger "
    "value is subtracted instead of added.",
    sampler=_roman_sampler,
)
def from_roman(s):
    values = {"I": 1, "V": 5, "X": 10, "L": 50, "C": 100, "D": 500, "M": 1000}
    total = 0
    for i, c in enumerate(s):
        v = values[c]
        total += -v if i + 1 < len(s) and values[s[i + 1]] > v else v
    return total


# --- rationals ------------------------------------------------------------------------------


@atomic(
    "numbers",
    Int(-(10**9), 10**9),
    Rational(),
    "Divide the input by 12 and give the exact result as a fraction in lowest terms.",
)
def divide_by_twelve(n):
    from fractions import Fraction

    return Fraction(n, 12)


@atomic(
    "numbers",
    Int(-(10**9), 10**9),
    Rational(),
    "Give the reciprocal 1/n of the input n as a fraction in lowest terms (the input 0 gives 0).",
)
def unit_fraction(n):
    from fractions import Fraction

    return Fraction(1, n) if n else Fraction(0)


@atomic(
    "numbers",
    Int(1, 20),
    Rational(),
    "Compute the harmonic number 1 + 1/2 + 1/3 + ... + 1/n for the input n, as a fraction in "
    "lowest terms.",
    sampler=lambda rng, level: rng.randint(1, (4, 9, 20)[min(level, 3) - 1]),
)
def harmonic_number(n):
    from fractions import Fraction

    return sum((Fraction(1, k) for k in range(1, n + 1)), Fraction(0))


@atomic(
    "numbers",
    IntList(min_len=2, max_len=2, lo=1, hi=10**6),
    Rational(),
    "Read the input [a, b] as the fraction a/b and write it in lowest terms.",
    sampler=_fraction_pair_sampler,
)
def fraction_from_pair(pair):
    from fractions import Fraction

    return Fraction(pair[0], pair[1])


@atomic(
    "numbers",
    IntList(min_len=1, max_len=20, lo=-(10**6), hi=10**6),
    Rational(max_abs=2 * 10**7),
    "Compute the arithmetic mean of the numbers in the input list, as a fraction in lowest terms.",
)
def mean_as_fraction(xs):
    from fractions import Fraction

    return Fraction(sum(xs), len(xs))


@atomic(
    "numbers",
    Rational(),
    Rational(),
    "Give the reciprocal of the input as a fraction in lowest terms (the input 0 gives 0).",
)
def reciprocal(x):
    from fractions import Fraction

    return 1 / x if x else Fraction(0)


@atomic(
    "numbers",
    Rational(),
    Rational(max_abs=3 * 10**9),
    "Add 1/2 to the input and give the result as a fraction in lowest terms.",
)
def add_half(x):
    from fractions import Fraction

    return x + Fraction(1, 2)


@atomic(
    "numbers",
    Rational(),
    Rational(max_abs=2 * 10**9 + 1),
    "Subtract the input from 1 and give the result as a fraction in lowest terms.",
)
def one_minus(x):
    return 1 - x


@atomic(
    "numbers",
    Rational(),
    Rational(max_abs=3 * 10**9),
    "Multiply the input by 2/3 and give the result as a fraction in lowest terms.",
)
def two_thirds_of(x):
    from fractions import Fraction

    return x * Fraction(2, 3)


@atomic(
    "numbers",
    Rational(max_abs=30000),
    Rational(max_abs=9 * 10**8),
    "Square the input and give the result as a fraction in lowest terms.",
)
def square_fraction(x):
    return x * x


@atomic(
    "numbers",
    Rational(),
    Int(-(10**9), 10**9),
    "Give the floor of the input: the largest integer less than or equal to it.",
)
def floor_of(x):
    import math

    return math.floor(x)


@atomic(
    "numbers",
    Rational(),
    Int(-(10**9), 10**9),
    "Give the ceiling of the input: the smallest integer greater than or equal to it.",
)
def ceiling_of(x):
    import math

    return math.ceil(x)


@atomic(
    "numbers",
    Rational(),
    Int(-(10**9), 10**9 + 1),
    "Round the input to the nearest integer; a value exactly halfway between two integers is "
    "rounded up (towards positive infinity), so -5/2 becomes -2.",
)
def round_half_up(x):
    import math
    from fractions import Fraction

    return math.floor(x + Fraction(1, 2))


@atomic(
    "numbers",
    Rational(),
    Rational(),
    "Give the fractional part of the input, the input minus its floor (a value from 0 up to but "
    "not including 1), as a fraction in lowest terms; for example -7/3 gives 2/3.",
)
def fractional_part(x):
    import math

    return x - math.floor(x)


@atomic(
    "numbers",
    Rational(),
    Int(-(10**9), 10**9),
    "Write the input as a fraction in lowest terms with a positive denominator and give its "
    "numerator (which carries the sign; an integer n is n/1).",
)
def numerator(x):
    return x.numerator


@atomic(
    "numbers",
    Rational(),
    Int(1, 10**9),
    "Write the input as a fraction in lowest terms with a positive denominator and give its "
    "denominator (an integer n is n/1, so its denominator is 1).",
)
def denominator(x):
    return x.denominator


@atomic(
    "numbers",
    Rational(),
    Bool(),
    "Decide whether the input is strictly greater than 1/2.",
)
def exceeds_half(x):
    from fractions import Fraction

    return x > Fraction(1, 2)


@atomic(
    "numbers",
    Rational(),
    IntList(min_len=1, max_len=64, lo=-(10**9), hi=10**9),
    "Expand the input as a simple continued fraction [a0; a1, ..., ak] and list its terms: a0 "
    "is the floor of the input, each later term is at least 1, and the last term is at least 2 "
    "unless the list has a single term (so 7/3 is [2, 3] and -1/2 is [-1, 2]).",
)
def continued_fraction(x):
    p, q = x.numerator, x.denominator
    terms = []
    while q:
        a = p // q
        terms.append(a)
        p, q = q, p - a * q
    return tuple(terms)


@atomic(
    "numbers",
    IntList(min_len=1, max_len=6, lo=1, hi=20),
    Rational(max_abs=10**8),
    "Evaluate the input list [a0, a1, ..., ak] as the continued fraction a0 + 1/(a1 + 1/(a2 + "
    "... + 1/ak)) and give the value as a fraction in lowest terms.",
    sampler=lambda rng, level: tuple(
        rng.randint(1, 4 + 4 * level) for _ in range(rng.randint(1, 2 + level))
    ),
)
def evaluate_continued_fraction(terms):
    from fractions import Fraction

    value = Fraction(terms[-1])
    for a in reversed(terms[:-1]):
        value = a + 1 / value
    return value
