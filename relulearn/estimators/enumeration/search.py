"""The multi-stage search of :func:`.enumeration.network.enumerate_network`: one global net planned for the run's
budget, the stages (scan, peaks refined on caps, moves each refitted and judged on held-out data) and the
pick of the answer among the candidate answers of every stage."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ... import progress
from ...network import Network
from ..base import BudgetError
from .moves import (
    _angles,
    _match_linear_part,
    _merge_close,
    _nearest_unit,
    _pick_centres,
    _significantly_better,
    _split_directions,
    _unmatched,
)
from .relu_units import Mapper, UnitFit, _predict, _score, fit_units, relative_loss
from .sphere_nets import _net_scale, _sphere_net_cached, cap_net

__all__ = ["EnumerationResult", "stage_cost"]

#: centres (well-separated peaks) refined and added per stage at most
MAX_CENTRES = 4
#: moves (refits) tried per stage at most
MAX_MOVES = 8
#: half-angle (radians) between the two children of a split unit
SPLIT_ANGLE = 0.1
#: local refinement stops once the cap radius is below this (radians); fit_units does the rest
FINEST_CAP = 0.01


def _min_net(r: int) -> int:
    """Smallest global net allowed (coarser nets miss peaks): ``4^r`` points."""
    return 2 if r == 1 else 4**r


def _max_net(r: int) -> int:
    """Largest global net worth scoring (finer resolution is left to the local caps)."""
    return 2 if r == 1 else 2 * 4 ** (r + 1)


def _cap_count(r: int) -> int:
    """Points per local cap: halving the cap radius needs about ``2^{r-1}`` times more."""
    return 1 if r == 1 else 4 * 2 ** (r - 1)


def _ladder(limit: int, r: int) -> int:
    """Largest net size ``≤ limit`` on a √2 ladder of even numbers (reused across runs)."""
    if r == 1:
        return 2
    best = _min_net(r)
    j = 0
    while True:
        c = 2 * int(round(2 ** (j / 2) * _min_net(r) / 2))
        if c > limit:
            return best
        best = c
        j += 1


def _levels(scale: float) -> int:
    """Local levels from radius ``2·scale`` halving down to ``FINEST_CAP``."""
    return max(1, int(math.ceil(math.log2(max(2.0 * scale / FINEST_CAP, 2.0)))))


def stage_cost(r: int, seed: int = 0) -> int:
    """Candidate evaluations of the cheapest stage in ``r`` dimensions (smallest net, one centre)."""
    if r == 1:
        return 2
    n = _min_net(r)
    return n + _levels(_net_scale(r, n, seed)) * _cap_count(r)


@dataclass(frozen=True)
class EnumerationResult:
    """The network found by :func:`.enumeration.network.enumerate_network`, in the subspace's coordinates.

    Attributes
    ----------
    directions
        ``(m, r)`` unit hidden directions ``a_i``.
    weights
        ``(m,)`` output weights ``λ_i``.
    heldout_loss
        Relative held-out loss ``mean((y − f)²)/mean(y²)`` on ``(z_val, y_val)``.
    train_loss
        Relative training loss on ``(z, y)``.
    stages
        One dict per stage: net size and covering radius (``scale``), centres found and
        refined, units after the refit, losses, candidates scored.
    candidates_evaluated
        Directions scored in total (bounded by the budget).
    merged
        Groups of units merged into one final unit because they could not be told apart:
        ``reason`` (``"close"``: two units within ``merge_angle`` whose merge did not
        worsen the held-out loss; ``"held-out"``: units of a larger candidate answer that the
        held-out loss did not justify), their ``directions`` and ``weights``, the
        ``merged_direction``, ``into`` (index of the final unit closest to it, ``-1`` when
        there is none) and ``angle_to_into``.
    models
        The candidate answers (at most ``k`` units) of every stage: units, held-out and
        training losses, stage, ``accepted`` (``False`` for the best rejected attempt of the
        last stage) and ``chosen``.
    stopped
        Why the search stopped.
    """

    directions: np.ndarray
    weights: np.ndarray
    heldout_loss: float
    train_loss: float
    stages: list[dict] = field(default_factory=list)
    candidates_evaluated: int = 0
    merged: list[dict] = field(default_factory=list)
    models: list[dict] = field(default_factory=list)
    stopped: str = ""

    @property
    def units(self) -> int:
        return int(len(self.weights))

    @property
    def output_weights(self) -> np.ndarray:
        """Alias of ``weights``."""
        return self.weights

    def network(self, basis: np.ndarray | None = None) -> Network:
        """The learned network; with ``basis`` (``d × r``, orthonormal columns) lifted to ``R^d``."""
        u = self.directions if basis is None else self.directions @ np.asarray(basis, dtype=np.float64).T
        return Network((u, self.weights[None, :]))

    def to_dict(self) -> dict:
        """Plain JSON-serialisable form."""
        return {
            "directions": self.directions.tolist(),
            "weights": self.weights.tolist(),
            "heldout_loss": self.heldout_loss,
            "train_loss": self.train_loss,
            "stages": self.stages,
            "candidates_evaluated": self.candidates_evaluated,
            "merged": self.merged,
            "models": self.models,
            "stopped": self.stopped,
        }


@dataclass(frozen=True)
class _Options:
    k: int
    budget: int
    batch: int
    seed: int
    score_samples: int
    k_max: int
    max_exchanges: int
    separation: float
    fraction: float
    merge_angle: float
    se_margin: float
    min_gain: float


Model = tuple[np.ndarray, np.ndarray]


def _answer(model: Model, heldout: float, train: float, stage: int, accepted: bool) -> dict:
    """A candidate answer as :attr:`EnumerationResult.models` lists it, with its ``_model`` (dropped there)."""
    return {
        "units": len(model[1]),
        "heldout_loss": heldout,
        "train_loss": train,
        "stage": stage,
        "accepted": accepted,
        "_model": model,
    }


class _Search:
    """State of one :func:`.enumeration.network.enumerate_network` run (driver side; only scoring is mapped)."""

    def __init__(self, z, y, z_val, y_val, mapper: Mapper, opts: _Options) -> None:
        self.z, self.y, self.z_val, self.y_val, self.mapper, self.o = z, y, z_val, y_val, mapper, opts
        r = self.r = z.shape[1]
        n_s = min(len(z), opts.score_samples)
        self.zs, self.ys = z[:n_s], y[:n_s]
        # plan: one global net for the whole run, sized so that k + 1 stages fit in the budget
        self.cap_n = _cap_count(r)
        # a stage costs at least a net of 4^r points and one local cap: refuse on that bound before building
        # the net (at r = 10 that net has 10^6 points, and building it would take hours)
        lower = 2 if r == 1 else _min_net(r) + _cap_count(r)
        one = stage_cost(r, opts.seed) if opts.budget >= lower or _min_net(r) <= 4**8 else lower
        if opts.budget < one:
            raise BudgetError(
                f"budget={opts.budget} candidate evaluations does not pay for one enumeration stage in r={r} "
                f"dimensions: a stage scores at least {one} directions (a net of {_min_net(r)} plus local "
                f"refinement of one peak); give budget >= {one} (>= {(opts.k + 1) * one} to allow k + 1 = "
                f"{opts.k + 1} stages)",
                one,
                (opts.k + 1) * one,
            )
        levels = _levels(_net_scale(r, _min_net(r), opts.seed)) if r > 1 else 0
        per_stage = opts.budget // (opts.k + 1) - levels * self.cap_n
        self.n_net = _ladder(min(max(per_stage, _min_net(r)), _max_net(r)), r)
        self.net = _sphere_net_cached(r, self.n_net, opts.seed)
        self.scale = _net_scale(r, self.n_net, opts.seed)
        self.levels = _levels(self.scale) if r > 1 else 0
        self.evaluated = 0

    # -------------------------------------------------------------- small tools
    def heldout(self, model: Model) -> float:
        return relative_loss(self.z_val, self.y_val, *model)

    def better(self, big: Model, small: Model) -> bool:
        return _significantly_better(self.z_val, self.y_val, big, small, self.o.se_margin, self.o.min_gain)

    def prune(self, model: Model, limit: int) -> Model:
        """Drop units one at a time — the one whose removal, after a refit on the scoring
        subsample, costs least — until at most ``limit`` remain."""
        a, lam = model
        while len(lam) > limit:
            linear = lam @ a  # twice the linear part E[y z] of the model: relu(t) = (t + |t|)/2
            drops = [[i] for i in range(len(lam))]
            if len(lam) - limit >= 2:  # a mirrored pair (±a, ∓λ) is a linear term: drop it whole
                ang = _angles(a, a)
                drops += [
                    [i, j]
                    for i in range(len(lam))
                    for j in range(i + 1, len(lam))
                    if ang[i, j] > math.pi - self.o.merge_angle
                ]
            best: UnitFit | None = None
            for drop in drops:
                rest = ~np.isin(np.arange(len(lam)), drop)
                starts = [a[rest]]
                flipped = _match_linear_part(a[rest], lam[rest], linear)
                if flipped is not None:
                    starts.append(flipped)
                for start in starts:
                    f = fit_units(self.zs, self.ys, start, lam[rest], max_iter=200)
                    if best is None or f.loss < best.loss:
                        best = f
            assert best is not None  # at least one drop (len(lam) > limit), each with a start
            a, lam = best.directions, best.weights
        return a, lam

    def full_fit(self, model: Model) -> Model:
        f = fit_units(self.z, self.y, *model, max_iter=100)
        return f.directions, f.weights

    def score(self, res: np.ndarray, cand: np.ndarray) -> np.ndarray:
        self.evaluated += len(cand)
        return _score(self.mapper, self.zs, res, cand, self.o.batch)

    # -------------------------------------------------------------- one stage
    def peaks(self, state: Model, want: int) -> tuple[np.ndarray, np.ndarray, float, float]:
        """Scan the residual over the net, take the well-separated peaks, refine them on caps.

        Returns the refined centres, their scores ``(reduction, λ)``, the squared residual
        and the best reduction of the global scan.
        """
        o = self.o
        res = self.ys - _predict(self.zs, *state)
        res_sq = float(res @ res)
        scores = self.score(res, np.asarray(self.net))
        red = scores[:, 0]
        best = float(red.max())
        if res_sq <= 1e-28 * float(self.ys @ self.ys) or best <= 1e-14 * res_sq:
            return np.zeros((0, self.r)), np.zeros((0, 2)), res_sq, best
        picked = _pick_centres(
            self.net,
            red,
            count=want,
            separation=o.separation,
            neighbourhood=min(2.5 * self.scale, o.separation),
            fraction=o.fraction,
        )
        centres = np.array(self.net[picked])
        cscore = scores[picked].copy()
        radius = 2.0 * self.scale  # caps of halving radius, all centres in one mapped call per level
        for level in range(self.levels):
            caps = [cap_net(c, radius, self.cap_n, seed=o.seed + level) for c in centres]
            sc = self.score(res, np.vstack(caps))
            for j in range(len(centres)):
                block = sc[j * self.cap_n : (j + 1) * self.cap_n]
                b = int(np.argmax(block[:, 0]))
                if block[b, 0] > cscore[j, 0]:
                    centres[j], cscore[j] = caps[j][b], block[b]
            radius /= 2.0
        keep: list[int] = []  # centres that refined onto each other count once
        for j in np.argsort(-cscore[:, 0], kind="stable"):
            if all(_angles(centres[j : j + 1], centres[i : i + 1])[0, 0] > o.separation / 2 for i in keep):
                keep.append(int(j))
        return centres[keep], cscore[keep], res_sq, best

    def moves(self, state: Model, centres: np.ndarray) -> list[tuple[str, np.ndarray, np.ndarray | None, int]]:
        """Starting points of the refits: add all centres, add each centre, split each unit
        whose splitting lowers the loss (most negative curvature first)."""
        a, lam = state
        out: list[tuple[str, np.ndarray, np.ndarray | None, int]] = []
        if len(centres):
            out.append(("add", np.vstack([a, centres]), None, len(centres)))
            if len(centres) > 1:
                out += [("add", np.vstack([a, centres[j : j + 1]]), None, 1) for j in range(len(centres))]
        c, s = math.cos(SPLIT_ANGLE), math.sin(SPLIT_ANGLE)
        for _, i, v in _split_directions(self.z, self.y, state):
            rest = np.arange(len(lam)) != i
            out.append(
                (
                    "split",
                    np.vstack([a[rest], c * a[i] + s * v, c * a[i] - s * v]),
                    np.r_[lam[rest], lam[i] / 2, lam[i] / 2],
                    1,
                )
            )
        return out[:MAX_MOVES]

    def scan(self, state: Model, stage: int, exchange: bool) -> tuple[dict[str, Any], np.ndarray]:
        """The peaks of one stage (as many centres as the budget affords, at most :data:`MAX_CENTRES`): the
        stage's record so far and the refined centres."""
        o = self.o
        m = len(state[1])
        afford = (o.budget - self.evaluated - self.n_net) // max(self.levels * self.cap_n, 1)
        want = max(1, min(MAX_CENTRES, max(o.k - m, 1), afford))
        centres, cscore, res_sq, best_red = self.peaks(state, want)
        record: dict[str, Any] = {
            "stage": stage,
            "kind": "exchange" if exchange else "growth",
            "net": self.n_net,
            "scale": self.scale,
            "levels": self.levels,
            "best_reduction": best_red / max(res_sq, 1e-300),
            "centres": centres.tolist(),
            "centre_weights": cscore[:, 1].tolist(),
            "centre_reductions": (cscore[:, 0] / max(res_sq, 1e-300)).tolist(),
        }
        return record, centres

    def try_moves(
        self, state: Model, centres: np.ndarray
    ) -> tuple[tuple[str, int, Model, list[dict]] | None, tuple[float, Model] | None, list[str]]:
        """Refit the moves in order: the first that lowers the held-out loss significantly ``(kind, added, model,
        merges)`` or None, the best rejected model larger than ``state`` and of at most k units ``(held-out loss,
        model)`` or None, and the kinds of move tried."""
        o = self.o
        m = len(state[1])
        moves = self.moves(state, centres) if len(centres) else []
        accepted = None
        rejected: tuple[float, Model] | None = None
        tried: list[str] = []
        for kind, start, start_w, added in moves:
            tried.append(kind)
            # screen on the scoring subsample; refit on all samples only what passes
            fit = fit_units(self.zs, self.ys, start, start_w, max_iter=200)
            pre = self.prune((fit.directions, fit.weights), o.k_max)
            model, merges = _merge_close(
                self.zs, self.ys, self.z_val, self.y_val, pre, o.merge_angle, o.se_margin, o.min_gain
            )
            if self.better(model, state):
                model = self.full_fit(model)
                if self.better(model, state):
                    accepted = (kind, added, model, merges)
                    break
            h_pre = self.heldout(pre)
            if len(pre[1]) > m and len(pre[1]) <= o.k and (rejected is None or h_pre < rejected[0]):
                rejected = (h_pre, pre)
        return accepted, rejected, tried

    # -------------------------------------------------------------- the search
    def run(self) -> EnumerationResult:
        o = self.o
        empty: Model = (np.zeros((0, self.r)), np.zeros(0))
        state = empty
        answers: list[dict] = [_answer(empty, 1.0, 1.0, 0, True)]
        stages: list[dict] = []
        merged: list[dict] = []
        exchanges, stage, stopped = 0, 0, ""
        stage_min = self.n_net + self.levels * self.cap_n
        while True:
            m = len(state[1])
            if m >= o.k_max and exchanges >= o.max_exchanges:
                stopped = f"holding k + extra = {o.k_max} units after {exchanges} exchange stages"
                break
            if o.budget - self.evaluated < stage_min:
                stopped = f"budget exhausted ({self.evaluated} of {o.budget} candidate evaluations used)"
                break
            stage += 1
            progress.step(
                "enumeration: stages",
                stage,
                None,
                f"{m} units, {self.evaluated:,} of {o.budget:,} candidate evaluations",
            )
            exchange = m >= o.k_max
            exchanges += exchange
            before = self.evaluated
            record, centres = self.scan(state, stage, exchange)
            accepted, rejected, tried = self.try_moves(state, centres)
            record |= {"candidates": self.evaluated - before, "moves_tried": tried}
            if accepted is None:
                stopped = "residual explained" if not len(centres) else "no held-out improvement"
                stages.append(
                    record
                    | {
                        "added": 0,
                        "units": m,
                        "heldout_loss": self.heldout(state),
                        "train_loss": relative_loss(self.z, self.y, *state),
                    }
                )
                if rejected is not None:
                    h_rejected, model = rejected
                    answers.append(_answer(model, h_rejected, relative_loss(self.z, self.y, *model), stage, False))
                break
            kind, added, state, merges = accepted
            merged.extend(g | {"stage": stage} for g in merges)
            answer = state if len(state[1]) <= o.k else self.full_fit(self.prune(state, o.k))
            h, train = self.heldout(answer), relative_loss(self.z, self.y, *answer)
            stages.append(
                record
                | {
                    "move": kind,
                    "added": added,
                    "units": len(state[1]),
                    "heldout_loss": self.heldout(state),
                    "answer_units": len(answer[1]),
                    "answer_heldout_loss": h,
                }
            )
            answers.append(_answer(answer, h, train, stage, True))
            if train <= 1e-28:
                stopped = "exact fit"
                break
        return self.finish(answers, stages, merged, stopped)

    def finish(self, answers: list[dict], stages: list[dict], merged: list[dict], stopped: str) -> EnumerationResult:
        """Pick the answer: lowest held-out loss, a smaller model winning unless significantly worse."""
        ok = [i for i, a in enumerate(answers) if a["accepted"]]
        best = min(ok, key=lambda i: (answers[i]["heldout_loss"], answers[i]["units"]))
        chosen = best
        for i in sorted(ok, key=lambda i: (answers[i]["units"], i)):
            if answers[i]["units"] >= answers[best]["units"]:
                break
            if not self.better(answers[best]["_model"], answers[i]["_model"]):
                chosen = i
                break
        final = answers[chosen]["_model"]
        # units of a larger candidate answer (accepted, or the last rejected attempt) that the
        # held-out loss did not justify
        largest = max(answers, key=lambda a: (a["units"], a["stage"]))
        if largest["units"] > len(final[1]):
            merged.extend(_unmatched(largest["_model"], final, stage=largest["stage"]))
        for g in merged:
            g["into"] = _nearest_unit(np.array(g["merged_direction"]), final[0])
            g["angle_to_into"] = (
                float(_angles(np.array(g["merged_direction"])[None], final[0][g["into"]][None])[0, 0])
                if g["into"] >= 0
                else None
            )
        return EnumerationResult(
            directions=final[0],
            weights=final[1],
            heldout_loss=self.heldout(final),
            train_loss=relative_loss(self.z, self.y, *final),
            stages=stages,
            candidates_evaluated=self.evaluated,
            merged=merged,
            models=[
                {k_: v for k_, v in a.items() if k_ != "_model"} | {"chosen": i == chosen}
                for i, a in enumerate(answers)
            ],
            stopped=stopped,
        )
