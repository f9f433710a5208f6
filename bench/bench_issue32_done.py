"""Issue 32's "Done when", re-measured through the product's default path.

    python -m bench.bench_issue32_done [--seeds 10] [--parts a b c d e]

Every release here is what a user gets without setting anything: the Python client's
``PrivatePCA(client, dataset, n_components=k, epsilon=eps)`` (mechanism ``None``: the
service's default, ``auto`` with ``center: "private"``; no delta: the service's default delta),
against the real app in this process (``TestClient``, a fresh SQLite database, the product's
settings with the default accounting set explicitly to ``hybrid``, the product default; the
test suite's conftest sets ``basic``). The worker runs in this process where the client would
sleep. Each release gets a seeded generator (``seed``) instead of the OS-keyed one, so a run can
be repeated; nothing else is changed.

Each owner's upload: ``epsilon_budget`` large enough for the releases of that dataset,
``delta_budget`` ``1e-4`` (``--delta-budget``; the default delta is then
``min(1e-6, delta_budget / 100) = 1e-6``),
``row_norm_bound`` 1 (unit rows).

Parts (each printed against its goal, mean, sd and range over the seeds):

- ``a``: digits, a fresh 75% train split per seed (1,347 x 64, unit rows), k 10, eps 1: the
  share of the split's centred variance the released basis keeps (goal >= 0.48).
- ``b``: MNIST (the 5,000-image sample of :mod:`bench.mnist`, unit rows), a fresh split per
  seed, 4,000 private rows x 784, k 10, eps 1, ``prior=`` the top 64 centred principal
  directions of the other 1,000 rows (goal >= 0.35), or the 64 lowest-frequency 2-D DCT
  components (goal >= 0.28).
- ``c``: without a prior, the default against ``PrivatePCA(..., mechanism="analyze_gauss")``
  (its own defaults) on MNIST 4,000 x 784 and power-law rows 4,000 x 1,000
  (:func:`bench.bench_highdim.power_law`), same split and seed (goal ratio >= 1.5).
- ``d``: item 4's point estimate: ``sum(explained_variance_ratio_)`` against the kept share per
  cell (digits, breast_cancer, MNIST; eps 1 and 0.3; k 2 and 10): mean error over the releases
  that state a share (goal |.| <= 0.05 where the mean interval width is < 0.3; a release whose
  noise hides the share states none), coverage of the 90% interval (goal >= 0.9).
- ``e``: item 4's forecast: the dry run (``preview_release`` with the request ``PrivatePCA``
  sends), with and without ``?forecast_from=`` an earlier release of the same request (another
  seed), against what the release then keeps (goal: within 0.1). The release's own spread
  (mean |kept - median kept|) is printed beside it: no point forecast of one fresh release
  beats it on average.
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
from fastapi.testclient import TestClient
from sklearn.datasets import load_breast_cancer, load_digits  # type: ignore[import-untyped]

import dpss_client.client as client_module
import dpss_client.handles as handles_module
from bench.bench_highdim import power_law
from bench.mnist import dct_prior, mnist_split, unit_rows
from dpss_client import Client, PrivatePCA
from service import auth
from service import oneshot as oneshot_module
from service.app import create_app
from service.config import Settings
from service.db.engine import make_engine, make_session_factory
from service.migrate import upgrade_to_head
from service.store import DatasetStore
from service.worker import Worker

Array = np.ndarray[Any, Any]
PRIOR_M = 64
#: Each upload's delta budget (``--delta-budget``): the default delta is ``min(1e-6, it / 100)``.
DELTA_BUDGET = ["1e-4"]
#: Every seed's figure of parts a-c: (part, data, setting, seed, kept), for ``--csv``.
SEED_ROWS: list[tuple[str, str, str, int, float]] = []


def kept(rows: Array, basis: Array) -> float:
    """The share of the rows' centred variance (rows clipped to 1, centred on their true mean)
    that ``basis`` (d x k, orthonormal columns) keeps."""
    norms = np.linalg.norm(rows, axis=1, keepdims=True)
    y = rows * np.minimum(1.0, 1.0 / np.maximum(norms, 1e-300))
    y = y - y.mean(axis=0)
    return float(np.sum((y @ basis) ** 2) / np.sum(y**2))


def top_directions(rows: Array, count: int) -> Array:
    centred = rows - rows.mean(axis=0)
    _, _, vt = np.linalg.svd(centred, full_matrices=False)
    return np.ascontiguousarray(vt[:count].T)


def summary(values: list[float]) -> str:
    a = np.asarray(values, dtype=float)
    sd = a.std(ddof=1) if len(a) > 1 else 0.0
    return f"{a.mean():.3f} (sd {sd:.3f}, {a.min():.3f}-{a.max():.3f}, n {len(a)})"


class Service:
    """The app in this process with the product's settings (accounting ``hybrid``)."""

    def __init__(self, workdir: Path) -> None:
        url = f"sqlite:///{workdir / 'bench.db'}"
        self.settings = Settings(
            data_dir=workdir / "data",
            database_url=url,
            admin_api_key=None,
            rate_limit_per_second=0,
            release_padding_floor_seconds=0,
            release_padding_multiplier=0,
            max_upload_mb=200,
            api_max_loop_lag_seconds=0,
            default_accounting="hybrid",
        )
        upgrade_to_head(url)
        self.engine = make_engine(url)
        factory = make_session_factory(self.engine)
        with factory.begin() as session:
            _, self.owner_key = auth.create_key(session, "owner", "owner", actor_key_id=None)
            _, self.analyst_key = auth.create_key(session, "analyst", "analyst", actor_key_id=None)
        store = DatasetStore(self.settings.datasets_dir)
        store.ensure()
        self.worker = Worker(factory, store, self.settings, worker_id="bench-worker")
        self.seed = 0

    @contextlib.contextmanager
    def running(self) -> Iterator[tuple[Client, Client]]:
        saved = (
            handles_module.LONG_POLL_SECONDS,
            handles_module._sleep,
            oneshot_module.secure_generator,
        )
        # Every wait of the client (registration, a release's request, the handle's): one module.
        handles_module.LONG_POLL_SECONDS = 0.0
        handles_module._sleep = lambda _seconds: self.worker.run_pending()
        oneshot_module.secure_generator = lambda: np.random.default_rng(self.seed)  # type: ignore[assignment]
        try:
            with TestClient(create_app(self.settings)) as http:
                http.timeout = httpx.Timeout(600.0)
                owner = Client(str(http.base_url), self.owner_key, http=http)
                analyst = Client(str(http.base_url), self.analyst_key, http=http)
                yield owner, analyst
        finally:
            (
                handles_module.LONG_POLL_SECONDS,
                handles_module._sleep,
                oneshot_module.secure_generator,
            ) = saved
            self.engine.dispose()


def upload(owner: Client, rows: Array, name: str, epsilon_budget: str = "100") -> str:
    dataset = owner.upload(
        rows,
        name=name,
        epsilon_budget=epsilon_budget,
        delta_budget=DELTA_BUDGET[0],
        row_norm_bound=1.0,
        allow_large_delta=rows.shape[0] * float(DELTA_BUDGET[0]) > 1,
    )
    return str(dataset.id)


def fit(
    service: Service, analyst: Client, dataset: str, k: int, eps: float, seed: int, **kw: Any
) -> PrivatePCA:
    service.seed = seed
    return PrivatePCA(analyst, dataset, n_components=k, epsilon=str(eps), **kw).fit()


def part_a(service: Service, owner: Client, analyst: Client, seeds: int) -> None:
    digits = unit_rows(load_digits().data.astype(np.float64))
    size = int(0.75 * len(digits))
    shares, deltas = [], set()
    for seed in range(seeds):
        split = digits[np.random.default_rng(1000 + seed).permutation(len(digits))[:size]]
        dataset = upload(owner, split, f"digits-{seed}")
        pca = fit(service, analyst, dataset, 10, 1.0, seed)
        shares.append(kept(split, pca.components_.T))
        SEED_ROWS.append(("a", "digits 1347x64", "default", seed, shares[-1]))
        release = analyst.get_release(pca.release_id_).refresh()
        deltas.add(str(release.delta))
    print(f"(a) digits {size} x 64, k 10, eps 1, default (delta {sorted(deltas)}):")
    print(f"    kept {summary(shares)}  goal >= 0.48", flush=True)


def done_split(seed: int) -> tuple[Array, Array] | None:
    """MNIST's 4,000 private unit rows and the other 1,000 for release ``seed``: public seed
    ``2000 + seed``."""
    return mnist_split(2000 + seed)


def part_b(service: Service, owner: Client, analyst: Client, seeds: int) -> None:
    results: dict[str, list[float]] = {"pca64": [], "dct64": [], "ceiling pca64": []}
    dct = dct_prior(PRIOR_M)
    choices: set[str] = set()
    for seed in range(seeds):
        split = done_split(seed)
        if split is None:
            print("(b) MNIST unavailable")
            return
        private, public = split
        dataset = upload(owner, private, f"mnist-{seed}")
        prior = top_directions(public, PRIOR_M)
        for label, basis in (("pca64", prior), ("dct64", dct)):
            pca = fit(service, analyst, dataset, 10, 1.0, seed, prior=basis)
            results[label].append(kept(private, pca.components_.T))
            SEED_ROWS.append(
                ("b", "MNIST 4000x784", f"default prior={label}", seed, results[label][-1])
            )
            choices.add(str(analyst.get_release(pca.release_id_).extras.get("auto_choice")))
        inside = top_directions(private @ prior, 10)
        results["ceiling pca64"].append(kept(private, prior @ inside))
        SEED_ROWS.append(
            ("b", "MNIST 4000x784", "non-private in pca64", seed, results["ceiling pca64"][-1])
        )
    print(f"(b) MNIST 4,000 x 784, k 10, eps 1, default, with a prior (ran {sorted(choices)}):")
    pcs = summary(results["pca64"])
    print(f"    prior = top 64 PCs of the other 1,000 rows: {pcs}  goal >= 0.35")
    print(f"    prior = 64 lowest-frequency 2-D DCT: {summary(results['dct64'])}  goal >= 0.28")
    print(f"    (non-private top 10 inside the PC prior: {summary(results['ceiling pca64'])})")


def part_c(service: Service, owner: Client, analyst: Client, seeds: int) -> None:
    power = power_law(5000, 1000, seed=0)
    for label in ("MNIST 4,000 x 784", "power-law 4,000 x 1,000"):
        default, gauss, nonprivate, choices = [], [], [], set()
        for seed in range(seeds):
            if label.startswith("MNIST"):
                split = done_split(seed)
                if split is None:
                    print("(c) MNIST unavailable")
                    break
                rows = split[0]
            else:
                rows = power[np.random.default_rng(1000 + seed).permutation(len(power))[:4000]]
            dataset = upload(owner, rows, f"{label}-{seed}")
            pca = fit(service, analyst, dataset, 10, 1.0, seed)
            default.append(kept(rows, pca.components_.T))
            choices.add(str(analyst.get_release(pca.release_id_).extras.get("auto_choice")))
            pca = fit(service, analyst, dataset, 10, 1.0, seed, mechanism="analyze_gauss")
            gauss.append(kept(rows, pca.components_.T))
            centred = rows - rows.mean(axis=0)
            nonprivate.append(kept(rows, top_directions(centred, 10)))
            for setting, value in (
                ("default", default[-1]),
                ("analyze_gauss", gauss[-1]),
                ("non-private", nonprivate[-1]),
            ):
                SEED_ROWS.append(("c", label, setting, seed, value))
        if not default:
            continue
        ratio = np.asarray(default) / np.asarray(gauss)
        print(f"(c) {label}, k 10, eps 1, no prior (default ran {sorted(choices)}):")
        print(f"    default {summary(default)}; analyze_gauss {summary(gauss)}")
        print(
            f"    ratio of means {np.mean(default) / np.mean(gauss):.2f}, per seed "
            f"{summary(list(ratio))}  goal >= 1.5; non-private {np.mean(nonprivate):.3f}",
            flush=True,
        )


def cell_sets() -> dict[str, Array]:
    sets = {
        "digits": unit_rows(load_digits().data.astype(np.float64)),
        "breast_cancer": unit_rows(load_breast_cancer().data.astype(np.float64)),
    }
    split = done_split(0)
    if split is not None:
        sets["MNIST 4000x784"] = split[0]
    return sets


def forecast_figures(scales: dict[str, Any]) -> tuple[Any, Any, Any, str]:
    """(point, low, high, where) from a preview's scales: the top level (``analyze_gauss``) or
    ``auto``'s component's (``<name>.<key>``)."""

    def find(key: str) -> Any:
        if key in scales:
            return scales[key]
        for name, value in scales.items():
            if name.endswith("." + key) and name.count(".") == 1:
                return value
        return None

    for prefix in ("forecast_from_release_captured_share", "forecast_captured_share"):
        low, high = find(prefix + "_low"), find(prefix + "_high")
        if low is not None or find(prefix) is not None:
            return find(prefix), low, high, prefix
    return None, None, None, "no forecast"


SETTINGS = [(1.0, 2), (1.0, 10), (0.3, 2), (0.3, 10)]


def preview_scales(
    analyst: Client, dataset: str, eps: float, k: int, earlier: str | None = None
) -> dict[str, Any] | str:
    """The dry run of the request ``PrivatePCA(k, eps)`` sends (``auto``, private centre), with
    ``?forecast_from=earlier`` if given; the refusal's detail if refused."""
    query = {"dry_run": "true", **({} if earlier is None else {"forecast_from": earlier})}
    body = {"mechanism": "auto", "k": k, "epsilon": str(eps), "params": {"center": "private"}}
    try:
        response = analyst._request(
            "POST", f"/v1/datasets/{dataset}/releases", params=query, json=body
        )
    except client_module.DpssError as error:
        return f"refused: {error.detail[:70]}"
    scales: dict[str, Any] = response.json()["scales"]
    return scales


def part_de(service: Service, owner: Client, analyst: Client, seeds: int) -> None:
    """Item 4: the point estimate per setting, then the forecast from public facts and from
    an earlier release (every pair of settings; release ``i`` of the earlier setting forecasts
    release ``i + 1`` of the new one, another seed)."""
    print(
        "(d) item 4's point estimate on the default path (stated = sum of the ratios; the "
        "error over the releases that state one: a hidden share states none)"
    )
    print(
        "| data | eps | k | ran | kept (mean, sd) | stated - kept | mean abs | interval width "
        "| covers | hidden | own spread |"
    )
    print("|---" * 11 + "|")
    runs: dict[str, dict[tuple[float, int], list[tuple[str, float]]]] = {}
    datasets: dict[str, str] = {}
    for name, rows in cell_sets().items():
        dataset = upload(owner, rows, name, epsilon_budget="1000")
        datasets[name] = dataset
        runs[name] = {}
        for eps, k in SETTINGS:
            fits = [fit(service, analyst, dataset, k, eps, 100 + seed) for seed in range(seeds)]
            truth = np.asarray([kept(rows, p.components_.T) for p in fits])
            stated = np.asarray([float(np.sum(p.explained_variance_ratio_)) for p in fits])
            intervals = [p.explained_variance_ratio_interval_ for p in fits]
            hidden = sum(bool(p.explained_variance_hidden_by_noise_) for p in fits)
            ran = sorted(
                {str(analyst.get_release(p.release_id_).extras.get("auto_choice")) for p in fits}
            )
            runs[name][(eps, k)] = [
                (str(p.release_id_), float(x)) for p, x in zip(fits, truth, strict=True)
            ]
            # A hidden share states no figure (NaN): the error is over the stated ones.
            err = (stated - truth)[~np.isnan(stated)]
            shown = f"{err.mean():+.3f} | {np.abs(err).mean():.3f}" if len(err) else "- | -"
            width = np.mean([hi - lo for lo, hi in intervals])
            covers = np.mean([lo <= x <= hi for (lo, hi), x in zip(intervals, truth, strict=True)])
            spread = float(np.mean(np.abs(truth - np.median(truth))))
            print(
                f"| {name} | {eps:g} | {k} | {'/'.join(ran)} | {truth.mean():.3f} "
                f"({truth.std(ddof=1):.3f}) | {shown} | "
                f"{width:.3f} | {covers:.2f} | {hidden}/{len(fits)} | {spread:.3f} |",
                flush=True,
            )
    print()
    print("(e) item 4's forecast: the dry run of the same request PrivatePCA sends")
    print(
        "| data | from eps / k | to eps / k | kept | own spread | points given | point: mean "
        "abs err | point: mean err | range covers | range width | range midpoint: mean err |"
    )
    print("|---" * 11 + "|")
    for name, dataset in datasets.items():
        for eps, k in SETTINGS:
            later = runs[name][(eps, k)]
            truth = np.asarray([x for _, x in later])
            spread = float(np.mean(np.abs(truth - np.median(truth))))
            public = preview_scales(analyst, dataset, eps, k)
            assert not isinstance(public, str), public
            point, low, high, _ = forecast_figures(public)
            if low is None:
                text = "no forecast in the dry run | - | - | - | - | -"
            else:
                hits = np.mean([low <= x <= high for x in truth])
                shown = "-" if point is None else f"{abs(point - truth.mean()):.3f}"
                text = (
                    f"{0 if point is None else len(truth)}/{len(truth)} | {shown} | - | "
                    f"{hits:.2f} | {high - low:.2f} | {(low + high) / 2 - truth.mean():+.3f}"
                )
            print(
                f"| {name} | none (public facts) | {eps:g} / {k} | {truth.mean():.3f} | "
                f"{spread:.3f} | {text} |",
                flush=True,
            )
            for before in SETTINGS:
                earlier = runs[name][before]
                points, signed, hits, widths, mids = [], [], [], [], []
                refused = None
                for i in range(len(earlier)):
                    target = truth[(i + 1) % len(truth)]
                    scales = preview_scales(analyst, dataset, eps, k, earlier[i][0])
                    if isinstance(scales, str):
                        refused = scales
                        break
                    point, low, high, where = forecast_figures(scales)
                    if where != "forecast_from_release_captured_share":
                        refused = "no forecast_from figures"
                        break
                    if point is not None:
                        points.append(abs(point - target))
                        signed.append(point - target)
                    if low is not None and high is not None:
                        hits.append(low <= target <= high)
                        widths.append(high - low)
                        mids.append((low + high) / 2 - target)
                if refused is not None:
                    text = refused + " | - | - | - | - | - | -"
                elif not hits:
                    text = f"0/{len(earlier)} | - | - | no range | - | -"
                else:
                    text = (
                        f"{len(points)}/{len(earlier)} | "
                        + (f"{np.mean(points):.3f} | {np.mean(signed):+.3f}" if points else "- | -")
                        + f" | {np.mean(hits):.2f} | {np.mean(widths):.2f} | {np.mean(mids):+.3f}"
                    )
                print(
                    f"| {name} | {before[0]:g} / {before[1]} | {eps:g} / {k} | "
                    f"{truth.mean():.3f} | {spread:.3f} | {text} |",
                    flush=True,
                )


PARTS = {"a": part_a, "b": part_b, "c": part_c, "d": part_de}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seeds", type=int, default=10)
    parser.add_argument("--parts", nargs="+", default=list(PARTS))
    parser.add_argument("--delta-budget", default=DELTA_BUDGET[0])
    parser.add_argument("--csv", type=Path, default=None, help="parts a-c: every seed's figure")
    args = parser.parse_args(argv)
    DELTA_BUDGET[0] = args.delta_budget
    with tempfile.TemporaryDirectory() as tmp:
        service = Service(Path(tmp))
        with service.running() as (owner, analyst):
            for part in args.parts:
                PARTS[part](service, owner, analyst, args.seeds)
                if args.csv is not None:
                    with args.csv.open("w", newline="") as out:
                        writer = csv.writer(out)
                        writer.writerow(["part", "data", "setting", "seed", "kept"])
                        for row in SEED_ROWS:
                            writer.writerow([*row[:4], f"{row[4]:.6f}"])


if __name__ == "__main__":
    main()
