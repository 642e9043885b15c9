"""RACES atomic environments: '.'/'#' grids.

A grid is a tuple of equal-length row strings over '.' (empty) and '#' (filled), at most 12x12
(see `tirl.envs.types.Grid`). Rows are numbered from the top and columns from the left, both
from 0; "4-connected" means cells sharing an edge (up, down, left, right), never a corner.
Same-type transformations (flips, rotations, gravity, dilation, shifts) sit next to counts
(-> int), per-row and per-column profiles (-> int_list), cell sets (-> int_set), and conversions
to a 0/1 matrix or to the graph of adjacent filled cells, so grids chain into other domains.

Input constraints keep conversions valid: a matrix has at most 8 rows and columns, so the
matrix conversion takes grids of at most 8x8, and a graph has at most 12 nodes, so the cell
graph (one node per cell) takes grids of at most 3x3.
"""

from __future__ import annotations

import random

from tirl.envs.core import atomic
from tirl.envs.types import Bool, Graph, Grid, Int, IntList, IntSet, Matrix

ANY = Grid()


def _mirror_symmetric_or_not(rng: random.Random, level: int):
    """Half grids that read the same left to right and right to left, half random grids."""
    g = ANY.sample(rng, level)
    if rng.random() < 0.5:
        w = len(g[0])
        g = tuple(r[: (w + 1) // 2] + r[: w // 2][::-1] for r in g)
    return g


def _island(rng: random.Random, level: int):
    """A random patch of cells placed somewhere inside a larger empty grid."""
    h, w = rng.randint(2, 2 + 2 * level), rng.randint(2, 2 + 2 * level)
    ph, pw = rng.randint(1, h), rng.randint(1, w)
    top, left = rng.randint(0, h - ph), rng.randint(0, w - pw)
    cells = [["."] * w for _ in range(h)]
    for i in range(top, top + ph):
        for j in range(left, left + pw):
            if rng.random() < 0.5:
                cells[i][j] = "#"
    return tuple("".join(r) for r in cells)


def _dense(rng: random.Random, level: int):
    """Grids filled at a rate of 70 to 95 percent, so that solid regions occur."""
    h, w = rng.randint(3, 3 + 2 * level), rng.randint(3, 3 + 2 * level)
    p = rng.uniform(0.7, 0.95)
    return tuple("".join("#" if rng.random() < p else "." for _ in range(w)) for _ in range(h))


def _with_full_rows(rng: random.Random, level: int):
    """Random grids in which some rows are completely filled."""
    g = ANY.sample(rng, level)
    return tuple("#" * len(r) if rng.random() < 0.35 else r for r in g)


@atomic("grids", ANY, Int(), "Count the '#' cells in the input grid.")
def count_filled(g):
    return sum(r.count("#") for r in g)


@atomic(
    "grids",
    ANY,
    Grid(),
    "Mirror the input grid left to right: reverse every row.",
)
def flip_left_right(g):
    return tuple(r[::-1] for r in g)


@atomic(
    "grids",
    ANY,
    Grid(),
    "Mirror the input grid top to bottom: reverse the order of its rows.",
)
def flip_top_bottom(g):
    return tuple(g[::-1])


@atomic(
    "grids",
    ANY,
    Grid(),
    "Rotate the input grid 90 degrees clockwise (the first column, read bottom to top, becomes "
    "the first row).",
)
def rotate_clockwise(g):
    return tuple("".join(c) for c in zip(*g[::-1]))


@atomic(
    "grids",
    ANY,
    Grid(),
    "Transpose the input grid: row i of the answer is column i of the input, read top to bottom.",
)
def transpose(g):
    return tuple("".join(c) for c in zip(*g))


@atomic(
    "grids",
    ANY,
    Grid(),
    "Invert the input grid: every '#' becomes '.' and every '.' becomes '#'.",
)
def invert(g):
    return tuple(r.translate(str.maketrans(".#", "#.")) for r in g)


@atomic(
    "grids",
    ANY,
    Grid(),
    "Fill the top row of the input grid: set every cell of the first row to '#'; keep the other "
    "rows unchanged.",
)
def fill_top_row(g):
    return ("#" * len(g[0]),) + tuple(g[1:])


@atomic(
    "grids",
    ANY,
    Grid(),
    "Apply gravity to the input grid: in every column, let the '#' cells fall to the bottom, so "
    "each column keeps its number of '#' cells but has them all at its lowest rows.",
)
def gravity_down(g):
    h = len(g)
    cols = []
    for c in zip(*g):
        k = c.count("#")
        cols.append("." * (h - k) + "#" * k)
    return tuple("".join(r) for r in zip(*cols))


@atomic(
    "grids",
    ANY,
    Grid(),
    "Slide the '#' cells of the input grid to the left: each row keeps its number of '#' cells "
    "but has them all at its leftmost positions.",
)
def slide_left(g):
    return tuple("#" * r.count("#") + "." * r.count(".") for r in g)


@atomic(
    "grids",
    ANY,
    Int(),
    "Count the 4-connected components of '#' cells in the input grid (cells that share an edge "
    "belong to the same component; diagonal contact does not count).",
)
def component_count(g):
    h, w = len(g), len(g[0])
    seen = set()
    count = 0
    for i in range(h):
        for j in range(w):
            if g[i][j] == "#" and (i, j) not in seen:
                count += 1
                seen.add((i, j))
                stack = [(i, j)]
                while stack:
                    a, b = stack.pop()
                    for x, y in ((a + 1, b), (a - 1, b), (a, b + 1), (a, b - 1)):
                        if 0 <= x < h and 0 <= y < w and g[x][y] == "#" and (x, y) not in seen:
                            seen.add((x, y))
                            stack.append((x, y))
    return count


@atomic(
    "grids",
    ANY,
    Int(),
    "Give the number of cells in the largest 4-connected component of '#' cells in the input "
    "grid (cells sharing an edge are connected, diagonal contact does not count); 0 if there is "
    "no '#'.",
)
def largest_component_size(g):
    h, w = len(g), len(g[0])
    seen = set()
    best = 0
    for i in range(h):
        for j in range(w):
            if g[i][j] == "#" and (i, j) not in seen:
                seen.add((i, j))
                stack = [(i, j)]
                size = 0
                while stack:
                    a, b = stack.pop()
                    size += 1
                    for x, y in ((a + 1, b), (a - 1, b), (a, b + 1), (a, b - 1)):
                        if 0 <= x < h and 0 <= y < w and g[x][y] == "#" and (x, y) not in seen:
                            seen.add((x, y))
                            stack.append((x, y))
                best = max(best, size)
    return best


@atomic(
    "grids",
    ANY,
    IntList(),
    "List the number of '#' cells in each row of the input grid, top row first.",
)
def row_counts(g):
    return tuple(r.count("#") for r in g)


@atomic(
    "grids",
    ANY,
    IntList(),
    "List the number of '#' cells in each column of the input grid, leftmost column first.",
)
def column_counts(g):
    return tuple(c.count("#") for c in zip(*g))


@atomic(
    "grids",
    ANY,
    Grid(),
    "Draw a frame on the input grid: set every cell in the first row, last row, first column and "
    "last column to '#'; keep the inner cells unchanged.",
)
def draw_frame(g):
    h, w = len(g), len(g[0])
    return tuple(
        "".join("#" if i in (0, h - 1) or j in (0, w - 1) else g[i][j] for j in range(w))
        for i in range(h)
    )


@atomic(
    "grids",
    ANY,
    Grid(),
    "Hollow out the input grid: a '#' cell becomes '.' when all four of its edge neighbours (up, "
    "down, left, right) exist inside the grid and are '#'; every other cell stays as it is.",
    sampler=_dense,
)
def hollow_out(g):
    h, w = len(g), len(g[0])

    def inner(i, j):
        return (
            0 < i < h - 1
            and 0 < j < w - 1
            and g[i - 1][j] == g[i + 1][j] == g[i][j - 1] == g[i][j + 1] == "#"
        )

    return tuple(
        "".join("." if g[i][j] == "#" and inner(i, j) else g[i][j] for j in range(w))
        for i in range(h)
    )


@atomic(
    "grids",
    Grid(max_size=8),
    Matrix(),
    "Convert the input grid into a matrix of the same shape with 1 for each '#' cell and 0 for "
    "each '.' cell.",
)
def to_binary_matrix(g):
    return tuple(tuple(1 if ch == "#" else 0 for ch in r) for r in g)


@atomic(
    "grids",
    ANY,
    IntList(),
    "Give the height and width of the smallest rectangle of rows and columns that contains every "
    "'#' cell of the input grid, as [height, width]; answer [0, 0] if there is no '#'.",
    sampler=_island,
)
def bounding_box_size(g):
    cells = [(i, j) for i, r in enumerate(g) for j, ch in enumerate(r) if ch == "#"]
    if not cells:
        return (0, 0)
    rows = [i for i, _ in cells]
    cols = [j for _, j in cells]
    return (max(rows) - min(rows) + 1, max(cols) - min(cols) + 1)


@atomic(
    "grids",
    ANY,
    Grid(),
    "Crop the input grid to the smallest rectangle of rows and columns that contains every '#' "
    "cell; if there is no '#' at all, the answer is the one-cell grid [\".\"].",
    sampler=_island,
)
def crop_to_filled(g):
    cells = [(i, j) for i, r in enumerate(g) for j, ch in enumerate(r) if ch == "#"]
    if not cells:
        return (".",)
    r0, r1 = min(i for i, _ in cells), max(i for i, _ in cells)
    c0, c1 = min(j for _, j in cells), max(j for _, j in cells)
    return tuple(r[c0 : c1 + 1] for r in g[r0 : r1 + 1])


@atomic(
    "grids",
    ANY,
    Grid(),
    "Shift every row of the input grid one cell to the right, wrapping around: the last cell of "
    "each row moves to the front.",
)
def shift_right_wrap(g):
    return tuple(r[-1] + r[:-1] for r in g)


@atomic(
    "grids",
    ANY,
    Grid(),
    "Shift the input grid down by one row, wrapping around: the bottom row moves to the top.",
)
def shift_down_wrap(g):
    return (g[-1],) + tuple(g[:-1])


@atomic(
    "grids",
    ANY,
    Grid(),
    "Remove isolated cells from the input grid: a '#' cell with no '#' among its four edge "
    "neighbours (up, down, left, right) becomes '.'; all other cells stay as they are.",
)
def remove_isolated(g):
    h, w = len(g), len(g[0])

    def lonely(i, j):
        near = ((i + 1, j), (i - 1, j), (i, j + 1), (i, j - 1))
        return not any(0 <= a < h and 0 <= b < w and g[a][b] == "#" for a, b in near)

    return tuple(
        "".join("." if g[i][j] == "#" and lonely(i, j) else g[i][j] for j in range(w))
        for i in range(h)
    )


@atomic(
    "grids",
    ANY,
    Grid(),
    "Grow the '#' cells of the input grid by one step: a '.' cell becomes '#' when at least one "
    "of its four edge neighbours (up, down, left, right) is '#' in the input; '#' cells stay '#'.",
)
def dilate(g):
    h, w = len(g), len(g[0])

    def grows(i, j):
        near = ((i + 1, j), (i - 1, j), (i, j + 1), (i, j - 1))
        return any(0 <= a < h and 0 <= b < w and g[a][b] == "#" for a, b in near)

    return tuple(
        "".join("#" if g[i][j] == "#" or grows(i, j) else "." for j in range(w)) for i in range(h)
    )


@atomic(
    "grids",
    Grid(max_size=8),
    IntSet(),
    "Number the cells of the input grid in row-major order (the top row left to right gets 0, "
    "1, ..., then the next row continues) and give the set of numbers of the '#' cells.",
)
def filled_cell_numbers(g):
    w = len(g[0])
    return frozenset(i * w + j for i, r in enumerate(g) for j, ch in enumerate(r) if ch == "#")


@atomic(
    "grids",
    ANY,
    Bool(),
    "Decide whether the input grid is mirror-symmetric left to right, i.e. every row reads the "
    "same forwards and backwards.",
    sampler=_mirror_symmetric_or_not,
)
def is_mirror_symmetric(g):
    return all(r == r[::-1] for r in g)


@atomic(
    "grids",
    ANY,
    Grid(),
    "Make the input grid mirror-symmetric: a cell becomes '#' when it or its mirror image in the "
    "same row (the cell at the same distance from the other edge) is '#'.",
)
def symmetrize_left_right(g):
    return tuple("".join("#" if "#" in (a, b) else "." for a, b in zip(r, r[::-1])) for r in g)


@atomic(
    "grids",
    ANY,
    Grid(),
    "Clear the full rows of the input grid: delete every row made only of '#', then add that "
    "many rows of '.' at the top so the grid keeps its height.",
    sampler=_with_full_rows,
)
def clear_full_rows(g):
    w = len(g[0])
    kept = tuple(r for r in g if r != "#" * w)
    return ("." * w,) * (len(g) - len(kept)) + kept


@atomic(
    "grids",
    ANY,
    Int(),
    "Compute the perimeter of the '#' region of the input grid: the number of cell sides where a "
    "'#' cell meets a '.' cell or the outside of the grid.",
)
def perimeter(g):
    h, w = len(g), len(g[0])
    total = 0
    for i in range(h):
        for j in range(w):
            if g[i][j] == "#":
                for a, b in ((i + 1, j), (i - 1, j), (i, j + 1), (i, j - 1)):
                    if not (0 <= a < h and 0 <= b < w and g[a][b] == "#"):
                        total += 1
    return total


@atomic(
    "grids",
    ANY,
    IntList(),
    "For each column of the input grid, leftmost first, give the row index (0 = top) of its "
    "highest '#' cell, or -1 if the column has no '#'.",
)
def top_filled_row_per_column(g):
    return tuple(c.index("#") if "#" in c else -1 for c in ("".join(c) for c in zip(*g)))


@atomic(
    "grids",
    Grid(max_size=3),
    Graph(),
    "Make a graph from the input grid: number its cells in row-major order (the top row left to "
    "right gets 0, 1, ..., then the next row continues), one node per cell, and join two nodes "
    "by an edge when their cells share a side and both are '#'.",
)
def filled_adjacency_graph(g):
    h, w = len(g), len(g[0])
    pairs = set()
    for i in range(h):
        for j in range(w):
            if g[i][j] == "#":
                if i + 1 < h and g[i + 1][j] == "#":
                    pairs.add((i * w + j, (i + 1) * w + j))
                if j + 1 < w and g[i][j + 1] == "#":
                    pairs.add((i * w + j, i * w + j + 1))
    return (h * w, tuple(sorted(pairs)))
