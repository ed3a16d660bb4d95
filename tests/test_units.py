"""One formatter per unit, one precision rule (stepscope/units.py), checked by hand."""

from __future__ import annotations

import pytest

from stepscope import units


@pytest.mark.parametrize(("ns", "text"), [
    (0, "0 ns"), (812, "812 ns"), (999.6, "1.00 us"), (12_345, "12.3 us"), (4_561_000, "4.56 ms"),
    (100_000_000, "100 ms"), (1e9, "1.00 s"), (1_234e9, "1,230 s"), (-2.5e6, "-2.50 ms"),
])
def test_durations_have_three_significant_digits_in_the_largest_unit(ns: float, text: str) -> None:
    assert units.duration(ns) == text
    assert units.format_value(ns, "ns") == text


@pytest.mark.parametrize(("n", "text"), [
    (0, "0 B"), (512, "512 B"), (1536, "1.50 KiB"), (16 * 2**20, "16.0 MiB"), (3.2 * 2**30, "3.20 GiB"),
    (2**40, "1.00 TiB"),
])
def test_sizes_are_binary(n: float, text: str) -> None:
    assert units.size(n) == text


def test_bandwidth_percent_p_value_count_number() -> None:
    assert units.bandwidth(12.345) == "12.3 GB/s"
    assert units.bandwidth(0.00123) == "0.00123 GB/s"
    assert units.percent(12.345) == "12.3%"
    assert units.signed_percent(3) == "+3.0%" and units.signed_percent(None) == "n/a"
    assert units.p_value(0.01234) == "0.012"
    assert units.count(1234) == "1,234" and units.count(2.5) == "2.50"
    assert units.number(1234.5678) == "1,234.568" and units.number(0.000123) == "0.000123"
    assert units.number(7) == "7"


def test_missing_and_signed_values() -> None:
    assert units.format_value(None, "bytes") == units.MISSING == "n/a"
    assert units.format_delta(-512, "bytes") == "-512 B"
    assert units.format_delta(1.2e6, "ns") == "+1.20 ms"
    assert units.format_delta(0, "ns") == "0"


def test_every_unit_the_comparison_uses_has_a_formatter() -> None:
    from stepscope.analysis.compare.budgets import BUDGET_METRICS

    assert set(BUDGET_METRICS.values()) <= set(units.FORMATTERS)


def test_values_read_in_the_unit_their_key_names() -> None:
    """Section tables format by key: durations, sizes, rates, percentages, hex addresses, times
    since the run's start, names cut in the middle (whole on request)."""
    assert units.for_key("max_wait_ns", 31_322_645) == "31.3 ms"
    assert units.for_key("peak_allocated_bytes", 3 * 2**30) == "3.00 GiB"
    assert units.for_key("busbw_gbps", 12.34) == "12.3 GB/s"
    assert units.for_key("exposed_pct_of_steps", 97.668) == "97.7%"
    assert units.for_key("addr", 140_737_488_355_328) == "0x800000000000"
    assert units.for_key("late_arrival_ns", 1_000_032_800_000, origin=1_000_000_000_000) == "+32.8 ms"
    assert units.for_key("late_ranks", [5, 6, 7]) == "5, 6, 7"
    assert units.for_key("host_side", True) == "yes" and units.for_key("steps", None) == "n/a"
    name = "void at::native::elementwise_kernel<128, 4, " + "x" * 300 + ">(int, float)"
    short = units.for_key("name", name)
    assert len(short) == units.NAME_WIDTH and short.startswith("void at::native::") and short.endswith("(int, float)")
    assert units.for_key("name", name, full_names=True) == name
    assert units.short_name("aten::mm") == "aten::mm"
