"""RACES atomic environments: undirected simple graphs.

A graph is the plain value (n, edges) on nodes 0..n-1, edges a sorted tuple of (u, v) pairs with
u < v and no loops or repeats (see `tirl.envs.types.Graph`, at most 12 nodes). Mappers build
their output graphs inline in that canonical form, since a mapper's source must run on its own.
Traversals break ties by visiting the smallest node number first, so every order is unique.

Same-type rewrites (complement, square, relabelling, adding or removing edges and nodes) sit
next to measurements (-> int), per-node profiles (-> int_list), node sets (-> int_set), yes/no
properties (-> bool) and the adjacency matrix or grid, so graphs chain into other domains.
The adjacency matrix takes graphs of at most 8 nodes (a matrix has at most 8 rows).
"""

from __future__ import annotations

import random

from tirl.envs.core import atomic
from tirl.envs.types import Bool, Graph, Grid, Int, IntList, IntSet, Matrix, graph_of

ANY = Graph()


def _tree_or_not(rng: random.Random, level: int):
    """Half random trees (each node i > 0 joined to an earlier node), half random graphs,
    some of them trees with one edge added or removed."""
    g = ANY.sample(rng, level)
    if rng.random() < 0.6:
        n = g[0]
        edges = [(rng.randrange(i), i) for i in range(1, n)]
        if rng.random() < 0.3 and n > 2:
            if rng.random() < 0.5:
                edges.pop(rng.randrange(len(edges)))
            else:
                edges.append(tuple(rng.sample(range(n), 2)))
        g = graph_of(n, edges)
    return g


def _bipartite_or_not(rng: random.Random, level: int):
    """Half random bipartite graphs (edges only between two random sides), half random graphs."""
    g = ANY.sample(rng, level)
    if rng.random() < 0.5:
        n = g[0]
        side = [rng.random() < 0.5 for _ in range(n)]
        g = graph_of(n, [(u, v) for u, v in g[1] if side[u] != side[v]])
    return g


def _sparse(rng: random.Random, level: int):
    """Sparser random graphs (edge chance 0.1 to 0.3), so that connectivity varies."""
    n = rng.randint(2, 3 + 2 * level)
    p = rng.uniform(0.1, 0.3)
    return graph_of(n, [(u, v) for u in range(n) for v in range(u + 1, n) if rng.random() < p])


@atomic("graphs", ANY, Int(), "Count the edges of the input graph.")
def edge_count(g):
    return len(g[1])


@atomic(
    "graphs",
    ANY,
    IntList(),
    "List the degree (number of neighbours) of every node of the input graph, in node order "
    "0, 1, ..., n-1.",
)
def degree_sequence(g):
    n, edges = g
    deg = [0] * n
    for u, v in edges:
        deg[u] += 1
        deg[v] += 1
    return tuple(deg)


@atomic(
    "graphs",
    ANY,
    IntList(),
    "List the degrees (numbers of neighbours) of the nodes of the input graph, sorted from "
    "largest to smallest.",
)
def sorted_degrees(g):
    n, edges = g
    deg = [0] * n
    for u, v in edges:
        deg[u] += 1
        deg[v] += 1
    return tuple(sorted(deg, reverse=True))


@atomic(
    "graphs",
    ANY,
    Graph(),
    "Give the complement of the input graph: the same nodes, with an edge between two distinct "
    "nodes exactly when the input has no edge between them.",
)
def complement(g):
    n, edges = g
    present = set(edges)
    return (n, tuple((u, v) for u in range(n) for v in range(u + 1, n) if (u, v) not in present))


@atomic(
    "graphs",
    ANY,
    Int(),
    "Count the connected components of the input graph (an isolated node is a component of its "
    "own).",
    sampler=_sparse,
)
def component_count(g):
    n, edges = g
    parent = list(range(n))

    def find(x):
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    for u, v in edges:
        parent[find(u)] = find(v)
    return len({find(x) for x in range(n)})


@atomic(
    "graphs",
    ANY,
    Bool(),
    "Decide whether the input graph is connected: every node can be reached from every other "
    "node along edges (a single node counts as connected).",
    sampler=_sparse,
)
def is_connected(g):
    n, edges = g
    adj = {x: set() for x in range(n)}
    for u, v in edges:
        adj[u].add(v)
        adj[v].add(u)
    seen, stack = {0}, [0]
    while stack:
        for y in adj[stack.pop()]:
            if y not in seen:
                seen.add(y)
                stack.append(y)
    return len(seen) == n


@atomic(
    "graphs",
    ANY,
    IntList(),
    "Run a breadth-first search of the input graph from node 0, adding the unvisited neighbours "
    "of each node in increasing order, and list the nodes in the order they are visited (only "
    "nodes reachable from 0).",
)
def bfs_order(g):
    n, edges = g
    adj = {x: [] for x in range(n)}
    for u, v in edges:
        adj[u].append(v)
        adj[v].append(u)
    order, seen, i = [0], {0}, 0
    while i < len(order):
        for y in sorted(adj[order[i]]):
            if y not in seen:
                seen.add(y)
                order.append(y)
        i += 1
    return tuple(order)


@atomic(
    "graphs",
    ANY,
    IntList(),
    "Run a depth-first search of the input graph from node 0 that always moves to the smallest "
    "unvisited neighbour first (backtracking when there is none), and list the nodes in the order "
    "they are first visited (only nodes reachable from 0).",
)
def dfs_order(g):
    n, edges = g
    adj = {x: [] for x in range(n)}
    for u, v in edges:
        adj[u].append(v)
        adj[v].append(u)
    order, seen = [], set()

    def visit(x):
        seen.add(x)
        order.append(x)
        for y in sorted(adj[x]):
            if y not in seen:
                visit(y)

    visit(0)
    return tuple(order)


@atomic(
    "graphs",
    ANY,
    Int(),
    "Give the number of edges on a shortest path from node 0 to node n-1 (the highest-numbered "
    "node) of the input graph; answer -1 if node n-1 cannot be reached, and 0 if n = 1.",
    sampler=_sparse,
)
def shortest_path_length(g):
    n, edges = g
    adj = {x: [] for x in range(n)}
    for u, v in edges:
        adj[u].append(v)
        adj[v].append(u)
    dist = {0: 0}
    queue = [0]
    for x in queue:
        for y in adj[x]:
            if y not in dist:
                dist[y] = dist[x] + 1
                queue.append(y)
    return dist.get(n - 1, -1)


@atomic(
    "graphs",
    ANY,
    IntList(),
    "List the distance (number of edges on a shortest path) from node 0 to every node of the "
    "input graph, in node order 0, 1, ..., n-1, using -1 for nodes that cannot be reached.",
    sampler=_sparse,
)
def distances_from_zero(g):
    n, edges = g
    adj = {x: [] for x in range(n)}
    for u, v in edges:
        adj[u].append(v)
        adj[v].append(u)
    dist = {0: 0}
    queue = [0]
    for x in queue:
        for y in adj[x]:
            if y not in dist:
                dist[y] = dist[x] + 1
                queue.append(y)
    return tuple(dist.get(x, -1) for x in range(n))


@atomic(
    "graphs",
    ANY,
    Int(),
    "Give the eccentricity of node 0 in the input graph: the largest distance (number of edges on "
    "a shortest path) from node 0 to any node reachable from it (0 if none is).",
)
def eccentricity_of_zero(g):
    n, edges = g
    adj = {x: [] for x in range(n)}
    for u, v in edges:
        adj[u].append(v)
        adj[v].append(u)
    dist = {0: 0}
    queue = [0]
    for x in queue:
        for y in adj[x]:
            if y not in dist:
                dist[y] = dist[x] + 1
                queue.append(y)
    return max(dist.values())


@atomic(
    "graphs",
    ANY,
    Graph(),
    "Remove every edge that touches node 0 of the input graph; keep all nodes and the other edges.",
)
def isolate_node_zero(g):
    n, edges = g
    return (n, tuple(e for e in edges if 0 not in e))


@atomic(
    "graphs",
    ANY,
    Graph(),
    "Add the path edges to the input graph: join node i to node i+1 for every i from 0 to n-2 "
    "(edges already present stay single).",
)
def add_path_edges(g):
    n, edges = g
    return (n, tuple(sorted(set(edges) | {(i, i + 1) for i in range(n - 1)})))


@atomic(
    "graphs",
    ANY,
    Int(),
    "Count the triangles of the input graph: sets of three nodes that are pairwise joined by "
    "edges.",
)
def triangle_count(g):
    n, edges = g
    present = set(edges)
    return sum(
        1
        for a in range(n)
        for b in range(a + 1, n)
        for c in range(b + 1, n)
        if (a, b) in present and (a, c) in present and (b, c) in present
    )


@atomic(
    "graphs",
    ANY,
    IntSet(),
    "Give the set of isolated nodes of the input graph: the nodes with no edges.",
    sampler=_sparse,
)
def isolated_nodes(g):
    n, edges = g
    return frozenset(range(n)) - {u for e in edges for u in e}


@atomic(
    "graphs",
    ANY,
    Bool(),
    "Decide whether the input graph is bipartite: its nodes can be split into two groups so "
    "that every edge joins nodes of different groups.",
    sampler=_bipartite_or_not,
)
def is_bipartite(g):
    n, edges = g
    adj = {x: [] for x in range(n)}
    for u, v in edges:
        adj[u].append(v)
        adj[v].append(u)
    color = {}
    for s in range(n):
        if s in color:
            continue
        color[s] = 0
        stack = [s]
        while stack:
            x = stack.pop()
            for y in adj[x]:
                if y not in color:
                    color[y] = 1 - color[x]
                    stack.append(y)
                elif color[y] == color[x]:
                    return False
    return True


@atomic(
    "graphs",
    ANY,
    Int(),
    "Give the number of edges in a spanning forest of the input graph (a spanning tree of each "
    "connected component), which is the number of nodes minus the number of components.",
    sampler=_sparse,
)
def spanning_forest_size(g):
    n, edges = g
    parent = list(range(n))

    def find(x):
        while parent[x] != x:
            x = parent[x]
        return x

    size = 0
    for u, v in edges:
        a, b = find(u), find(v)
        if a != b:
            parent[a] = b
            size += 1
    return size


@atomic(
    "graphs",
    ANY,
    Int(),
    "Give the node of the input graph with the most neighbours; if several nodes tie, give the "
    "smallest node number.",
)
def max_degree_node(g):
    n, edges = g
    deg = [0] * n
    for u, v in edges:
        deg[u] += 1
        deg[v] += 1
    return deg.index(max(deg))


@atomic(
    "graphs",
    Graph(max_nodes=8),
    Matrix(),
    "Write the adjacency matrix of the input graph: an n x n matrix whose entry in row i, column "
    "j is 1 if nodes i and j are joined by an edge and 0 otherwise.",
)
def adjacency_matrix(g):
    n, edges = g
    present = set(edges)
    return tuple(
        tuple(1 if (min(i, j), max(i, j)) in present else 0 for j in range(n)) for i in range(n)
    )


@atomic(
    "graphs",
    ANY,
    Grid(),
    "Draw the adjacency pattern of the input graph as an n x n grid: the cell in row i, column j "
    "is '#' if nodes i and j are joined by an edge and '.' otherwise.",
)
def adjacency_grid(g):
    n, edges = g
    present = set(edges)
    return tuple(
        "".join("#" if (min(i, j), max(i, j)) in present else "." for j in range(n))
        for i in range(n)
    )


@atomic("graphs", ANY, IntSet(), "Give the set of neighbours of node 0 in the input graph.")
def neighbours_of_zero(g):
    return frozenset(v if u == 0 else u for u, v in g[1] if 0 in (u, v))


@atomic(
    "graphs",
    ANY,
    IntSet(),
    "Give the set of leaves of the input graph: the nodes with exactly one neighbour.",
)
def leaves(g):
    n, edges = g
    deg = [0] * n
    for u, v in edges:
        deg[u] += 1
        deg[v] += 1
    return frozenset(x for x in range(n) if deg[x] == 1)


@atomic(
    "graphs",
    ANY,
    IntSet(),
    "Give the set of nodes in the connected component of node 0 of the input graph (node 0 "
    "included).",
    sampler=_sparse,
)
def component_of_zero(g):
    n, edges = g
    adj = {x: [] for x in range(n)}
    for u, v in edges:
        adj[u].append(v)
        adj[v].append(u)
    seen, stack = {0}, [0]
    while stack:
        for y in adj[stack.pop()]:
            if y not in seen:
                seen.add(y)
                stack.append(y)
    return frozenset(seen)


@atomic(
    "graphs",
    Graph(min_nodes=2),
    Graph(),
    "Delete the highest-numbered node n-1 from the input graph together with its edges; the "
    "answer has n-1 nodes.",
)
def remove_last_node(g):
    n, edges = g
    return (n - 1, tuple(e for e in edges if n - 1 not in e))


@atomic(
    "graphs",
    Graph(max_nodes=11),
    Graph(),
    "Add a new node n to the input graph and join it to every node that has an odd number of "
    "neighbours; the answer has n+1 nodes.",
)
def add_node_to_odd_degrees(g):
    n, edges = g
    deg = [0] * n
    for u, v in edges:
        deg[u] += 1
        deg[v] += 1
    return (n + 1, tuple(sorted(edges + tuple((x, n) for x in range(n) if deg[x] % 2))))


@atomic(
    "graphs",
    ANY,
    Graph(),
    "Relabel the nodes of the input graph in reverse: node i becomes node n-1-i; keep the same "
    "edges between the relabelled nodes.",
)
def reverse_labels(g):
    n, edges = g
    return (n, tuple(sorted((n - 1 - v, n - 1 - u) for u, v in edges)))


@atomic(
    "graphs",
    ANY,
    Graph(),
    "Square the input graph: join two distinct nodes when they are joined by an edge or have a "
    "common neighbour in the input.",
    sampler=_tree_or_not,
)
def square(g):
    n, edges = g
    adj = {x: {x} for x in range(n)}
    for u, v in edges:
        adj[u].add(v)
        adj[v].add(u)
    return (n, tuple((u, v) for u in range(n) for v in range(u + 1, n) if adj[u] & adj[v]))


@atomic(
    "graphs",
    ANY,
    Bool(),
    "Decide whether the input graph is a tree: connected and with exactly n-1 edges for its n "
    "nodes.",
    sampler=_tree_or_not,
)
def is_tree(g):
    n, edges = g
    if len(edges) != n - 1:
        return False
    adj = {x: [] for x in range(n)}
    for u, v in edges:
        adj[u].append(v)
        adj[v].append(u)
    seen, stack = {0}, [0]
    while stack:
        for y in adj[stack.pop()]:
            if y not in seen:
                seen.add(y)
                stack.append(y)
    return len(seen) == n


@atomic(
    "graphs",
    ANY,
    Graph(),
    "Remove every edge that touches a leaf of the input graph (a node with exactly one "
    "neighbour, counted in the input); keep all nodes.",
    sampler=_tree_or_not,
)
def remove_leaf_edges(g):
    n, edges = g
    deg = [0] * n
    for u, v in edges:
        deg[u] += 1
        deg[v] += 1
    return (n, tuple((u, v) for u, v in edges if deg[u] != 1 and deg[v] != 1))
