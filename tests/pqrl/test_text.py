"""Outside text made safe to send on: bounded and encodable."""

from pqrl.text import clipped, encodable


def test_a_lone_surrogate_becomes_an_escape_and_the_text_encodes():
    assert encodable("a\udcffb") == "a\\udcffb"
    assert encodable("a\udcffb").encode("utf-8")


def test_long_text_is_cut_and_says_how_long_it_was():
    out = clipped("x" * 5000, 500)
    assert len(out) <= 500 and out.endswith("... (5000 characters in all)")
    assert clipped("short", 500) == "short"
