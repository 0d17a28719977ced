"""The snapshot gathering order of Saline 3.1.2: the rule, its simulation, real copies."""

from __future__ import annotations

from pathlib import Path

import pytest

from saline_bew.gathering import REPOSITORY, Copy, Gathering, next_copies, simulate


def test_fewest_images_go_to_the_repository_and_others_relay_to_fuller_peers() -> None:
    holdings = {"a": ("a1",), "b": ("b1", "b2"), "c": ("c1", "c2", "c3"), "d": ("d1", "d2")}
    copies = next_copies(holdings, busy=frozenset(), repository_busy=False)
    assert copies[0] == Copy("a", REPOSITORY, ("a1",))
    relays = copies[1:]
    # b (2 images) may only send to c (3) or d (2): never to a node holding fewer images.
    assert Copy("b", "c", ("b1", "b2")) in relays
    for c in relays:
        assert len(holdings[c.destination]) >= len(holdings[c.source])
    busy = [n for c in copies for n in (c.source, c.destination) if n != REPOSITORY]
    assert len(busy) == len(set(busy)), "a node takes part in one copy at a time"


def test_busy_nodes_and_busy_repository_are_left_alone() -> None:
    holdings = {"a": ("a1",), "b": ("b1",), "c": ("c1",)}
    copies = next_copies(holdings, busy=frozenset({"a"}), repository_busy=True)
    assert copies == [Copy("b", "c", ("b1",))]
    assert next_copies({"a": (), "b": ()}, busy=frozenset(), repository_busy=False) == []


def test_simulation_frees_most_nodes_long_before_naive_copies() -> None:
    holdings = {f"n{i:02d}": (f"vm{i}",) for i in range(64)}
    sizes = {f"vm{i}": 1e9 for i in range(64)}
    saline = simulate(holdings, sizes, repository_bps=125e6, link_bps=125e6)
    naive = simulate(holdings, sizes, repository_bps=125e6, link_bps=125e6, naive=True)
    assert set(saline.freed_at) == set(holdings) == set(naive.freed_at)
    # Same bytes through the same repository link: the total cannot improve...
    assert saline.total_s == pytest.approx(naive.total_s, rel=0.01)
    # ...but nodes are handed back one by one instead of all at the end.
    assert saline.time_to_free(0.8) < naive.time_to_free(0.8) / 4
    into_repo = [c for _, _, c in saline.copies if c.destination == REPOSITORY]
    assert sorted(i for c in into_repo for i in c.images) == sorted(sizes)


def test_gathering_copies_real_files_into_the_repository(tmp_path: Path) -> None:
    nodes = {"a": ("x",), "b": ("y", "z"), "c": ("w",)}
    for node, images in nodes.items():
        (tmp_path / node).mkdir()
        for image in images:
            (tmp_path / node / image).write_text(f"{image} from {node}")
    repo = tmp_path / "repo"
    repo.mkdir()

    def copy(image: str, source: str, destination: str) -> None:
        target = repo if destination == REPOSITORY else tmp_path / destination
        (tmp_path / source / image).rename(target / image)

    freed: list[str] = []
    order = Gathering(copy, workers=4).run(nodes, on_freed=freed.append)
    assert sorted(p.name for p in repo.iterdir()) == ["w", "x", "y", "z"]
    assert (repo / "y").read_text() == "y from b"
    assert sorted(order) == ["a", "b", "c"] and freed == order
    assert all(not any((tmp_path / n).iterdir()) for n in nodes)


def test_a_failed_copy_stops_the_gathering(tmp_path: Path) -> None:
    def copy(image: str, source: str, destination: str) -> None:
        raise OSError(28, "No space left on device")

    with pytest.raises(OSError, match="No space left"):
        Gathering(copy).run({"a": ("x",)})
