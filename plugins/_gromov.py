"""Gromov–Wasserstein from the identity coupling: POT's conditional gradient, made lean.

This is the algorithm of POT's ``gromov_wasserstein2`` (square loss, symmetric matrices,
uniform weights, exact line search) step for step: the same linear programs (POT's exact
``emd`` on the gradient), the same line search, the same stopping rule, the same reported
value. It differs in bookkeeping only. POT recomputes the product C1 G C2 (an n^3 matrix
product) five times per iteration; here it is kept up to date, and the linear programs'
solutions (vertices: permutations for uniform weights) are multiplied as sparse matrices, so an
iteration costs one dense product. Started from the identity coupling, which is often already a
stationary point of FFN updates, the whole solve costs a few products instead of ten.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy import sparse


@dataclass(frozen=True)
class Solver:
    """POT's stopping parameters: ``max_iter``, ``tol_rel``, ``tol_abs``, ``numItermaxEmd``."""

    max_iter: int = 10_000
    tol_rel: float = 1e-9
    tol_abs: float = 1e-9
    max_iter_emd: int = 1_000_000


def gw_from_identity(c1: np.ndarray, c2: np.ndarray, solver: Solver) -> float:
    """sum_{i,j,k,l} (c1[i,k] - c2[j,l])^2 T[i,j] T[k,l] at the coupling reached from I/n.

    ``c1`` and ``c2`` are symmetric n x n matrices; weights are uniform.
    """
    import ot

    n = len(c1)
    weights = np.full(n, 1.0 / n)
    # constC[i, j] = sum_k c1[i,k]^2 / n + sum_l c2[j,l]^2 / n: the part of the loss that does
    # not depend on the coupling (POT's init_matrix for the square loss).
    const = (c1**2).mean(axis=1)[:, None] + (c2**2).mean(axis=1)[None, :]
    coupling = sparse.identity(n, format="csr") / n
    product = c1 @ c2 / n  # c1 @ coupling @ c2
    cost = float(np.sum(const.diagonal()) / n - 2 * np.sum(product.diagonal()) / n)
    for _ in range(solver.max_iter):
        gradient = 2 * (const - 2 * product)
        vertex = ot.emd(weights, weights, gradient, solver.max_iter_emd)
        vertex = sparse.csr_matrix(vertex)
        change = c1 @ (vertex @ c2) - product  # c1 @ (vertex - coupling) @ c2
        # POT's exact line search on the quadratic cost(coupling + alpha (vertex - coupling)).
        along = float(coupling.multiply(change).sum())
        a = -2 * (float(vertex.multiply(change).sum()) - along)
        b = -4 * along
        alpha = _quadratic_minimum(a, b)
        old_cost = cost
        cost = cost + a * alpha**2 + b * alpha
        coupling = (coupling + alpha * (vertex - coupling)).tocsr()
        product = product + alpha * change
        delta = abs(cost - old_cost)
        if (cost != 0 and delta / abs(cost) < solver.tol_rel) or delta < solver.tol_abs:
            break
    return cost


def _quadratic_minimum(a: float, b: float) -> float:
    """argmin over [0, 1] of a x^2 + b x (POT's solve_1d_linesearch_quad)."""
    if a > 0:
        return min(1.0, max(0.0, -b / (2.0 * a)))
    return 1.0 if a + b < 0 else 0.0
