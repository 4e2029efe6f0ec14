"""Draw the figures of the method pages: each method fitted on an example (as the example's comment runs it),
then the figures ``relulearn report`` draws for that store, saved as PNG in ``_static/figures`` with a page
fragment ``methods/figures/<method>.md`` that the method's page includes.

Run from the repository's top (about 4 minutes on 2 cores; needs the ``report`` extra)::

    python docs/make_figures.py [METHOD ...]

The figures are committed: the documentation build does not fit anything.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

DOCS = Path(__file__).resolve().parent
ROOT = DOCS.parent
#: method -> (example configuration, fit options)
RUNS = {
    "moments": ("small.yaml", {}),
    "tensor": ("small.yaml", {}),
    "exact": ("two_layer.yaml", {}),
    "landscape": ("landscape.yaml", {}),
    "polynomial": ("polynomial.yaml", {}),
    "filtered-pca": ("deep.yaml", {"depth": 3, "width": 8, "refine_samples": 0}),
}


def draw(method: str, folder: Path) -> None:
    from relulearn import api
    from relulearn.config import load_config
    from relulearn.network import Network
    from relulearn.pipeline.sources import TeacherSource, make_source
    from relulearn.polynomial import load_model
    from relulearn.report import report_figures

    example, options = RUNS[method]
    config_path = ROOT / "examples" / example
    cfg = load_config(str(config_path))
    store, out = str(folder / f"{method}.zarr"), str(folder / f"{method}.npz")
    api.fit(cfg, store, method, out=out, progress=None, **options)
    source = make_source(cfg)
    teacher = source.network if isinstance(source, TeacherSource) else None
    model = load_model(out)
    figures = [
        f for f in report_figures(store, model=model if isinstance(model, Network) else None, teacher=teacher) if f.png
    ]
    lines = [
        f"Figures of `relulearn report` for `examples/{example}` fitted with `--method {method}`"
        " (drawn by `docs/make_figures.py`):",
        "",
    ]
    for f in figures:
        name = f"{method}-{f.name}.png"
        (DOCS / "_static" / "figures" / name).write_bytes(f.png)
        lines += [
            f"```{{figure}} /_static/figures/{name}",
            f":alt: {f.title}",
            "",
            f"**{f.title}.** {f.caption}",
            "```",
            "",
        ]
    (DOCS / "methods" / "figures" / f"{method}.md").write_text("\n".join(lines))


if __name__ == "__main__":
    with tempfile.TemporaryDirectory() as tmp:
        for method in sys.argv[1:] or list(RUNS):
            draw(method, Path(tmp))
            print(method, "drawn")
