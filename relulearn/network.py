"""Network: layered weights, forward pass, and the .npz file format (docs/design.md §5).

A network file holds arrays ``W0, W1, ..., WL`` (layer j maps ``dim_j -> dim_{j+1}``
and has shape ``(dim_{j+1}, dim_j)``; the last is the linear output layer), optional
biases ``b0, ..., bL`` and a string ``activation`` (default ``relu``).
"""

from __future__ import annotations

import hashlib
import io
import re
import zipfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import numpy as np

from .atomic import is_remote, local_path, read_bytes, save_npz
from .filekind import not_a_file
from .npyfile import ArrayHeaderError, load_npz

__all__ = [
    "Network",
    "NetworkFileError",
    "ACTIVATIONS",
    "RELU_POWERS",
    "compare",
    "compare_two_layer",
    "input_gradients",
    "gradient_subspace",
    "subspace_angle",
]


def _relu(h: np.ndarray) -> np.ndarray:
    return np.maximum(h, 0.0, out=h)


def _sigmoid(h: np.ndarray) -> np.ndarray:
    return 0.5 * (1.0 + np.tanh(0.5 * h))


def _relu_power(c: int) -> Callable[[np.ndarray], np.ndarray]:
    def act(h: np.ndarray) -> np.ndarray:
        np.maximum(h, 0.0, out=h)
        return h**c

    act.__name__ = f"relu{c}"
    return act


def _erf(h: np.ndarray) -> np.ndarray:
    from scipy.special import erf

    return erf(h)


def _softplus(h: np.ndarray) -> np.ndarray:
    return np.logaddexp(0.0, h)


def _erf_relu(h: np.ndarray) -> np.ndarray:
    """``∫_0^z (erf(t) + 1) dt = z erf(z) + (exp(−z²) − 1)/√π + z``: a smooth ReLU-like activation
    (derivative ``erf + 1`` in (0, 2); ``≈ 2z`` for large z, ``→ −1/√π`` for z → −∞)."""
    from scipy.special import erfc

    # z (erf(z) + 1) = z erfc(−z): no cancellation for z → −∞
    return h * erfc(-h) + np.expm1(-(h * h)) / np.sqrt(np.pi)


ACTIVATIONS: dict[str, Callable[[np.ndarray], np.ndarray]] = {
    "relu": _relu,
    "relu2": _relu_power(2),
    "relu3": _relu_power(3),
    "erf": _erf,
    "erf_relu": _erf_relu,
    "tanh": np.tanh,
    "softplus": _softplus,
    "sigmoid": _sigmoid,
    "identity": lambda h: h,
}

#: activations ``f(z) = max(z, 0)^c``: the power ``c`` (positive homogeneous of degree c)
RELU_POWERS: dict[str, int] = {"relu": 1, "relu2": 2, "relu3": 3}


class NetworkFileError(ValueError):
    """A network file or weight list that does not describe a network."""


#: file suffixes of pickled models (scikit-learn's joblib, PyTorch's torch.save): refused by name
PICKLE_SUFFIXES = frozenset({".pkl", ".pickle", ".joblib", ".pt", ".pth", ".sav"})


def _is_pickle(head: bytes) -> bool:
    """Whether a file starting with ``head`` is a pickle of protocol 2 or later (``\\x80`` and the protocol)."""
    return len(head) >= 2 and head[0] == 0x80 and 2 <= head[1] <= 5


def _head(path: Path) -> bytes:
    with open(path, "rb") as f:
        return f.read(4)


def read_arrays(path: str | Path, kind: str, holds: str) -> dict[str, np.ndarray]:
    """The arrays of an ``.npz`` model file (no pickle) at a path or a URL (``file://``, ``s3://``, ...), or an
    error naming the file and what is wrong (``kind`` and ``holds`` describe the file expected, e.g.
    ``"network"``, ``"W0..WL"``)."""
    remote = is_remote(path)
    name = str(path)
    found = not_a_file(path)  # never opened when a folder or a device: /dev/zero would be read for ever
    if found is not None:
        raise NetworkFileError(f"{kind} file {name} {found}; give an .npz {kind} file ({holds}; np.savez)")
    try:
        if remote:  # the whole object in one read; np.load reads an archive from memory as from a file
            data: bytes | None = read_bytes(path)
            source: Any = io.BytesIO(cast(bytes, data))
        else:
            source = local_path(path)
            data = _head(source) if source.is_file() else None
    except FileNotFoundError:
        raise NetworkFileError(f"{kind} file {name} does not exist") from None
    except OSError as err:
        raise NetworkFileError(f"{name} is not a readable .npz {kind} file: {err}") from None
    if Path(name).suffix.lower() in PICKLE_SUFFIXES or (data is not None and _is_pickle(data)):
        raise NetworkFileError(
            f"{name} is a pickle (or joblib / torch.save) file; relulearn never loads pickles, which run code when "
            f"loaded. Export the model to ONNX and give source.teacher.onnx (scikit-learn: skl2onnx.to_onnx; "
            f"PyTorch: torch.onnx.export), save its weights as an .npz {kind} file ({holds}; np.savez), or serve it "
            "as a function of a batch x through source.teacher.callable ('package.module:function')"
        )
    if data is not None and not zipfile.is_zipfile(source):  # np.load would call it "pickled data"
        raise NetworkFileError(f"{name} is not an .npz {kind} file (not a zip archive of arrays {holds})")
    if remote:
        source.seek(0)
    try:
        return load_npz(source, name)  # every member's header and size checked before it is inflated
    except ArrayHeaderError as err:
        raise NetworkFileError(f"{kind} file {err}") from None
    except FileNotFoundError:
        raise NetworkFileError(f"{kind} file {name} does not exist") from None
    except (OSError, ValueError, EOFError, zipfile.BadZipFile) as err:
        raise NetworkFileError(f"{name} is not a readable .npz {kind} file: {err}") from None


def _real(values: Any, name: str, where: str) -> np.ndarray:
    """``values`` as float64, refusing what is not real numbers: numpy would drop a complex array's imaginary
    parts with only a warning, and read an array of strings such as ``"1"`` as numbers."""
    arr = np.asarray(values)
    if arr.dtype.kind not in "biuf":
        raise NetworkFileError(
            f"{where}: {name} holds {arr.dtype} values; weights and biases are real numbers: save a float array "
            f"(e.g. {name}.real if its imaginary parts are zero)"
        )
    return np.asarray(arr, dtype=np.float64)


@dataclass(frozen=True)
class Network:
    """A feed-forward network ``W_L act(... act(W_0 x + b_0) ...) + b_L``.

    Parameters
    ----------
    weights
        ``W0..WL``; ``weights[j]`` has shape ``(dim_{j+1}, dim_j)``.
    biases
        ``b0..bL`` or ``None`` for a bias-free network.
    activation
        Name of the hidden activation: ``relu``, ``relu2``, ``relu3`` (``max(z, 0)^c``),
        ``erf``, ``tanh``, ``softplus``, ``sigmoid``, ``identity``.
    """

    weights: tuple[np.ndarray, ...]
    biases: tuple[np.ndarray, ...] | None = None
    activation: str = "relu"
    _origin: str = field(default="network", compare=False, repr=False)

    def __post_init__(self) -> None:
        where = self._origin
        if len(self.weights) < 1:
            raise NetworkFileError(f"{where}: a network needs at least one weight matrix W0")
        if self.activation not in ACTIVATIONS:
            raise NetworkFileError(f"{where}: unknown activation {self.activation!r}; use one of {sorted(ACTIVATIONS)}")
        ws = tuple(_real(w, f"W{j}", where) for j, w in enumerate(self.weights))
        for j, w in enumerate(ws):
            if w.ndim != 2:
                raise NetworkFileError(f"{where}: W{j} must be a 2-d matrix, got shape {w.shape}")
            if j > 0 and w.shape[1] != ws[j - 1].shape[0]:
                raise NetworkFileError(
                    f"{where}: W{j} has shape {w.shape} but W{j - 1} has shape {ws[j - 1].shape}: "
                    f"W{j} must have {ws[j - 1].shape[0]} columns (layer j maps dim_j -> dim_(j+1))"
                )
            if not np.all(np.isfinite(w)):
                raise NetworkFileError(f"{where}: W{j} contains NaN or inf")
        object.__setattr__(self, "weights", ws)
        if self.biases is not None:
            bs = tuple(_real(b, f"b{j}", where) for j, b in enumerate(self.biases))
            if len(bs) != len(ws):
                raise NetworkFileError(f"{where}: {len(bs)} biases for {len(ws)} layers; give b0..b{len(ws) - 1}")
            for j, (b, w) in enumerate(zip(bs, ws)):
                if b.shape != (w.shape[0],):
                    raise NetworkFileError(f"{where}: b{j} has shape {b.shape}, expected ({w.shape[0]},)")
                if not np.all(np.isfinite(b)):
                    raise NetworkFileError(f"{where}: b{j} contains NaN or inf")
            object.__setattr__(self, "biases", bs)

    # ------------------------------------------------------------------ shape
    @property
    def input_dim(self) -> int:
        return int(self.weights[0].shape[1])

    @property
    def output_dim(self) -> int:
        return int(self.weights[-1].shape[0])

    @property
    def depth(self) -> int:
        """Number of hidden layers."""
        return len(self.weights) - 1

    # ---------------------------------------------------------------- forward
    def forward(self, x: np.ndarray) -> np.ndarray:
        """Outputs for a batch ``x`` of shape ``(n, d)``; returns ``(n, output_dim)``."""
        act = ACTIVATIONS[self.activation]
        h = np.asarray(x, dtype=np.float64)
        last = len(self.weights) - 1
        for j, w in enumerate(self.weights):
            h = h @ w.T
            if self.biases is not None:
                h += self.biases[j]
            if j < last:
                h = act(h)
        return h

    __call__ = forward

    # ---------------------------------------------------------------- files
    def to_arrays(self) -> dict[str, np.ndarray]:
        out: dict[str, np.ndarray] = {f"W{j}": w for j, w in enumerate(self.weights)}
        if self.biases is not None:
            out.update({f"b{j}": b for j, b in enumerate(self.biases)})
        out["activation"] = np.array(self.activation)
        return out

    def save(self, path: str | Path) -> None:
        """Write the network as an ``.npz`` file (no pickled objects) at a path or a URL, atomically."""
        save_npz(path, self.to_arrays())

    @classmethod
    def load(cls, path: str | Path) -> Network:
        """Read a network file (a path or a URL), checking that its shapes chain and its values are finite."""
        return cls.from_arrays(read_arrays(path, "network", "W0..WL"), origin=str(path))

    @classmethod
    def from_arrays(cls, arrays: dict[str, np.ndarray], origin: str = "network") -> Network:
        names = set(arrays)
        if "kind" in names and str(arrays["kind"]) != "network":
            raise NetworkFileError(
                f"{origin} is a {arrays['kind']} model, not a network; read it with "
                "relulearn.load_model (predict and evaluate take either kind)"
            )
        w_idx = sorted(int(m.group(1)) for k in names if (m := re.fullmatch(r"W(\d+)", k)))
        b_idx = sorted(int(m.group(1)) for k in names if (m := re.fullmatch(r"b(\d+)", k)))
        unknown = names - {f"W{j}" for j in w_idx} - {f"b{j}" for j in b_idx} - {"activation"}
        if unknown:
            raise NetworkFileError(
                f"{origin}: unexpected arrays {sorted(unknown)}; a network file holds W0..WL, b0..bL, activation"
            )
        if not w_idx or w_idx != list(range(len(w_idx))):
            raise NetworkFileError(
                f"{origin}: weight arrays must be W0, W1, ..., WL without gaps; found {sorted(names)}"
            )
        if b_idx and b_idx != w_idx:
            raise NetworkFileError(f"{origin}: biases must be b0..b{len(w_idx) - 1} when present; found b{b_idx}")
        act = str(arrays["activation"]) if "activation" in arrays else "relu"
        ws = tuple(arrays[f"W{j}"] for j in w_idx)
        bs = tuple(arrays[f"b{j}"] for j in b_idx) if b_idx else None
        return cls(ws, bs, act, _origin=origin)

    def fingerprint(self) -> str:
        """SHA-256 of the weights' bytes and the activation (identifies a teacher)."""
        h = hashlib.sha256(self.activation.encode())
        for name, arr in sorted(self.to_arrays().items()):
            if name != "activation":
                h.update(name.encode())
                h.update(np.ascontiguousarray(arr, dtype=np.float64).tobytes())
        return h.hexdigest()


# ------------------------------------------------------------------ comparison


@dataclass(frozen=True)
class Comparison:
    """How far a learned one-hidden-layer network is from a reference, up to symmetries.

    Attributes
    ----------
    relative_error
        ``sqrt(Σ_i |w_i − w'_π(i)|² + (c − c')²) / sqrt(Σ_i |w_i|² + c²)`` over the matched units, where
        ``w_i = λ_i [u_i, b_i]`` (hidden bias ``b_i``, output bias ``c``; zeros without biases) is invariant
        under positive rescaling; a unit matched to one whose output weight has the other sign (a different
        function) counts as unmatched.
    matching
        ``matching[i]`` is the learned unit matched to reference unit ``i`` (−1: none).
    unit_errors
        Per reference unit, ``|w_i − w'_π(i)| / |w_i|``.
    """

    relative_error: float
    matching: tuple[int, ...]
    unit_errors: tuple[float, ...]


def _unit_products(net: Network) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per hidden unit the products ``λ_ji [u_i, b_i]`` of its output weights and its row (``b_i = 0`` without
    biases), flattened over the m outputs; the rows ``[u_i, b_i]`` (their orientation tells ``relu(s)`` from
    ``relu(−s)``, which the products cannot); and the output biases ``c`` (zeros without biases). The products
    are invariant under the rescaling ``(λ, u, b) -> (λ s, u / s, b / s)``."""
    if net.depth != 1 or net.activation != "relu":
        raise ValueError(
            "symmetry-aware comparison is defined for one-hidden-layer ReLU networks; compare other networks by "
            "their test error"
        )
    u, lam = net.weights[0], net.weights[1]
    if net.biases is None:
        b, c = np.zeros(len(u)), np.zeros(lam.shape[0])
    else:
        b, c = net.biases[0], np.asarray(net.biases[1], dtype=np.float64)
    rows = np.column_stack([u, b])
    return (lam.T[:, :, None] * rows[:, None, :]).reshape(len(u), -1), rows, c


def compare(reference: Network, learned: Network) -> Comparison:
    """Match the hidden units of two one-hidden-layer ReLU networks (Hungarian algorithm), any number of outputs.

    The products ``λ_ji [u_i, b_i]`` identify a unit up to the network's symmetries (permutation
    of units, positive rescaling ``(λ, u) -> (λ s, u / s)``); a unit is only matched to one
    whose row points the same way (for one output: whose output weight has the same sign).
    """
    from scipy.optimize import linear_sum_assignment

    w, rw, c_ref = _unit_products(reference)
    v, rv, c_learned = _unit_products(learned)
    if rw.shape[1] != rv.shape[1] or w.shape[1] != v.shape[1]:
        raise ValueError(
            f"shapes differ: {reference.input_dim}→{reference.output_dim} inputs→outputs vs "
            f"{learned.input_dim}→{learned.output_dim}"
        )
    k, m = len(w), len(v)
    n = max(k, m)
    # pad with zero units: matching a unit to a padding unit costs its whole norm
    wp, vp = np.zeros((n, w.shape[1])), np.zeros((n, v.shape[1]))
    wp[:k], vp[:m] = w, v
    same = np.ones((n, n), dtype=bool)
    same[:k, :m] = (rw @ rv.T) > 0
    diff = ((wp[:, None, :] - vp[None, :, :]) ** 2).sum(-1)
    apart = (wp**2).sum(1)[:, None] + (vp**2).sum(1)[None, :]
    cost = np.where(same, diff, apart)
    rows, cols = linear_sum_assignment(cost)
    total = float(cost[rows, cols].sum())
    total += float(np.sum((c_ref - c_learned) ** 2))  # the output biases (0 for bias-free networks)
    norm = float((w**2).sum()) + float(np.sum(c_ref**2))
    matching = [-1] * k
    errors = [1.0] * k
    for r, c in zip(rows, cols):
        if r < k:
            matching[r] = int(c) if c < m and cost[r, c] == diff[r, c] else -1
            errors[r] = float(np.sqrt(cost[r, c]) / max(np.linalg.norm(w[r]), 1e-300))
    return Comparison(
        float(np.sqrt(total / norm)) if norm > 0 else float(np.sqrt(total)), tuple(matching), tuple(errors)
    )


def compare_two_layer(reference: Network, learned: Network) -> Comparison:
    """Match the units of two networks ``U f(V x)`` with ``f(z) = max(z, 0)^c`` (any number of outputs).

    ``f`` is positively homogeneous of degree ``c``, so ``(u_i, v_i) -> (u_i s^{-c}, s v_i)``
    (``s > 0``) and permutations of the units leave the network unchanged. Each unit is put in
    the canonical form ``(|v_i|^c u_i, v_i / |v_i|)`` and units are matched by the Hungarian
    algorithm on the squared distance of these pairs; ``relative_error`` is
    ``sqrt(Σ_i |ν_i − ν'_π(i)|² + |ũ_i − ũ'_π(i)|²) / sqrt(Σ_i |ν_i|² + |ũ_i|²)`` (unmatched
    units count their whole norm), ``unit_errors`` the same per reference unit.
    """
    from scipy.optimize import linear_sum_assignment

    def canonical(net: Network, what: str) -> np.ndarray:
        if net.depth != 1 or net.biases is not None or net.activation not in RELU_POWERS:
            raise ValueError(
                f"the {what} is not a bias-free two-layer network with activation relu, relu2 or relu3 "
                f"(depth {net.depth}, activation {net.activation!r}); compare such networks by their test error"
            )
        v, u = net.weights
        norms = np.linalg.norm(v, axis=1)
        alive = norms > 0
        nu = np.where(alive[:, None], v / np.where(alive, norms, 1.0)[:, None], 0.0)
        return np.concatenate([nu * alive[:, None], u.T * (norms ** RELU_POWERS[net.activation])[:, None]], axis=1)

    a, b = canonical(reference, "reference"), canonical(learned, "learned network")
    if reference.activation != learned.activation:
        raise ValueError(f"activations differ: {reference.activation} vs {learned.activation}")
    if reference.input_dim != learned.input_dim or reference.output_dim != learned.output_dim:
        raise ValueError(
            f"shapes differ: {reference.input_dim}→{reference.output_dim} inputs→outputs vs "
            f"{learned.input_dim}→{learned.output_dim}"
        )
    k, m = len(a), len(b)
    n = max(k, m)
    ap, bp = np.zeros((n, a.shape[1])), np.zeros((n, b.shape[1]))
    ap[:k], bp[:m] = a, b
    cost = ((ap[:, None, :] - bp[None, :, :]) ** 2).sum(-1)
    rows, cols = linear_sum_assignment(cost)
    matching, errors = [-1] * k, [1.0] * k
    for r, c in zip(rows, cols):
        if r < k:
            matching[r] = int(c) if c < m else -1
            errors[r] = float(np.sqrt(cost[r, c]) / max(np.linalg.norm(a[r]), 1e-300))
    norm = float((a**2).sum())
    total = float(cost[rows, cols].sum())
    return Comparison(
        float(np.sqrt(total / norm)) if norm > 0 else float(np.sqrt(total)), tuple(matching), tuple(errors)
    )


def input_gradients(net: Network, x: np.ndarray, output: int = 0) -> np.ndarray:
    """Gradients ``∇_x f(x)`` of one output of a ReLU network at the rows of ``x``, shape (n, d).

    Vectorized back-propagation through the activation patterns (the gradient of ``relu``
    at 0 is taken as 0).
    """
    return _first_layer_gradients(net, x, output) @ net.weights[0]


def _first_layer_gradients(net: Network, x: np.ndarray, output: int = 0) -> np.ndarray:
    """``∂f/∂(W_0 x)`` at the rows of ``x``, shape (n, k_0): ``∇_x f = (∂f/∂(W_0 x)) W_0``."""
    if net.activation != "relu":
        raise ValueError(f"input gradients are implemented for relu networks, not {net.activation!r}")
    masks, h = [], x
    for j, w in enumerate(net.weights[:-1]):
        h = h @ w.T + (net.biases[j] if net.biases is not None else 0.0)
        masks.append(h > 0)
        h = np.maximum(h, 0.0)
    g = np.broadcast_to(net.weights[-1][output], (x.shape[0], net.weights[-1].shape[1]))
    for w, mask in zip(net.weights[-2:0:-1], masks[:0:-1]):
        g = (g * mask) @ w
    return g * masks[0]


def gradient_subspace(net: Network, x: np.ndarray, rank: int, output: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """The ``rank``-dimensional subspace a network's output depends on most, from samples.

    The top eigenvectors of the average gradient outer product ``E[∇f ∇fᵀ]`` over the rows
    of ``x``: for ``f(x) = g(Ux)`` its range is the row space of ``U`` that ``g`` really
    uses, whatever the parametrization (extra first-layer rows with tiny effect count
    little). Returns the ``(d, rank)`` basis and all eigenvalues, descending.
    """
    w0 = net.weights[0]
    k0, d = w0.shape
    if rank > k0 or k0 >= d:
        g = input_gradients(net, x, output)
        w, v = np.linalg.eigh(g.T @ g / len(x))
        order = np.argsort(w)[::-1]
        return v[:, order[:rank]], w[order]
    # ∇f = δ W_0 = (δ Rᵀ) Qᵀ with W_0ᵀ = Q R: the k_0 × k_0 problem, not d × d (800 MB and minutes of eigh
    # at d = 10^4); the other d − k_0 eigenvalues are zero
    q, r = np.linalg.qr(w0.T)
    c = _first_layer_gradients(net, x, output) @ r.T
    w, v = np.linalg.eigh(c.T @ c / len(x))
    order = np.argsort(w)[::-1]
    return q @ v[:, order[:rank]], np.concatenate([w[order], np.zeros(d - k0)])


def subspace_angle(reference: Network, learned: Network, x: np.ndarray, *, rtol: float = 1e-9) -> float:
    """Largest principal angle (radians) between the subspace ``reference`` depends on (the
    row space of its first layer, of rank ``k``) and the top-``k`` subspace of ``learned``
    (:func:`gradient_subspace` on the samples ``x``).

    ``π/2`` when the learned network depends on fewer than ``k`` directions.
    """
    from scipy.linalg import subspace_angles

    _, s, vt = np.linalg.svd(reference.weights[0], full_matrices=False)
    a = vt[s > rtol * s[0]].T
    if a.shape[0] != learned.input_dim:
        raise ValueError(f"input dimensions differ: {a.shape[0]} vs {learned.input_dim}")
    b, eig = gradient_subspace(learned, x, a.shape[1])
    if eig[a.shape[1] - 1] <= rtol * max(eig[0], 1e-300):
        return float(np.pi / 2)
    return float(np.max(subspace_angles(a, b)))
