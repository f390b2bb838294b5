"""decode shows every sampled token, special ones included, and hides only the padding after <|end|>."""

import pytest

from mlbook.posttrain.toy_lm import decode, encode

pytestmark = pytest.mark.unit


def test_pads_inside_a_response_are_shown():
    ids = encode("<|bos|> the good <|pad|> <|bos|> good <|end|> <|pad|> <|pad|>")
    assert decode(ids) == "<|bos|> the good <|pad|> <|bos|> good <|end|>"


def test_left_padding_and_rows_without_end():
    assert (
        decode(encode("<|pad|> <|bos|> cat good <|pad|>")) == "<|bos|> cat good <|pad|>"
    )  # the last pad was sampled


def test_skip_pad_false_shows_everything():
    ids = encode("<|bos|> cat <|end|> <|pad|>")
    assert decode(ids, skip_pad=False) == "<|bos|> cat <|end|> <|pad|>"
