"""The msgpack codec: what round-trips, and what is refused with a message that names the problem."""

from __future__ import annotations

import struct

import msgpack
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from flare2.errors import DecodeError, EncodeError, TransportError
from flare2.wire.codec import ARRAY_EXT_CODE, MAX_DEPTH, MAX_NDIM, WIRE_DTYPE_NAMES, decode, encode

SHAPES = [(), (5,), (2, 3, 4), (0,), (3, 0)]


def round_trip(value):
    return decode(encode(value))


def assert_same(decoded, original) -> None:
    """Equal structure, equal types (tuples arrive as lists), byte-equal arrays of the same dtype and shape."""
    if isinstance(original, np.ndarray):
        assert isinstance(decoded, np.ndarray)
        assert decoded.dtype == original.dtype.newbyteorder("=")
        assert decoded.shape == original.shape
        np.testing.assert_array_equal(decoded, original)
    elif isinstance(original, dict):
        assert isinstance(decoded, dict) and decoded.keys() == original.keys()
        for key in original:
            assert_same(decoded[key], original[key])
    elif isinstance(original, (list, tuple)):
        assert isinstance(decoded, list) and len(decoded) == len(original)
        for got, want in zip(decoded, original):
            assert_same(got, want)
    else:
        assert type(decoded) is type(original)
        assert decoded == original


def sample_array(dtype: str, shape: tuple[int, ...]) -> np.ndarray:
    return (np.arange(int(np.prod(shape)), dtype=np.int64) % 7).astype(dtype).reshape(shape)


def array_ext(dtype_code: int, shape: tuple[int, ...], body: bytes) -> bytes:
    """A message holding one hand-made array ext value."""
    head = struct.pack(f"<BB{len(shape)}I", dtype_code, len(shape), *shape)
    return msgpack.packb(msgpack.ExtType(ARRAY_EXT_CODE, head + body))


def nested_lists(depth: int) -> bytes:
    """msgpack bytes of ``depth`` nested one-element lists around a nil."""
    return b"\x91" * depth + b"\xc0"


# --- round trips -------------------------------------------------------------------------------


@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("dtype", WIRE_DTYPE_NAMES)
def test_an_array_of_every_wire_dtype_and_shape_comes_back_equal(dtype, shape):
    array = sample_array(dtype, shape)
    decoded = round_trip(array)
    assert_same(decoded, array)


@pytest.mark.parametrize("dtype", ["float16", "float32", "float64"])
def test_nan_inf_and_negative_zero_come_back_bit_for_bit(dtype):
    array = np.array([np.nan, np.inf, -np.inf, -0.0, 0.0], dtype=dtype)
    decoded = round_trip(array)
    assert decoded.tobytes() == array.tobytes()


def test_integer_extremes_come_back_exactly():
    for dtype in ("int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64"):
        info = np.iinfo(dtype)
        array = np.array([info.min, info.max], dtype=dtype)
        assert_same(round_trip(array), array)


@pytest.mark.parametrize(
    "make",
    [
        lambda: np.arange(20, dtype=np.float32)[::2],
        lambda: np.arange(12, dtype=np.int64).reshape(3, 4).T,
        lambda: np.asfortranarray(np.arange(12, dtype=np.float64).reshape(3, 4)),
        lambda: np.arange(24, dtype=np.int16).reshape(2, 3, 4)[:, ::-1, 1:3],
        lambda: np.broadcast_to(np.arange(3, dtype=np.uint8), (4, 3)),
    ],
    ids=["strided", "transposed", "fortran", "reversed-slice", "broadcast"],
)
def test_a_non_contiguous_array_comes_back_equal(make):
    array = make()
    assert not array.flags.c_contiguous
    assert_same(round_trip(array), array)


@pytest.mark.parametrize("dtype", [">i2", ">i4", ">u8", ">f2", ">f4", ">f8"])
def test_a_big_endian_array_comes_back_equal_in_native_byte_order(dtype):
    array = np.array([[1, 2, 3], [250, 7, 9]], dtype=dtype)
    decoded = round_trip(array)
    assert decoded.dtype == np.dtype(dtype).newbyteorder("=")
    np.testing.assert_array_equal(decoded, array)


@pytest.mark.parametrize(
    "scalar",
    [
        np.bool_(True),
        np.int8(-3),
        np.int64(2**40),
        np.uint16(65535),
        np.float16(1.5),
        np.float32(0.25),
        np.float64(-2.5),
    ],
    ids=lambda s: type(s).__name__,
)
def test_a_numpy_scalar_keeps_its_value_and_dtype(scalar):
    # Numpy scalars arrive as 0-d arrays, except float64 which is a Python float subclass and arrives as a float.
    decoded = round_trip(scalar)
    assert np.asarray(decoded).dtype == scalar.dtype
    assert np.asarray(decoded).shape == ()
    assert decoded == scalar


@pytest.mark.parametrize(
    "value",
    [
        0,
        -1,
        2**63 - 1,
        -(2**63),
        2**64 - 1,
        1.5,
        float("inf"),
        -0.0,
        True,
        False,
        None,
        "",
        "héllo ✓",
        b"",
        b"\x00\xff",
    ],
    ids=repr,
)
def test_a_python_scalar_comes_back_with_its_type_and_value(value):
    assert_same(round_trip(value), value)


def test_nested_dicts_and_lists_come_back_equal_with_tuples_as_lists():
    value = {
        "inputs": {"obs": np.ones((2, 4), np.float32), "mask": np.array([True, False])},
        "steps": [1, 2.5, None, "x", b"y", [np.arange(3, dtype=np.int32), {"deep": np.zeros((3, 0), np.uint8)}]],
        "pair": (1, "two"),
        "empty": {},
        "nothing": [],
    }
    assert_same(round_trip(value), value)


_wire_arrays = st.sampled_from(WIRE_DTYPE_NAMES).flatmap(
    lambda dtype: hnp.arrays(dtype, hnp.array_shapes(min_dims=0, max_dims=3, min_side=0, max_side=3))
)
_nested = st.recursive(
    _wire_arrays,
    lambda children: st.dictionaries(st.text(max_size=8), children, max_size=4),
    max_leaves=6,
)


@settings(max_examples=50, deadline=None, database=None)
@given(value=st.dictionaries(st.text(max_size=8), _nested, max_size=4))
def test_any_nested_dict_of_arrays_comes_back_byte_for_byte(value):
    def check(decoded, original):
        if isinstance(original, dict):
            assert isinstance(decoded, dict) and decoded.keys() == original.keys()
            for key in original:
                check(decoded[key], original[key])
        else:
            assert decoded.dtype == original.dtype and decoded.shape == original.shape
            assert decoded.tobytes() == original.tobytes()

    check(round_trip(value), value)


# --- what encode refuses -------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", ["O", "c8", "c16", "U3", "S2", "M8[s]", "m8[s]", "V4"])
def test_encoding_an_array_of_a_non_wire_dtype_raises_encode_error_naming_the_dtype(dtype):
    array = np.empty(2, dtype=dtype)
    with pytest.raises(EncodeError, match="cannot send an array of dtype") as caught:
        encode({"x": array})
    assert str(array.dtype) in str(caught.value)
    assert "float32" in str(caught.value)  # lists what can be sent


def test_encoding_an_object_array_raises_encode_error():
    with pytest.raises(EncodeError, match="dtype object"):
        encode(np.array([object(), 1], dtype=object))


@pytest.mark.parametrize("value", [object(), {1, 2}, 1j, frozenset()], ids=lambda v: type(v).__name__)
def test_encoding_a_value_of_another_type_raises_encode_error_naming_the_type(value):
    with pytest.raises(EncodeError, match=f"type {type(value).__name__}"):
        encode({"x": [value]})


@pytest.mark.parametrize("value", [2**64, -(2**63) - 1])
def test_encoding_an_int_outside_64_bits_raises_encode_error(value):
    with pytest.raises(EncodeError):
        encode({"n": value})


def test_encoding_an_int_outside_64_bits_says_it_is_out_of_range():
    with pytest.raises(EncodeError, match="64-bit|range|too big|too large"):
        encode(2**64)


def test_encoding_an_array_with_too_many_dimensions_raises_encode_error():
    array = np.empty((1,) * (MAX_NDIM + 1), dtype=np.uint8)
    with pytest.raises(EncodeError, match=f"at most {MAX_NDIM}"):
        encode(array)


def test_encoding_an_array_with_a_dimension_too_big_for_the_wire_raises_encode_error():
    array = np.empty((2**32, 0), dtype=np.uint8)  # no memory: the other dim is 0
    with pytest.raises(EncodeError):
        encode(array)


@pytest.mark.parametrize(
    "value",
    [
        {1: "a"},
        {"ok": {b"key": 1}},
        {"ok": [{(1, 2): 3}]},
        msgpack.unpackb(nested_lists(MAX_DEPTH + 5)),
    ],
    ids=["int-key", "bytes-key", "tuple-key", "too-deep"],
)
def test_encode_refuses_what_decode_would_refuse(value):
    with pytest.raises(EncodeError):
        encode(value)


# --- what decode refuses -------------------------------------------------------------------------


def test_decode_errors_are_transport_errors():
    assert issubclass(DecodeError, TransportError)


@pytest.mark.parametrize(
    "data", [b"\xc1", b"", b"\xff\xff\xff" + b"garbage"], ids=["reserved-byte", "empty", "garbage"]
)
def test_garbage_bytes_raise_decode_error(data):
    with pytest.raises(DecodeError, match="not a valid msgpack message"):
        decode(data)


def test_a_truncated_message_raises_decode_error():
    data = encode({"obs": np.arange(10, dtype=np.float32)})
    for cut in (1, 3, len(data) // 2, len(data) - 1):
        with pytest.raises(DecodeError, match="not a valid msgpack message"):
            decode(data[:cut])


def test_trailing_bytes_after_a_message_raise_decode_error():
    with pytest.raises(DecodeError, match="not a valid msgpack message"):
        decode(encode({"a": 1}) + b"\x00")


def test_an_unknown_dtype_code_raises_decode_error_naming_the_code():
    code = len(WIRE_DTYPE_NAMES)
    with pytest.raises(DecodeError, match=f"unknown array dtype code {code}"):
        decode(array_ext(code, (), b"\x00" * 8))


@pytest.mark.parametrize("extra", [-1, 1, 100])
def test_an_array_whose_byte_count_does_not_match_its_shape_raises_decode_error(extra):
    int32 = WIRE_DTYPE_NAMES.index("int32")
    body = b"\x00" * (2 * 3 * 4 + extra)
    with pytest.raises(DecodeError, match=rf"shape \(2, 3\) and dtype int32 needs 24 bytes, got {24 + extra}"):
        decode(array_ext(int32, (2, 3), body))


def test_an_array_claiming_a_huge_shape_with_few_bytes_raises_decode_error():
    float64 = WIRE_DTYPE_NAMES.index("float64")
    with pytest.raises(DecodeError, match="needs"):
        decode(array_ext(float64, (2**32 - 1, 2**32 - 1), b"\x00" * 8))


def test_a_truncated_array_header_raises_decode_error():
    with pytest.raises(DecodeError, match="array header is truncated"):
        decode(msgpack.packb(msgpack.ExtType(ARRAY_EXT_CODE, b"\x00")))
    with pytest.raises(DecodeError, match="array shape is truncated"):
        decode(msgpack.packb(msgpack.ExtType(ARRAY_EXT_CODE, bytes([0, 2]) + struct.pack("<I", 3))))


def test_an_array_with_too_many_dimensions_raises_decode_error():
    head = bytes([0, MAX_NDIM + 1]) + struct.pack(f"<{MAX_NDIM + 1}I", *([1] * (MAX_NDIM + 1)))
    with pytest.raises(DecodeError, match=f"at most {MAX_NDIM}"):
        decode(msgpack.packb(msgpack.ExtType(ARRAY_EXT_CODE, head + b"\x00")))


def test_an_unknown_ext_code_raises_decode_error_naming_it():
    with pytest.raises(DecodeError, match="unknown msgpack ext type 7"):
        decode(msgpack.packb({"x": msgpack.ExtType(7, b"abc")}))


def test_a_msgpack_timestamp_raises_decode_error():
    with pytest.raises(DecodeError, match="Timestamp"):
        decode(msgpack.packb({"t": msgpack.Timestamp(1, 0)}))


@pytest.mark.parametrize("key", [1, -2, 1.5, None, True], ids=repr)
def test_a_non_str_map_key_raises_decode_error(key):
    with pytest.raises(DecodeError, match="map key"):
        decode(msgpack.packb({"ok": {key: 1}}))


def test_a_bytes_map_key_raises_decode_error_naming_the_key():
    with pytest.raises(DecodeError, match=r"map key b'k' is not a str"):
        decode(msgpack.packb({b"k": 1}, use_bin_type=True))


def test_nesting_up_to_max_depth_is_accepted_and_one_level_more_is_refused():
    assert decode(nested_lists(MAX_DEPTH)) == msgpack.unpackb(nested_lists(MAX_DEPTH))
    with pytest.raises(DecodeError, match=f"deeper than {MAX_DEPTH}"):
        decode(nested_lists(MAX_DEPTH + 1))


def test_deeply_nested_maps_raise_decode_error():
    data = b"\x81\xa1k" * (MAX_DEPTH + 1) + b"\xc0"
    with pytest.raises(DecodeError, match=f"deeper than {MAX_DEPTH}"):
        decode(data)


def test_absurdly_deep_nesting_raises_decode_error_not_recursion_error():
    with pytest.raises(DecodeError):
        decode(nested_lists(200_000))


def test_a_message_over_max_bytes_raises_decode_error_naming_both_sizes():
    data = encode({"obs": np.zeros(64, np.float32)})
    assert decode(data, max_bytes=len(data))["obs"].shape == (64,)
    with pytest.raises(DecodeError, match=f"message of {len(data)} bytes exceeds the limit of {len(data) - 1} bytes"):
        decode(data, max_bytes=len(data) - 1)
