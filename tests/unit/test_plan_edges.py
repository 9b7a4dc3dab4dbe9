"""`replay plan` says when PDD's best sits at an edge of what it searched."""

from __future__ import annotations

from replay.experiments.plan_edges import edge_warnings
from replay.experiments.plan_space import Candidate, PlanSpace


def _space(p: tuple[int, ...] = (2, 3, 4), md: tuple[int, ...] = (1, 2, 3),
           wan: tuple[float, ...] = (10.0, 20.0, 40.0)) -> PlanSpace:  # fmt: skip
    return PlanSpace(p=p, rld=(1,), md=md, gpu_p=("h100",), gpu_rld=("h100",),
                     gpu_md=("h200",), wan_gbps=wan, wan_price_per_gbps_month=72.4)  # fmt: skip


def _best(p: int, md: int, wan: float) -> Candidate:
    return Candidate(p=p, rld=1, md=md, gpu_p="h100", gpu_rld="h100", gpu_md="h200",
                     wan_gbps=wan)  # fmt: skip


def test_a_best_inside_every_range_gives_no_warning() -> None:
    assert edge_warnings(_best(3, 2, 20.0), _space()) == []


def test_the_largest_prefill_and_widest_line_each_name_the_range_to_search_next() -> None:
    lines = edge_warnings(_best(4, 2, 40.0), _space())
    assert len(lines) == 2
    assert "P 4, the largest searched (--p 2..4)" in lines[0]
    assert lines[0].endswith("(e.g. --p 3..6)")
    assert "40 Gbps line, the widest searched" in lines[1]
    assert lines[1].endswith("(e.g. --wan-gbps 20,40,80)")


def test_the_smallest_count_warns_unless_it_is_the_least_possible() -> None:
    lines = edge_warnings(_best(3, 2, 20.0), _space(p=(3, 4, 5), md=(2, 3)))
    assert len(lines) == 2
    assert "P 3, the smallest searched (--p 3..5)" in lines[0]
    assert "--p 1..4" in lines[0]
    assert "MD 2, the smallest searched" in lines[1]
    assert "--md 1..3" in lines[1]
    assert edge_warnings(_best(3, 1, 20.0), _space(md=(1, 2))) == []  # MD 1 is the least


def test_a_dimension_searched_at_one_value_is_the_users_choice() -> None:
    assert edge_warnings(_best(4, 2, 10.0), _space(p=(4,), wan=(10.0,))) == []


def test_counts_searched_apart_are_named_as_given() -> None:
    (line,) = edge_warnings(_best(8, 2, 20.0), _space(p=(2, 4, 8)))
    assert "P 8, the largest searched (--p 2,4,8)" in line
