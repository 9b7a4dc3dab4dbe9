"""`calibrate`'s options: refused by name before anything is sent, and the probes they make."""

from __future__ import annotations

import pytest

from cli.calibrate_options import CalibrateOptions
from router.errors import UserError


@pytest.mark.parametrize(
    ("given", "named"),
    [
        ({"max_prompt": 511}, "--max-prompt"),
        ({"max_batch": 0}, "--max-batch"),
        ({"clock": "wall"}, "--clock 'wall'"),
        ({"router": "http://127.0.0.1:9"}, "--router needs --preset"),
    ],
)
def test_a_bad_option_is_refused_naming_it(given: dict[str, object], named: str) -> None:
    with pytest.raises(UserError, match=named):
        CalibrateOptions(url="http://engine", **given)


def test_decode_tokens_are_refused_with_the_most_the_prompt_leaves_room_for() -> None:
    # 1024 less twice the short probes' 64-token prompt
    with pytest.raises(UserError, match=r"--decode-tokens 900 .* at most 896"):
        CalibrateOptions(url="http://engine", max_prompt=1024, decode_tokens=900)
    assert CalibrateOptions(url="http://engine", max_prompt=1024, decode_tokens=896)


def test_the_probes_stay_within_the_prompt_and_the_batch_given() -> None:
    options = CalibrateOptions(
        url="http://engine:8000/", max_prompt=2048, max_batch=12, decode_tokens=96, clock="client"
    )
    probes = options.probes()
    assert probes.url == "http://engine:8000"
    assert probes.new_tokens == (64, 256, 512, 1024)  # up to half the prompt
    assert probes.cached_tokens == (0, 1024)
    assert probes.batches == (1, 2, 4, 8)
    assert probes.long_prompt == 2048 - 96
    assert probes.clock == "client"
    assert options.url == "http://engine:8000/"  # printed and written as given
