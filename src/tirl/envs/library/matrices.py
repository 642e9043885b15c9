"""RACES atomic environments: integer matrices.

Matrices are tuples of equal-length row tuples of ints (see `tirl.envs.types.Matrix`); row and
column indices start at 0, and "row-major" means the top row first, each row left to right.
Same-type reshapes (transpose, rotations, flips) sit next to cross-type reductions (trace ->
int, row sums -> int_list, symmetry test -> bool) and conversions (-> grid, -> graph, ->
characteristic polynomial), so a matrix can start or continue a chain into other domains.

Input constraints keep every mapper exact and fast and every output a valid value of its type:
entries bounded so that sums, products and powers stay far below the output types' limits, and
square inputs of at most 4x4 for the determinant, the square and the characteristic polynomial.
"""

from __future__ import annotations

import random

from tirl.envs.core import atomic
from tirl.envs.types import Bool, Graph, Grid, Int, IntList, Matrix, Poly

ANY = Matrix(lo=-(10**9), hi=10**9)  # up to 8x8; reshapes and entry-wise small changes
SUMS = Matrix(lo=-(10**6), hi=10**6)  # row/column sums stay under 10**7
SQUARE = Matrix(square=True, lo=-(10**9), hi=10**9)
SMALL_SQUARE = Matrix(square=True, max_rows=4, max_cols=4, lo=-20, hi=20)
TWO_ROWS = Matrix(min_rows=2, max_rows=2, lo=-(10**6), hi=10**6)
TALL = Matrix(min_rows=2, lo=-(10**9), hi=10**9)


def _identity_or_near(rng: random.Random, level: int):
    """Half identity matrices, half square matrices one entry away from the identity."""
    n = rng.randint(1, 1 + level)
    m = [[int(i == j) for j in range(n)] for i in range(n)]
    if rng.random() < 0.5:
        i, j = rng.randrange(n), rng.randrange(n)
        m[i][j] += rng.choice([-2, -1, 1, 2])
    if rng.random() < 0.15:  # a non-square matrix is never the identity
        m = [r + [0] for r in m]
    return tuple(tuple(r) for r in m)


def _symmetric_or_near(rng: random.Random, level: int):
    """Half symmetric square matrices; the rest break symmetry in one entry or are random."""
    n = rng.randint(1, 1 + level)
    bound = 5**level
    m = [[0] * n for _ in range(n)]
    for i in range(n):
        for j in range(i, n):
            m[i][j] = m[j][i] = rng.randint(-bound, bound)
    if rng.random() < 0.5 and n > 1:
        i, j = rng.sample(range(n), 2)
        m[i][j] += rng.choice([-1, 1])
    return tuple(tuple(r) for r in m)


def _sparse_square(rng: random.Random, level: int):
    """Square matrices with mostly zero entries, so that their nonzero pattern varies."""
    n = rng.randint(2, 2 + 2 * level)
    p = rng.uniform(0.1, 0.4)
    return tuple(
        tuple(rng.randint(-9, 9) if rng.random() < p else 0 for _ in range(n)) for _ in range(n)
    )


@atomic(
    "matrices",
    ANY,
    Matrix(),
    "Transpose the input matrix: row i of the answer is column i of the input.",
)
def transpose(m):
    return tuple(zip(*m))


@atomic(
    "matrices",
    ANY,
    Matrix(),
    "Rotate the input matrix 90 degrees clockwise (the first column, read bottom to top, "
    "becomes the first row).",
)
def rotate_clockwise(m):
    return tuple(tuple(r) for r in zip(*m[::-1]))


@atomic(
    "matrices",
    ANY,
    Matrix(),
    "Rotate the input matrix 90 degrees counterclockwise (the last column, read top to bottom, "
    "becomes the first row).",
)
def rotate_counterclockwise(m):
    return tuple(tuple(r) for r in zip(*m))[::-1]


@atomic(
    "matrices",
    ANY,
    Matrix(),
    "Mirror the input matrix left to right: reverse the order of the entries in every row.",
)
def flip_left_right(m):
    return tuple(tuple(r[::-1]) for r in m)


@atomic(
    "matrices",
    ANY,
    Matrix(),
    "Mirror the input matrix top to bottom: reverse the order of its rows.",
)
def flip_top_bottom(m):
    return tuple(m[::-1])


@atomic("matrices", ANY, Matrix(), "Add 3 to every entry of the input matrix.")
def add_three(m):
    return tuple(tuple(x + 3 for x in r) for r in m)


@atomic("matrices", ANY, Matrix(), "Multiply every entry of the input matrix by -2.")
def scale_by_minus_two(m):
    return tuple(tuple(-2 * x for x in r) for r in m)


@atomic(
    "matrices",
    ANY,
    Matrix(),
    "Replace every negative entry of the input matrix by 0; keep the other entries.",
)
def clamp_negatives(m):
    return tuple(tuple(max(x, 0) for x in r) for r in m)


@atomic(
    "matrices",
    SQUARE,
    Int(),
    "Compute the trace of the input square matrix: the sum of its main-diagonal entries.",
)
def trace(m):
    return sum(m[i][i] for i in range(len(m)))


@atomic("matrices", SMALL_SQUARE, Int(), "Compute the determinant of the input square matrix.")
def determinant(m):
    from itertools import permutations

    n = len(m)
    total = 0
    for p in permutations(range(n)):
        inversions = sum(1 for i in range(n) for j in range(i + 1, n) if p[i] > p[j])
        term = -1 if inversions % 2 else 1
        for i in range(n):
            term *= m[i][p[i]]
        total += term
    return total


@atomic(
    "matrices",
    SUMS,
    IntList(),
    "List the sum of each row of the input matrix, top row first.",
)
def row_sums(m):
    return tuple(sum(r) for r in m)


@atomic(
    "matrices",
    SUMS,
    IntList(),
    "List the sum of each column of the input matrix, leftmost column first.",
)
def column_sums(m):
    return tuple(sum(c) for c in zip(*m))


@atomic(
    "matrices",
    ANY,
    IntList(),
    "Flatten the input matrix into one list in row-major order: the top row left to right, "
    "then the next row, and so on.",
)
def flatten(m):
    return tuple(x for r in m for x in r)


@atomic(
    "matrices",
    ANY,
    IntList(),
    "List the largest entry of each row of the input matrix, top row first.",
)
def row_maxima(m):
    return tuple(max(r) for r in m)


@atomic(
    "matrices",
    ANY,
    IntList(),
    "List the smallest entry of each column of the input matrix, leftmost column first.",
)
def column_minima(m):
    return tuple(min(c) for c in zip(*m))


@atomic(
    "matrices",
    TWO_ROWS,
    Matrix(),
    "Compute the product A x M, where A is the fixed 2x2 matrix [[2, 1], [1, 1]] and M is the "
    "input matrix with two rows (so the answer has M's shape).",
)
def left_multiply_fixed(m):
    a = ((2, 1), (1, 1))
    return tuple(
        tuple(sum(a[i][k] * m[k][j] for k in range(2)) for j in range(len(m[0]))) for i in range(2)
    )


@atomic(
    "matrices",
    ANY,
    Bool(),
    "Decide whether the input matrix is an identity matrix: square, with 1 on the main diagonal "
    "and 0 everywhere else.",
    sampler=_identity_or_near,
)
def is_identity(m):
    n = len(m)
    return len(m[0]) == n and all(m[i][j] == int(i == j) for i in range(n) for j in range(n))


@atomic(
    "matrices",
    ANY,
    Bool(),
    "Decide whether the input matrix is symmetric: square and equal to its own transpose.",
    sampler=_symmetric_or_near,
)
def is_symmetric(m):
    return len(m) == len(m[0]) and all(
        m[i][j] == m[j][i] for i in range(len(m)) for j in range(len(m))
    )


@atomic(
    "matrices",
    ANY,
    Matrix(),
    "Keep the upper-triangular part of the input matrix: set every entry below the main "
    "diagonal (row index greater than column index) to 0 and keep the rest.",
)
def upper_triangular(m):
    return tuple(tuple(x if j >= i else 0 for j, x in enumerate(r)) for i, r in enumerate(m))


@atomic(
    "matrices",
    Matrix(square=True, max_rows=4, max_cols=4, lo=-1000, hi=1000),
    Matrix(),
    "Square the input square matrix: compute the matrix product M x M.",
)
def matrix_square(m):
    n = len(m)
    return tuple(
        tuple(sum(m[i][k] * m[k][j] for k in range(n)) for j in range(n)) for i in range(n)
    )


@atomic("matrices", ANY, Int(), "Count the entries of the input matrix that are negative.")
def count_negatives(m):
    return sum(1 for r in m for x in r if x < 0)


@atomic(
    "matrices",
    ANY,
    IntList(),
    "List the main-diagonal entries of the input matrix, the entries at (0, 0), (1, 1), ... "
    "up to the last row or column, whichever comes first.",
)
def main_diagonal(m):
    return tuple(m[i][i] for i in range(min(len(m), len(m[0]))))


@atomic(
    "matrices",
    SQUARE,
    IntList(),
    "List the anti-diagonal entries of the input square matrix, from the top-right corner down "
    "to the bottom-left corner.",
)
def anti_diagonal(m):
    n = len(m)
    return tuple(m[i][n - 1 - i] for i in range(n))


@atomic(
    "matrices",
    ANY,
    Matrix(),
    "Sort the entries within each row of the input matrix in ascending order.",
)
def sort_each_row(m):
    return tuple(tuple(sorted(r)) for r in m)


@atomic(
    "matrices",
    SUMS,
    Matrix(),
    "Replace each entry of the input matrix by the sum of the entries from the start of its row "
    "up to and including itself (running sums along each row, left to right).",
)
def row_prefix_sums(m):
    from itertools import accumulate

    return tuple(tuple(accumulate(r)) for r in m)


@atomic(
    "matrices",
    SUMS,
    Int(),
    "Give the 0-based index of the row of the input matrix with the largest sum; if several rows "
    "tie, give the smallest such index.",
)
def row_with_largest_sum(m):
    sums = [sum(r) for r in m]
    return sums.index(max(sums))


@atomic(
    "matrices",
    TALL,
    Matrix(),
    "Delete the top row of the input matrix (it has at least two rows); keep the others in order.",
)
def drop_first_row(m):
    return tuple(m[1:])


@atomic(
    "matrices",
    ANY,
    IntList(),
    "Give the shape of the input matrix as a list [number of rows, number of columns].",
)
def shape(m):
    return (len(m), len(m[0]))


@atomic(
    "matrices",
    ANY,
    Grid(),
    "Draw the input matrix as a grid of the same shape: a cell is '#' where the entry is positive "
    "and '.' where it is zero or negative.",
)
def positive_cells_to_grid(m):
    return tuple("".join("#" if x > 0 else "." for x in r) for r in m)


@atomic(
    "matrices",
    SQUARE,
    Graph(),
    "Read the input n x n matrix as a graph on nodes 0..n-1: nodes i and j (i different from j) "
    "are joined by an edge when the entry at (i, j) or at (j, i) is nonzero; the diagonal is "
    "ignored.",
    sampler=_sparse_square,
)
def nonzero_pattern_graph(m):
    n = len(m)
    pairs = {(i, j) for i in range(n) for j in range(i + 1, n) if m[i][j] or m[j][i]}
    return (n, tuple(sorted(pairs)))


@atomic(
    "matrices",
    SMALL_SQUARE,
    Poly(),
    "Compute the characteristic polynomial det(xI - M) of the input square matrix M (monic, of "
    "degree equal to the size of M).",
)
def characteristic_polynomial(m):
    # Faddeev-LeVerrier: M_k = A M_{k-1} + c_{n-k+1} I, c_{n-k} = -tr(A M_k) / k, exact in ints.
    n = len(m)
    coefs = [1]
    prev = [[0] * n for _ in range(n)]
    c = 1
    for k in range(1, n + 1):
        mk = [
            [sum(m[i][t] * prev[t][j] for t in range(n)) + (c if i == j else 0) for j in range(n)]
            for i in range(n)
        ]
        tr = sum(sum(m[i][t] * mk[t][i] for t in range(n)) for i in range(n))
        c = -tr // k
        coefs.append(c)
        prev = mk
    return tuple(coefs)
