"""The streamed refinement of a deep network and its basis: exact Jacobians, the closed-form
Gauss–Newton block of the basis, and exact recovery of noiseless teachers from a start off the
teacher's subspace."""

from __future__ import annotations

import numpy as np
import pytest
from draws import Draw

from relulearn.api.execution import mapper
from relulearn.estimators.filtered_pca.deepstream import _jacobians, deep_sums, refine_deep
from relulearn.estimators.spectral.subspace_geometry import principal_angles
from relulearn.network import Network


def _teacher(d: int, widths: tuple[int, ...], seed: int) -> tuple[Network, np.ndarray, list[np.ndarray]]:
    """A deep bias-free ReLU teacher, the orthonormal basis of its first-layer rows and its network on
    that basis (``teacher(x) = g(Bᵀx)``)."""
    rng = np.random.default_rng(seed)
    dims = (d,) + widths + (1,)
    ws = [rng.standard_normal((dims[j + 1], dims[j])) * np.sqrt(2 / dims[j]) for j in range(len(dims) - 1)]
    basis = np.linalg.qr(ws[0].T)[0]
    return Network(tuple(ws), activation="relu"), basis, [ws[0] @ basis] + ws[1:]


def test_jacobians_match_finite_differences():
    rng = np.random.default_rng(0)
    ws = [rng.standard_normal((4, 3)), rng.standard_normal((5, 4)), rng.standard_normal((1, 5))]
    z = rng.standard_normal((50, 3))
    f, jac, dz = _jacobians(ws, z)
    shapes = [w.shape for w in ws]
    theta = np.concatenate([w.ravel() for w in ws])

    def g(t: np.ndarray, zz: np.ndarray = z) -> np.ndarray:
        parts, i = [], 0
        for s in shapes:
            parts.append(t[i : i + s[0] * s[1]].reshape(s))
            i += s[0] * s[1]
        return _jacobians(parts, zz)[0]

    h = 1e-6
    eye = np.eye(len(theta))
    num = np.stack([(g(theta + h * eye[i]) - g(theta - h * eye[i])) / (2 * h) for i in range(len(theta))], axis=1)
    num_z = np.stack(
        [(g(theta, z + h * np.eye(3)[c]) - g(theta, z - h * np.eye(3)[c])) / (2 * h) for c in range(3)], axis=1
    )
    assert np.allclose(f, Network(tuple(ws), activation="relu").forward(z)[:, 0], rtol=0, atol=1e-12)
    assert np.abs(num - jac).max() < 1e-7 and np.abs(num_z - dz).max() < 1e-7


def test_basis_block_of_the_gauss_newton_matrix_is_closed_form():
    """For Gaussian x and orthonormal B, E[(e ⊙ ∇g) x⊥ᵀ] is linear in the off-span perturbation Δ with
    matrix E[∇g ∇gᵀ] ⊗ (I − BBᵀ): the step from G and H recovers a small Δ of the teacher's basis."""
    d, widths = 30, (3, 4)
    teacher, basis, g = _teacher(d, widths, seed=3)
    rng = np.random.default_rng(4)
    delta = rng.standard_normal(basis.shape)
    delta -= basis @ (basis.T @ delta)
    delta *= 1e-4 / np.linalg.norm(delta)
    # the teacher acts through B + Δ: to first order its labels differ from g(Bᵀx) by (Δᵀx)·∇g
    bent = Network((g[0] @ (basis + delta).T,) + tuple(g[1:]), activation="relu")
    x = rng.standard_normal((400_000, d))
    s = deep_sums(x, bent.forward(x)[:, 0], g, basis)
    step = s.g @ np.linalg.inv(s.h)
    step -= basis @ (basis.T @ step)
    assert np.linalg.norm(step - delta) <= 0.05 * np.linalg.norm(delta)  # sampling error at n = 4e5


@pytest.mark.parametrize("d, widths, angle, seed", [(40, (3, 5), 0.2, 1), (40, (3, 5), 0.2, 4), (60, (4, 8), 0.3, 7)])
def test_noiseless_refinement_reaches_machine_precision_from_a_basis_off_the_teachers(d, widths, angle, seed):
    """Start: the teacher's network on a basis `angle` rad off its first-layer rows, every weight 5 %
    off. The refinement recovers the function and the subspace to rounding in a bounded number of passes."""
    teacher, basis, g = _teacher(d, widths, seed)
    rng = np.random.default_rng(seed + 100)
    e = rng.standard_normal(basis.shape)
    e -= basis @ (basis.T @ e)
    start_basis = np.cos(angle) * basis + np.sin(angle) * np.linalg.qr(e)[0]
    start = Network(tuple(w * (1 + 0.05 * rng.standard_normal(w.shape)) for w in g), activation="relu")
    net, found, report = refine_deep(
        start, start_basis, Draw(teacher, d), 100_000, mapper=mapper(None), part_rows=25_000
    )
    assert report["stop"] == "loss at rounding level" and report["passes"] <= 25, report["stop"]
    assert report["relative_loss"] < 1e-25
    assert principal_angles(basis, found).max() < 1e-10
    x = np.random.default_rng(9).standard_normal((20_000, d))
    y = teacher.forward(x)[:, 0]
    assert np.abs(net.forward(x @ found)[:, 0] - y).max() <= 1e-10 * np.abs(y).max()


def test_bad_start_is_refused():
    teacher, basis, g = _teacher(20, (2, 3), seed=0)
    with pytest.raises(ValueError, match="inputs but the basis has"):
        refine_deep(Network(tuple(g), activation="relu"), basis[:, :1], Draw(teacher, 20), 1000)
    with pytest.raises(ValueError, match="orthonormal"):
        refine_deep(Network(tuple(g), activation="relu"), 2 * basis, Draw(teacher, 20), 1000)
