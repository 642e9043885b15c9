"""RACES atomic environments over strings: `str`, `str_list`, and the bridges to `int`, `bool`
and `int_list` (and back from `int` and `int_list`).

Strings are lowercase a-z (the `Str` default) unless a type says otherwise: only the run-length
code (digits) and the hyphen-joined words ("-") leave that alphabet, so nearly every string output
feeds straight into the next string environment. Word lists use `Words`, a `str_list` whose items
are lowercase and of bounded length: a mapper must stay valid and small on every input it
accepts, including the outputs of other domains' environments.

Not covered: case, whitespace, punctuation and Unicode (no default alphabet has them).
"""

from __future__ import annotations

import functools
import string

from tirl.envs.core import atomic
from tirl.envs.types import Bool, Int, IntList, Str, StrList

LOWER = string.ascii_lowercase


# A word list: at most 16 lowercase words of at most 20 letters (the item bounds keep every
# output a word mapper builds small).
Words = functools.partial(StrList, max_len=16, alphabet=LOWER, max_item=20)


S = Str(min_len=1, max_len=40)  # the usual input: a non-empty lowercase word
W = Words(min_len=1)  # the usual word-list input: 1..16 lowercase words of 0..20 letters


# Samplers for the boolean tests, whose answer a random string almost always settles one way.


def _palindromes_and_near_misses(rng, level):
    s = S.sample(rng, level)
    kind = rng.randrange(3)
    if kind == 0:
        return s
    half = s[: (len(s) + 1) // 2]
    s = half + half[-2::-1] if rng.random() < 0.5 else half + half[::-1]
    if kind == 2:  # one letter changed: usually no longer a palindrome
        i = rng.randrange(len(s))
        s = s[:i] + rng.choice(LOWER.replace(s[i], "")) + s[i + 1 :]
    return s


def _sorted_half_the_time(rng, level):
    s = S.sample(rng, level)
    return "".join(sorted(s)) if rng.random() < 0.5 else s


def _with_many_as(rng, level):
    n = rng.randint(3, 4 + 4 * level)
    return "".join("a" if rng.random() < 0.25 else rng.choice(LOWER) for _ in range(n))


def _word_lists_sorted_half_the_time(rng, level):
    words = W.sample(rng, level)
    return tuple(sorted(words)) if rng.random() < 0.5 else words


def _with_runs(rng, level):
    """Strings built from runs of 1-3 equal letters (a random string seldom repeats a letter)."""
    out = ""
    for _ in range(rng.randint(2, 2 + 2 * level)):
        out += rng.choice(LOWER) * rng.choice((1, 1, 2, 3))
    return out


def _with_repeats(rng, level):
    """Strings over a few letters, so that letters repeat."""
    pool = rng.sample(LOWER, rng.randint(2, 3 + 2 * level))
    return "".join(rng.choice(pool) for _ in range(rng.randint(3, 4 + 4 * level)))


def _wordlike(rng, level):
    """Strings in which about two letters in five are vowels, as in English words."""
    n = rng.randint(3, 4 + 4 * level)
    return "".join(rng.choice("aeiou" if rng.random() < 0.4 else LOWER) for _ in range(n))


def _distinct_half_the_time(rng, level):
    s = _with_repeats(rng, level)
    return "".join(rng.sample(LOWER, len(s))) if rng.random() < 0.5 else s


def _runs_half_the_time(rng, level):
    return _with_runs(rng, level) if rng.random() < 0.5 else S.sample(rng, level)


def _word_lists_with_repeats(rng, level):
    pool = W.sample(rng, level)
    return tuple(rng.choice(pool) for _ in range(rng.randint(2, 2 + 3 * level)))


# str -> str


@atomic("strings", S, Str(min_len=1, max_len=40), "Reverse the input string.")
def reverse(s):
    return s[::-1]


@atomic(
    "strings",
    S,
    Str(min_len=1, max_len=40),
    "Replace each letter of the input with the next letter of the alphabet, with z becoming a.",
)
def caesar_shift_1(s):
    return "".join(chr((ord(c) - 97 + 1) % 26 + 97) for c in s)


@atomic(
    "strings",
    S,
    Str(min_len=1, max_len=40),
    "Shift each letter of the input 3 places forward in the alphabet, wrapping around at the end"
    " (x becomes a, y becomes b, z becomes c).",
)
def caesar_shift_3(s):
    return "".join(chr((ord(c) - 97 + 3) % 26 + 97) for c in s)


@atomic(
    "strings",
    S,
    Str(min_len=1, max_len=40),
    "Apply ROT13 to the input: shift each letter 13 places forward in the alphabet, wrapping"
    " around at the end (a becomes n, n becomes a, z becomes m).",
)
def rot13(s):
    return "".join(chr((ord(c) - 97 + 13) % 26 + 97) for c in s)


@atomic(
    "strings",
    S,
    Str(min_len=1, max_len=40),
    "Apply the Atbash cipher to the input: replace each letter with its mirror in the alphabet"
    " (a with z, b with y, c with x, and so on, z with a).",
)
def atbash(s):
    return "".join(chr(219 - ord(c)) for c in s)


@atomic(
    "strings",
    S,
    Str(min_len=0, max_len=40),
    "Remove every vowel (a, e, i, o, u) from the input, keeping the other letters in order;"
    " y is not a vowel, and the result may be empty.",
    sampler=_wordlike,
)
def remove_vowels(s):
    return "".join(c for c in s if c not in "aeiou")


@atomic(
    "strings",
    S,
    Str(min_len=1, max_len=40),
    "Sort the letters of the input in alphabetical order, keeping repeated letters.",
)
def sort_letters(s):
    return "".join(sorted(s))


@atomic(
    "strings",
    S,
    Str(min_len=1, max_len=40),
    "Sort the letters of the input in reverse alphabetical order (z first), keeping repeated"
    " letters.",
)
def sort_letters_descending(s):
    return "".join(sorted(s, reverse=True))


@atomic(
    "strings",
    S,
    Str(min_len=1, max_len=26),
    "Remove repeated letters from the input: keep only the first occurrence of each letter,"
    " in the order of those first occurrences.",
    sampler=_with_repeats,
)
def dedupe_letters(s):
    seen = []
    for c in s:
        if c not in seen:
            seen.append(c)
    return "".join(seen)


@atomic(
    "strings",
    S,
    Str(min_len=1, max_len=40),
    "Replace every run of consecutive equal letters in the input with a single copy of that"
    ' letter (so "aabccca" becomes "abca").',
    sampler=_with_runs,
)
def collapse_runs(s):
    return "".join(c for i, c in enumerate(s) if i == 0 or s[i - 1] != c)


@atomic(
    "strings",
    Str(min_len=3, max_len=40),
    Str(min_len=3, max_len=40),
    'Move the first two letters of the input to its end, keeping their order (so "abcde"'
    ' becomes "cdeab").',
)
def rotate_left_2(s):
    return s[2:] + s[:2]


@atomic(
    "strings",
    Str(min_len=2, max_len=40),
    Str(min_len=2, max_len=40),
    'Move the last letter of the input to its front (so "abcd" becomes "dabc").',
)
def rotate_right_1(s):
    return s[-1] + s[:-1]


@atomic(
    "strings",
    Str(min_len=2, max_len=40),
    Str(min_len=2, max_len=40),
    "Split the input of length n into a first half of floor(n/2) letters and a second half of"
    ' the rest, and write the second half before the first (so "abcdef" becomes "defabc" and'
    ' "abcde" becomes "cdeab").',
)
def swap_halves(s):
    k = len(s) // 2
    return s[k:] + s[:k]


@atomic(
    "strings",
    Str(min_len=2, max_len=40),
    Str(min_len=1, max_len=20),
    'Keep the 1st, 3rd, 5th, ... letters of the input and drop the others (so "abcdefg"'
    ' becomes "aceg").',
)
def every_other_char(s):
    return s[::2]


@atomic(
    "strings",
    S,
    Str(alphabet=LOWER + "0123456789", min_len=2, max_len=80),
    "Run-length encode the input: replace each maximal run of one repeated letter with the run's"
    ' length in decimal followed by the letter, writing 1 for a single letter (so "aaabcc"'
    ' becomes "3a1b2c").',
    sampler=_with_runs,
)
def run_length_encode(s):
    out, i = [], 0
    while i < len(s):
        j = i
        while j < len(s) and s[j] == s[i]:
            j += 1
        out.append(f"{j - i}{s[i]}")
        i = j
    return "".join(out)


@atomic(
    "strings",
    Str(min_len=2, max_len=40),
    Str(min_len=2, max_len=40),
    "Swap the 1st and 2nd letters of the input, the 3rd and 4th, and so on; if the length is odd"
    ' the last letter stays where it is (so "abcde" becomes "badce").',
)
def swap_adjacent_pairs(s):
    chars = list(s)
    for i in range(0, len(chars) - 1, 2):
        chars[i], chars[i + 1] = chars[i + 1], chars[i]
    return "".join(chars)


@atomic(
    "strings",
    S,
    Str(min_len=2, max_len=80),
    'Write every letter of the input twice in a row (so "abc" becomes "aabbcc").',
)
def double_each_letter(s):
    return "".join(c + c for c in s)


@atomic(
    "strings",
    S,
    Str(min_len=2, max_len=80),
    'Append the reverse of the input to the input (so "abc" becomes "abccba").',
)
def mirror(s):
    return s + s[::-1]


@atomic(
    "strings",
    S,
    Str(min_len=1, max_len=40),
    "Replace each vowel of the input with the next vowel in the cycle a -> e -> i -> o -> u -> a,"
    " leaving every other letter (y included) unchanged.",
    sampler=_wordlike,
)
def next_vowel(s):
    nxt = {"a": "e", "e": "i", "i": "o", "o": "u", "u": "a"}
    return "".join(nxt.get(c, c) for c in s)


@atomic(
    "strings",
    S,
    Str(min_len=1, max_len=40),
    "Reverse the order of the vowels (a, e, i, o, u) in the input while every other letter keeps"
    ' its position (so "education" becomes "odicatuen").',
    sampler=_wordlike,
)
def reverse_vowels(s):
    vowels = [c for c in s if c in "aeiou"]
    return "".join(vowels.pop() if c in "aeiou" else c for c in s)


@atomic(
    "strings",
    S,
    Str(min_len=1, max_len=40),
    "Move the vowels (a, e, i, o, u) of the input to its end: first the other letters in their"
    ' original order, then the vowels in their original order (so "banana" becomes "bnnaaa").',
    sampler=_wordlike,
)
def consonants_then_vowels(s):
    return "".join(c for c in s if c not in "aeiou") + "".join(c for c in s if c in "aeiou")


@atomic(
    "strings",
    S,
    Str(min_len=0, max_len=26),
    "Delete every letter that occurs more than once in the input (all of its copies), keeping"
    ' the letters that occur exactly once in their order (so "banana" becomes "b"); the result'
    " may be empty.",
    sampler=_with_repeats,
)
def remove_repeated_letters(s):
    return "".join(c for c in s if s.count(c) == 1)


@atomic(
    "strings",
    S,
    Str(min_len=1, max_len=1),
    "Give the letter that occurs most often in the input; if several letters are tied, give the"
    " one that comes first in the alphabet.",
    sampler=_with_repeats,
)
def most_frequent_letter(s):
    return min(set(s), key=lambda c: (-s.count(c), c))


# str -> int and bool


@atomic(
    "strings",
    S,
    Int(0, 40),
    "Count the vowels (a, e, i, o, u; not y) in the input, counting repeats.",
    sampler=_wordlike,
)
def count_vowels(s):
    return sum(c in "aeiou" for c in s)


@atomic("strings", Str(max_len=200), Int(0, 200), "Give the number of letters in the input.")
def length(s):
    return len(s)


@atomic(
    "strings",
    S,
    Int(1, 1040),
    "Add up the alphabet positions of the letters of the input, counting repeats, with a = 1,"
    " b = 2, ..., z = 26.",
)
def letter_sum(s):
    return sum(ord(c) - 96 for c in s)


@atomic(
    "strings",
    S,
    Int(1, 26),
    "Count how many different letters occur in the input.",
    sampler=_with_repeats,
)
def distinct_letters(s):
    return len(set(s))


@atomic(
    "strings",
    S,
    Int(1, 40),
    "Give the length of the longest run of consecutive equal letters in the input (1 if no"
    " letter is immediately repeated).",
    sampler=_with_runs,
)
def longest_run(s):
    best = run = 1
    for a, b in zip(s, s[1:]):
        run = run + 1 if a == b else 1
        best = max(best, run)
    return best


@atomic(
    "strings",
    Str(min_len=1, max_len=6),
    Int(1, 321272406),
    "Read the input as a spreadsheet column label (bijective base 26): a = 1, ..., z = 26,"
    " aa = 27, ab = 28, ..., az = 52, ba = 53, ..., zz = 702, aaa = 703; give its number.",
)
def column_number(s):
    n = 0
    for c in s:
        n = 26 * n + ord(c) - 96
    return n


@atomic(
    "strings",
    S,
    Bool(),
    "Answer true if the input reads the same forwards and backwards, and false otherwise.",
    sampler=_palindromes_and_near_misses,
)
def is_palindrome(s):
    return s == s[::-1]


@atomic(
    "strings",
    S,
    Bool(),
    "Answer true if no letter occurs more than once in the input, and false otherwise.",
    sampler=_distinct_half_the_time,
)
def all_letters_distinct(s):
    return len(set(s)) == len(s)


@atomic(
    "strings",
    S,
    Bool(),
    "Answer true if the letters of the input are in alphabetical order (equal neighbours"
    " allowed), and false otherwise.",
    sampler=_sorted_half_the_time,
)
def letters_sorted(s):
    return list(s) == sorted(s)


@atomic(
    "strings",
    S,
    Bool(),
    "Answer true if some letter of the input is immediately followed by the same letter, and"
    " false otherwise.",
    sampler=_runs_half_the_time,
)
def has_double_letter(s):
    return any(a == b for a, b in zip(s, s[1:]))


# str -> int_list


@atomic(
    "strings",
    S,
    IntList(min_len=1, max_len=40, lo=1, hi=26),
    "Replace each letter of the input with its position in the alphabet (a = 1, b = 2, ...,"
    " z = 26) and give the list of positions in order.",
)
def letter_positions(s):
    return tuple(ord(c) - 96 for c in s)


@atomic(
    "strings",
    S,
    IntList(min_len=1, max_len=40, lo=1, hi=40),
    "Give the lengths of the maximal runs of consecutive equal letters in the input, from left"
    ' to right (so "aaabcc" gives [3, 1, 2]).',
    sampler=_with_runs,
)
def run_lengths(s):
    runs = [1]
    for a, b in zip(s, s[1:]):
        if a == b:
            runs[-1] += 1
        else:
            runs.append(1)
    return tuple(runs)


@atomic(
    "strings",
    S,
    IntList(min_len=0, max_len=40, lo=0, hi=39),
    "List the positions of the vowels (a, e, i, o, u) in the input, counting from 0 for the"
    " first letter, in increasing order; the list is empty if there are none.",
    sampler=_wordlike,
)
def vowel_indices(s):
    return tuple(i for i, c in enumerate(s) if c in "aeiou")


@atomic(
    "strings",
    S,
    IntList(min_len=1, max_len=26, lo=1, hi=40),
    "For each different letter of the input, taken in alphabetical order, give how many times it"
    ' occurs (so "banana" gives [3, 1, 2], the counts of a, b and n).',
    sampler=_with_repeats,
)
def letter_counts(s):
    return tuple(s.count(c) for c in sorted(set(s)))


# str -> str_list


@atomic(
    "strings",
    S,
    Words(min_len=1, max_len=14, min_item=1, max_item=3),
    "Cut the input into consecutive pieces of 3 letters from the left; the last piece is shorter"
    ' if the length is not a multiple of 3 (so "abcdefgh" gives ["abc", "def", "gh"]).',
)
def chunks_of_3(s):
    return tuple(s[i : i + 3] for i in range(0, len(s), 3))


@atomic(
    "strings",
    S,
    Words(min_len=0, max_len=20, min_item=1, max_item=40),
    "Split the input at its vowels (a, e, i, o, u): drop the vowels and list the pieces of other"
    ' letters between them in order, leaving out empty pieces (so "strawberry" gives'
    ' ["str", "wb", "rry"]).',
    sampler=_wordlike,
)
def split_on_vowels(s):
    pieces, cur = [], ""
    for c in s:
        if c in "aeiou":
            if cur:
                pieces.append(cur)
            cur = ""
        else:
            cur += c
    if cur:
        pieces.append(cur)
    return tuple(pieces)


@atomic(
    "strings",
    Str(min_len=1, max_len=30),
    Words(min_len=1, max_len=31, min_item=0, max_item=30),
    "Split the input at every letter a, dropping the a's and keeping empty pieces, so there is"
    ' always one more piece than there are a\'s (so "banana" gives ["b", "n", "n", ""]).',
    sampler=_with_many_as,
)
def split_on_a(s):
    return tuple(s.split("a"))


@atomic(
    "strings",
    S,
    Words(min_len=1, max_len=40, min_item=1, max_item=40),
    'Split the input into its maximal runs of consecutive equal letters, in order (so "aaabcc"'
    ' gives ["aaa", "b", "cc"]).',
    sampler=_with_runs,
)
def split_into_runs(s):
    runs = [s[0]]
    for c in s[1:]:
        if c == runs[-1][0]:
            runs[-1] += c
        else:
            runs.append(c)
    return tuple(runs)


@atomic(
    "strings",
    Str(min_len=1, max_len=8),
    Words(min_len=1, max_len=8, min_item=1, max_item=8),
    "List the rotations of the input of length n made by moving its first k letters to the end,"
    ' for k = 0, 1, ..., n - 1 in that order (so "abc" gives ["abc", "bca", "cab"]).',
)
def rotations(s):
    return tuple(s[k:] + s[:k] for k in range(len(s)))


@atomic(
    "strings",
    Str(min_len=1, max_len=12),
    Words(min_len=1, max_len=12, min_item=1, max_item=12),
    "List the prefixes of the input from shortest to longest, from its first letter alone to the"
    ' whole input (so "abc" gives ["a", "ab", "abc"]).',
)
def prefixes(s):
    return tuple(s[: k + 1] for k in range(len(s)))


@atomic(
    "strings",
    Str(min_len=1, max_len=16),
    Words(min_len=1, max_len=16, min_item=1, max_item=1),
    'Split the input into its individual letters, in order (so "abc" gives ["a", "b", "c"]).',
)
def letters(s):
    return tuple(s)


# str_list -> str


@atomic(
    "strings",
    W,
    Str(min_len=0, max_len=320),
    "Concatenate the words of the input list in order, with nothing between them.",
)
def concatenate(words):
    return "".join(words)


@atomic(
    "strings",
    W,
    Str(alphabet=LOWER + "-", min_len=0, max_len=335),
    "Join the words of the input list in order into one string, with a hyphen (-) between each"
    ' two neighbouring words (so ["ab", "c"] gives "ab-c").',
)
def join_with_hyphens(words):
    return "-".join(words)


@atomic(
    "strings",
    Words(min_len=1, min_item=1),
    Str(min_len=1, max_len=16),
    "Form a string from the first letter of each word of the input list, in order.",
)
def first_letters(words):
    return "".join(w[0] for w in words)


@atomic(
    "strings",
    Words(min_len=1, min_item=1),
    Str(min_len=1, max_len=16),
    "Form a string from the last letter of each word of the input list, in order.",
)
def last_letters(words):
    return "".join(w[-1] for w in words)


@atomic(
    "strings",
    W,
    Str(min_len=0, max_len=20),
    "Give the longest word of the input list; if several are equally long, give the one that"
    " appears first in the list.",
)
def longest_word(words):
    return max(words, key=len)


@atomic(
    "strings",
    W,
    Str(min_len=0, max_len=20),
    "Give the shortest word of the input list; if several are equally short, give the one that"
    " appears first in the list.",
)
def shortest_word(words):
    return min(words, key=len)


@atomic(
    "strings",
    W,
    Str(min_len=0, max_len=20),
    "Give the word of the input list that comes first in alphabetical (dictionary) order, where"
    ' a word comes before any longer word that starts with it ("ab" before "abc").',
)
def first_alphabetically(words):
    return min(words)


# str_list -> str_list


@atomic(
    "strings",
    W,
    Words(min_len=1),
    "Sort the words of the input list in alphabetical (dictionary) order, keeping duplicates;"
    ' a word comes before any longer word that starts with it ("ab" before "abc").',
)
def sort_words(words):
    return tuple(sorted(words))


@atomic(
    "strings",
    W,
    Words(min_len=1),
    "Sort the words of the input list by length, shortest first; words of equal length keep"
    " their order from the input.",
)
def sort_by_length(words):
    return tuple(sorted(words, key=len))


@atomic(
    "strings",
    W,
    Words(min_len=1),
    "Remove repeated words from the input list, keeping the first occurrence of each word and the"
    " order of those first occurrences.",
    sampler=_word_lists_with_repeats,
)
def dedupe_words(words):
    out = []
    for w in words:
        if w not in out:
            out.append(w)
    return tuple(out)


@atomic(
    "strings",
    W,
    Words(min_len=1),
    "Reverse the letters of each word of the input list, keeping the words in their order.",
)
def reverse_each_word(words):
    return tuple(w[::-1] for w in words)


@atomic("strings", W, Words(min_len=1), "Reverse the order of the words in the input list.")
def reverse_word_order(words):
    return tuple(reversed(words))


@atomic(
    "strings",
    W,
    Words(min_len=0),
    "Remove from the input list every word with fewer than 3 letters, keeping the others in"
    " order; the result may be an empty list.",
)
def drop_short_words(words):
    return tuple(w for w in words if len(w) >= 3)


# str_list -> int_list, int, bool


@atomic(
    "strings",
    W,
    IntList(min_len=1, max_len=16, lo=0, hi=20),
    "Replace each word of the input list with its number of letters, keeping the order.",
)
def word_lengths(words):
    return tuple(len(w) for w in words)


@atomic(
    "strings",
    W,
    Int(1, 16),
    "Count the words in the input list, counting repeated words every time.",
)
def word_count(words):
    return len(words)


@atomic(
    "strings",
    W,
    Int(0, 320),
    "Count the letters in all the words of the input list together.",
)
def total_letters(words):
    return sum(len(w) for w in words)


@atomic(
    "strings",
    W,
    Int(1, 16),
    "Count how many different words the input list contains.",
    sampler=_word_lists_with_repeats,
)
def distinct_words(words):
    return len(set(words))


@atomic(
    "strings",
    W,
    Bool(),
    "Answer true if the words of the input list are in alphabetical (dictionary) order, equal"
    ' neighbours allowed and "ab" counting as before "abc", and false otherwise.',
    sampler=_word_lists_sorted_half_the_time,
)
def words_sorted(words):
    return list(words) == sorted(words)


# int and int_list -> str


@atomic(
    "strings",
    Int(1, 10**6),
    Str(min_len=1, max_len=5),
    "Write the input as a lowercase spreadsheet column label (bijective base 26): 1 = a, ...,"
    " 26 = z, 27 = aa, 28 = ab, ..., 52 = az, 53 = ba, ..., 702 = zz, 703 = aaa.",
)
def column_label(n):
    out = ""
    while n > 0:
        n, r = divmod(n - 1, 26)
        out = chr(97 + r) + out
    return out


@atomic(
    "strings",
    Int(0, 10**12),
    Str(min_len=1, max_len=13),
    "Write the decimal digits of the input (no leading zeros), replacing each digit by a letter:"
    ' 0 by a, 1 by b, ..., 9 by j (so 305 becomes "daf").',
)
def digits_to_letters(n):
    return "".join(chr(97 + int(d)) for d in str(n))


@atomic(
    "strings",
    IntList(min_len=1, max_len=40, lo=1, hi=26),
    Str(min_len=1, max_len=40),
    "Replace each number of the input list with the letter at that position in the alphabet"
    " (1 = a, 2 = b, ..., 26 = z) and write the letters in order as one string.",
)
def positions_to_letters(xs):
    return "".join(chr(96 + x) for x in xs)
