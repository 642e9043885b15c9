"""RACES atomic environments: bits (binary representations and bitwise operations).

Covers bit counts and positions, fixed-width reversals, rotations and two's complement, masks
and shifts, Gray code, powers of two, and conversions between integers and binary, octal and
hexadecimal strings, bit lists, bit-position sets and byte lists, so that chains can move
between int, str, int_list and int_set. Decimal digits live in `numbers`.

Bitwise operations are only defined here on non-negative integers (the inputs say so), except
the two's-complement environments, which state their width. "Binary form" always means the
base-2 numeral without leading zeros ("0" for zero), and bit positions count from 0 at the
least significant bit.
"""

from __future__ import annotations

import random

from tirl.envs.core import atomic
from tirl.envs.types import Bool, Int, IntList, IntSet, Str

_MAX = 10**12  # < 2**40, so binary forms have at most 40 bits


def _random_bits(rng: random.Random, level: int, max_bits: int = 40) -> int:
    """A non-negative integer of 1-8, 9-20 or 21-40 bits by level (within max_bits)."""
    lo, hi = ((1, 8), (9, 20), (21, 40))[min(level, 3) - 1]
    bits = rng.randint(min(lo, max_bits), min(hi, max_bits))
    n = rng.getrandbits(bits)
    return min(n, _MAX)


def _bits_sampler(rng: random.Random, level: int) -> int:
    return _random_bits(rng, level)


def _positive_bits_sampler(rng: random.Random, level: int) -> int:
    """Positive, and often with trailing zeros (so lowest-bit questions are not trivial)."""
    n = max(1, _random_bits(rng, level))
    return min(n << rng.randint(0, 6), _MAX) or 1


def _byte_sampler(rng: random.Random, level: int) -> int:
    return rng.randint(0, 15 if level == 1 else 255)


def _word_sampler(rng: random.Random, level: int) -> int:
    return rng.getrandbits((6, 12, 16)[min(level, 3) - 1])


def _power_of_two_sampler(rng: random.Random, level: int) -> int:
    exp = rng.randint(0, (8, 20, 39)[min(level, 3) - 1])
    return (1 << exp) if rng.random() < 0.5 else (1 << exp) + rng.randint(-1, 1 << max(0, exp - 1))


def _bit_palindrome_sampler(rng: random.Random, level: int) -> int:
    n = _random_bits(rng, level, 19) or 1
    if rng.random() < 0.5:
        s = format(n, "b")
        return int(s + s[::-1][rng.randint(0, 1) :], 2)
    return n


def _binary_string_sampler(rng: random.Random, level: int) -> str:
    length = rng.randint(*((1, 8), (6, 20), (15, 40))[min(level, 3) - 1])
    return "".join(rng.choice("01") for _ in range(length))


# --- counting and locating bits -------------------------------------------------------------


@atomic(
    "bits",
    Int(0, _MAX),
    Int(0, 40),
    "Count the 1 bits in the binary form of the input.",
    sampler=_bits_sampler,
)
def popcount(n):
    return bin(n).count("1")


@atomic(
    "bits",
    Int(0, _MAX),
    Int(0, 39),
    "Count the 0 bits in the binary form of the input, written without leading zeros (0 is "
    'written "0", which has one 0 bit).',
    sampler=_bits_sampler,
)
def zero_bit_count(n):
    return format(n, "b").count("0")


@atomic(
    "bits",
    Int(0, _MAX),
    Bool(),
    "Decide whether the binary form of the input has an odd number of 1 bits.",
    sampler=_bits_sampler,
)
def has_odd_parity(n):
    return bin(n).count("1") % 2 == 1


@atomic(
    "bits",
    Int(0, _MAX),
    Int(0, 40),
    "Give the number of bits in the binary form of the input without leading zeros (0 for the "
    "input 0).",
    sampler=_bits_sampler,
)
def bit_length(n):
    return n.bit_length()


@atomic(
    "bits",
    Int(1, _MAX),
    Int(0, 39),
    "Count the trailing zero bits of the input: how many times it can be divided by 2 exactly.",
    sampler=_positive_bits_sampler,
)
def trailing_zero_bits(n):
    return (n & -n).bit_length() - 1


@atomic(
    "bits",
    Int(1, _MAX),
    Int(1, 2**39),
    "Give the value of the lowest set bit of the input: the largest power of two that divides it.",
    sampler=_positive_bits_sampler,
)
def lowest_set_bit(n):
    return n & -n


@atomic(
    "bits",
    Int(1, _MAX),
    Int(1, 2**39),
    "Give the value of the highest set bit of the input: the largest power of two that is less "
    "than or equal to it.",
    sampler=_positive_bits_sampler,
)
def highest_set_bit(n):
    return 1 << (n.bit_length() - 1)


@atomic(
    "bits",
    Int(0, _MAX),
    Int(0, 40),
    "Give the length of the longest run of consecutive 1 bits in the binary form of the input "
    "(0 for the input 0).",
    sampler=_bits_sampler,
)
def longest_run_of_ones(n):
    return max(len(run) for run in format(n, "b").split("0"))


@atomic(
    "bits",
    Int(0, _MAX),
    Int(0, 40),
    "Count the bit positions where the input differs from 170 (binary 10101010), comparing "
    "the two numbers bit by bit with leading zeros as needed.",
    sampler=_bits_sampler,
)
def hamming_distance_to_170(n):
    return bin(n ^ 170).count("1")


@atomic(
    "bits",
    Int(),
    Bool(),
    "Decide whether the input is a power of two (1, 2, 4, 8, ...); 0 and negative numbers are not.",
    sampler=_power_of_two_sampler,
)
def is_power_of_two(n):
    return n > 0 and n & (n - 1) == 0


@atomic(
    "bits",
    Int(0, _MAX),
    Bool(),
    "Decide whether the binary form of the input, without leading zeros, reads the same "
    "forwards and backwards.",
    sampler=_bit_palindrome_sampler,
)
def is_binary_palindrome(n):
    s = format(n, "b")
    return s == s[::-1]


# --- bit positions and lists ----------------------------------------------------------------


@atomic(
    "bits",
    Int(0, _MAX),
    IntList(min_len=0, max_len=40, lo=0, hi=39),
    "List the positions of the 1 bits of the input in increasing order, where position 0 is "
    "the least significant bit (so 10 = binary 1010 gives [1, 3]).",
    sampler=_bits_sampler,
)
def set_bit_positions(n):
    return tuple(i for i in range(n.bit_length()) if n >> i & 1)


@atomic(
    "bits",
    Int(0, _MAX),
    IntSet(min_size=0, max_size=40, lo=0, hi=39),
    "Give the set of positions of the 0 bits in the binary form of the input without leading "
    "zeros, where position 0 is the least significant bit (so 10 = binary 1010 gives positions "
    "0 and 2, and 0 gives position 0).",
    sampler=_bits_sampler,
)
def zero_bit_positions(n):
    s = format(n, "b")
    return frozenset(i for i, c in enumerate(reversed(s)) if c == "0")


@atomic(
    "bits",
    IntSet(min_size=0, max_size=40, lo=0, hi=39),
    Int(0, 2**40 - 1),
    "Treat the input as a set of bit positions (position 0 is the least significant bit) and "
    "give the number whose 1 bits are exactly at those positions: the sum of 2^p over the set.",
    sampler=lambda rng, level: frozenset(
        rng.randint(0, (7, 19, 39)[min(level, 3) - 1]) for _ in range(rng.randint(0, 3 + 3 * level))
    ),
)
def from_bit_positions(positions):
    return sum(1 << p for p in positions)


@atomic(
    "bits",
    Int(0, _MAX),
    IntList(min_len=1, max_len=40, lo=0, hi=1),
    "List the bits of the binary form of the input without leading zeros, most significant "
    "first (0 is [0]).",
    sampler=_bits_sampler,
)
def binary_digits(n):
    return tuple(int(c) for c in format(n, "b"))


@atomic(
    "bits",
    IntList(min_len=1, max_len=40, lo=0, hi=1),
    Int(0, 2**40 - 1),
    "Read the input list of bits as a binary number, most significant bit first, and give its "
    "value.",
    sampler=lambda rng, level: tuple(int(c) for c in _binary_string_sampler(rng, level)),
)
def from_binary_digits(bits):
    value = 0
    for b in bits:
        value = 2 * value + b
    return value


@atomic(
    "bits",
    Int(0, _MAX),
    IntList(min_len=1, max_len=5, lo=0, hi=255),
    "Split the input into bytes (8-bit groups) and list their values, most significant byte "
    "first, using as few bytes as possible (one byte for 0).",
    sampler=_bits_sampler,
)
def to_bytes(n):
    out = []
    while True:
        out.append(n & 255)
        n >>= 8
        if n == 0:
            return tuple(reversed(out))


@atomic(
    "bits",
    IntList(min_len=1, max_len=5, lo=0, hi=255),
    Int(0, 2**40 - 1),
    "Read the input list as bytes of a number, most significant byte first (each worth 256 "
    "times the next), and give the number.",
    sampler=lambda rng, level: tuple(
        rng.randint(0, 255) for _ in range(rng.randint(1, (2, 3, 5)[min(level, 3) - 1]))
    ),
)
def from_bytes(byte_values):
    value = 0
    for b in byte_values:
        value = 256 * value + b
    return value


# --- masks, shifts and fixed-width transforms -----------------------------------------------


@atomic(
    "bits",
    Int(0, _MAX),
    Int(0, 2**40 - 1),
    "Compute the bitwise XOR of the input with 255 (binary 11111111), which flips its lowest "
    "8 bits.",
    sampler=_bits_sampler,
)
def xor_255(n):
    return n ^ 255


@atomic(
    "bits",
    Int(0, _MAX),
    Int(0, 240),
    "Compute the bitwise AND of the input with 240 (binary 11110000), which keeps only bits 4 "
    "to 7 (counting the least significant bit as bit 0).",
    sampler=_bits_sampler,
)
def and_240(n):
    return n & 240


@atomic(
    "bits",
    Int(0, _MAX),
    Int(0, 2**40 - 1),
    "Compute the bitwise OR of the input with 5 (binary 101), which sets bits 0 and 2.",
    sampler=_bits_sampler,
)
def or_5(n):
    return n | 5


@atomic(
    "bits",
    Int(0, 10**11),
    Int(0, 8 * 10**11),
    "Shift the input left by 3 bits (multiply it by 8).",
    sampler=lambda rng, level: _random_bits(rng, level, 36),
)
def shift_left_3(n):
    return n << 3


@atomic(
    "bits",
    Int(0, _MAX),
    Int(0, _MAX // 4),
    "Shift the input right by 2 bits, dropping the two lowest bits (integer division by 4).",
    sampler=_bits_sampler,
)
def shift_right_2(n):
    return n >> 2


@atomic(
    "bits",
    Int(0, _MAX),
    Int(0, _MAX),
    "Clear the lowest 1 bit of the input (the input 0 stays 0).",
    sampler=_positive_bits_sampler,
)
def clear_lowest_set_bit(n):
    return n & (n - 1)


@atomic(
    "bits",
    Int(1, _MAX),
    Int(0, 2**39 - 1),
    "Flip every bit of the binary form of the input written without leading zeros, and give "
    "the value of the result (so 10 = binary 1010 becomes binary 0101 = 5).",
    sampler=_positive_bits_sampler,
)
def complement_bits(n):
    return n ^ ((1 << n.bit_length()) - 1)


@atomic(
    "bits",
    Int(0, _MAX),
    Int(1, 2**40),
    "Give the smallest power of two (1, 2, 4, 8, ...) that is greater than or equal to the "
    "input (1 for the input 0).",
    sampler=lambda rng, level: (
        _power_of_two_sampler(rng, level) if rng.random() < 0.3 else _bits_sampler(rng, level)
    ),
)
def next_power_of_two(n):
    return 1 if n <= 1 else 1 << (n - 1).bit_length()


@atomic(
    "bits",
    Int(0, 255),
    Int(0, 255),
    "Write the input as an 8-bit binary number (with leading zeros), reverse the order of its "
    "8 bits, and give the resulting number.",
    sampler=_byte_sampler,
)
def reverse_bits_8(n):
    return int(format(n, "08b")[::-1], 2)


@atomic(
    "bits",
    Int(0, 65535),
    Int(0, 65535),
    "Write the input as a 16-bit binary number (with leading zeros), reverse the order of its "
    "16 bits, and give the resulting number.",
    sampler=_word_sampler,
)
def reverse_bits_16(n):
    return int(format(n, "016b")[::-1], 2)


@atomic(
    "bits",
    Int(0, 255),
    Int(0, 255),
    "Write the input as an 8-bit binary number and rotate it left by 3 bits: the 3 highest "
    "bits move, in order, to the lowest positions. Give the resulting number.",
    sampler=_byte_sampler,
)
def rotate_left_8_by_3(n):
    return ((n << 3) | (n >> 5)) & 255


@atomic(
    "bits",
    Int(0, 65535),
    Int(0, 65535),
    "Write the input as a 16-bit binary number and rotate it right by 4 bits: the 4 lowest "
    "bits move, in order, to the highest positions. Give the resulting number.",
    sampler=_word_sampler,
)
def rotate_right_16_by_4(n):
    return ((n >> 4) | (n << 12)) & 65535


@atomic(
    "bits",
    Int(0, 255),
    Int(0, 255),
    "Write the input as an 8-bit number and swap its two 4-bit halves (the high nibble becomes "
    "the low one and vice versa). Give the resulting number.",
    sampler=_byte_sampler,
)
def swap_nibbles(n):
    return ((n & 15) << 4) | (n >> 4)


@atomic(
    "bits",
    Int(0, 255),
    Int(-128, 127),
    "Read the input as an 8-bit two's-complement number: values 0 to 127 stay as they are, "
    "values 128 to 255 stand for the input minus 256.",
    sampler=lambda rng, level: rng.randint(0, 255) if rng.random() < 0.3 else rng.randint(128, 255),
)
def from_signed_8bit(n):
    return n - 256 if n >= 128 else n


@atomic(
    "bits",
    Int(-128, 127),
    Int(0, 255),
    "Encode the input as an 8-bit two's-complement number and give that byte as an unsigned "
    "value from 0 to 255 (negative inputs become the input plus 256).",
    sampler=lambda rng, level: (
        rng.randint(-(2 ** (1 + 2 * level)), -1) if rng.random() < 0.7 else rng.randint(0, 127)
    ),
)
def to_signed_8bit(n):
    return n & 255


@atomic(
    "bits",
    Int(0, _MAX),
    Int(0, 2**40 - 1),
    "Convert the input to its Gray code: the bitwise XOR of the input with the input shifted "
    "right by one bit.",
    sampler=_bits_sampler,
)
def gray_code(n):
    return n ^ (n >> 1)


@atomic(
    "bits",
    Int(0, _MAX),
    Int(0, 2**40 - 1),
    "Decode the input from Gray code: find the number g whose Gray code (g XOR (g shifted "
    "right by one bit)) equals the input.",
    sampler=_bits_sampler,
)
def from_gray_code(n):
    g = n
    shift = n >> 1
    while shift:
        g ^= shift
        shift >>= 1
    return g


# --- lists of integers ----------------------------------------------------------------------


@atomic(
    "bits",
    IntList(min_len=0, max_len=64, lo=0, hi=10**9),
    Int(0, 2**30 - 1),
    "Compute the bitwise XOR of all the numbers in the input list (0 for an empty list).",
)
def xor_of_list(xs):
    acc = 0
    for x in xs:
        acc ^= x
    return acc


@atomic(
    "bits",
    IntList(min_len=1, max_len=64, lo=0, hi=10**9),
    Int(0, 10**9),
    "Compute the bitwise AND of all the numbers in the input list.",
    sampler=lambda rng, level: tuple(
        rng.getrandbits(4 * level) | rng.choice((0, 5, 12, 96))
        for _ in range(rng.randint(2, 2 + level))
    ),
)
def and_of_list(xs):
    acc = xs[0]
    for x in xs[1:]:
        acc &= x
    return acc


@atomic(
    "bits",
    IntList(min_len=0, max_len=64, lo=0, hi=10**9),
    Int(0, 2**30 - 1),
    "Compute the bitwise OR of all the numbers in the input list (0 for an empty list).",
)
def or_of_list(xs):
    acc = 0
    for x in xs:
        acc |= x
    return acc


# --- numerals in base 2, 8 and 16 -----------------------------------------------------------


@atomic(
    "bits",
    Int(0, _MAX),
    Str(alphabet="01", min_len=1, max_len=40),
    'Write the input in binary, without leading zeros (0 is "0").',
    sampler=_bits_sampler,
)
def to_binary(n):
    return format(n, "b")


@atomic(
    "bits",
    Str(alphabet="01", min_len=1, max_len=40),
    Int(0, 2**40 - 1),
    "Read the input as a binary numeral (leading zeros allowed) and give its value.",
    sampler=_binary_string_sampler,
)
def from_binary(s):
    return int(s, 2)


@atomic(
    "bits",
    Str(alphabet="01", min_len=1, max_len=40),
    Str(alphabet="01", min_len=1, max_len=41),
    "Read the input as a binary numeral (leading zeros allowed), add 1, and write the result "
    "in binary without leading zeros.",
    sampler=_binary_string_sampler,
)
def increment_binary(s):
    return format(int(s, 2) + 1, "b")


@atomic(
    "bits",
    Int(0, _MAX),
    Str(alphabet="01234567", min_len=1, max_len=14),
    'Write the input in octal (base 8), without leading zeros (0 is "0").',
    sampler=_bits_sampler,
)
def to_octal(n):
    return format(n, "o")


@atomic(
    "bits",
    Int(0, _MAX),
    Str(alphabet="0123456789abcdef", min_len=1, max_len=10),
    "Write the input in hexadecimal (base 16) with lowercase digits a-f, without a prefix or "
    'leading zeros (0 is "0").',
    sampler=_bits_sampler,
)
def to_hex(n):
    return format(n, "x")


@atomic(
    "bits",
    Str(alphabet="0123456789abcdef", min_len=1, max_len=10),
    Int(0, 16**10 - 1),
    "Read the input as a hexadecimal (base 16) numeral with digits 0-9 and a-f (leading zeros "
    "allowed) and give its value.",
    sampler=lambda rng, level: format(_random_bits(rng, level), "x"),
)
def from_hex(s):
    return int(s, 16)
