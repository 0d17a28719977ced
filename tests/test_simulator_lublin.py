"""The Lublin–Feitelson generator: seedable, any machine size, close to the reference trace."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from simulator.lublin import LublinParams, daily_weights, generate
from simulator.setup import UbisSetup, apply
from simulator.swf import read_swf, summarise
from vjob.errors import InputError


def test_same_seed_same_trace_other_seed_other_trace():
    a, b, c = generate(256, 2000, seed=5), generate(256, 2000, seed=5), generate(256, 2000, seed=6)
    assert a.submit.tolist() == b.submit.tolist() and a.nodes.tolist() == b.nodes.tolist()
    assert a.runtime.tolist() != c.runtime.tolist()


@pytest.mark.parametrize("nodes", [1, 100, 1056])
def test_sizes_fit_any_machine(nodes: int):
    w = generate(nodes, 5000, seed=1)
    assert w.nodes.min() >= 1 and w.nodes.max() <= nodes
    assert np.all(np.diff(w.submit) >= 0)
    assert w.runtime.min() >= 1 and w.runtime.max() <= np.exp(12)


def test_distributions_match_the_reference_trace(shared_dir: Path):
    ref = read_swf(shared_dir / "data" / "traces" / "lublin_256.swf")
    ours = generate(256, 10_000, seed=1)
    # serial share: the model's 24.4 %
    assert np.mean(ours.nodes == 1) == pytest.approx(0.244, abs=0.015)
    assert np.median(ours.nodes) == np.median(ref.nodes)
    assert np.median(ours.runtime) == pytest.approx(np.median(ref.runtime), rel=0.25)
    assert ours.runtime.mean() == pytest.approx(ref.runtime.mean(), rel=0.15)
    # power-of-two sizes dominate the parallel jobs, as in the model
    par = ours.nodes[ours.nodes > 1]
    assert np.mean((par & (par - 1)) == 0) > 0.6


def test_load_rescales_arrivals_exactly():
    w = generate(1056, 3000, seed=2, load=0.7)
    assert summarise(w)["offered_load"] == pytest.approx(0.7, rel=1e-3)
    with pytest.raises(InputError, match="--load = 0"):
        generate(64, 10, load=0)


def test_daily_cycle_peaks_in_the_day_and_averages_one():
    w = daily_weights(LublinParams())
    assert w.shape == (48,) and w.mean() == pytest.approx(1.0)
    assert w.argmax() > w.argmin()
    assert w.max() / w.min() > 5


def test_bad_sizes_are_named():
    with pytest.raises(InputError, match="--nodes = 0"):
        generate(0, 10)
    with pytest.raises(InputError, match="--jobs = 0"):
        generate(10, 0)


def test_ubis_setup_injects_the_asked_share_and_sizes():
    base = generate(1056, 4000, seed=3)
    w = apply(base, 1056, UbisSetup(interactive_frac=0.3, interactive_mean_size=100, seed=3))
    assert len(w) == round(4000 / 0.7)
    inter = w.interactive
    assert inter.mean() == pytest.approx(0.3, abs=0.002)
    assert w.nodes[inter].mean() == pytest.approx(100, rel=0.05)
    assert w.runtime[inter].min() >= 600 and w.runtime[inter].max() <= 7200
    assert set(np.unique(w.os).tolist()) == {0, 1}
    assert np.mean(w.os == 0) == pytest.approx(0.5, abs=0.03)
    assert w.submit.min() == 0 and np.all(np.diff(w.submit) >= 0)
    # interleaved: interactive jobs spread over the whole span, not bunched at one end
    assert w.submit[inter].max() > 0.9 * w.submit.max() and w.submit[inter].min() < 0.1 * w.submit.max()


def test_setup_drops_jobs_larger_than_the_machine_and_checks_its_fields():
    base = generate(256, 500, seed=1)
    w = apply(base, 64, UbisSetup())
    assert w.skipped["too_big"] == int(np.sum(base.nodes > 64)) > 0
    with pytest.raises(InputError, match="--interactive-frac = 1"):
        UbisSetup(interactive_frac=1.0)
    with pytest.raises(InputError, match="--os-count = 0"):
        UbisSetup(os_count=0)


def test_os_from_wagap_node_types(shared_dir: Path):
    w = read_swf(shared_dir / "data" / "traces" / "wagap-2013.swf", lenient=True).take(slice(0, 300))
    out = apply(w, 256, UbisSetup(os_from_properties=True, seed=1))
    zewura = np.array(["cl_zewura" in p for p in out.properties])
    assert zewura.any() and len(set(out.os[zewura].tolist())) == 1
