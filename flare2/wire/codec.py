"""msgpack codec for nested plain data with numpy arrays.

What travels: dicts with str keys, lists, str, bytes, int, float, bool, None
and numpy arrays of bool / integer / float dtypes (a ``Ragged`` goes as the
map of its two arrays, which the specs read back). An array travels as a
msgpack ext value: one byte of dtype code, one byte of ndim, the dims as
little-endian uint32, then the raw little-endian bytes. Nothing is pickled,
and nothing decoded is trusted: dtype codes come from a fixed table, the byte
count must match the shape exactly, nesting is bounded, and any other type
(msgpack timestamps, unknown ext codes) is rejected with a DecodeError.

On a local agent's predict stream a large array may instead travel as a
reference into shared memory (ext codes 2 and 3, ``flare2.wire.shared_arrays``),
decoded only with that stream's reader: anywhere else it is an unknown ext code.
"""

from __future__ import annotations

import functools
import struct
import sys
from typing import Any

import msgpack
import numpy as np

from flare2.errors import DecodeError, EncodeError
from flare2.wire.ragged import Ragged
from flare2.wire.shared_arrays import (
    SHARED_ARRAY_EXT_CODE,
    SHARED_VIEW_EXT_CODE,
    SharedArraysReader,
    SharedArraysWriter,
)

ARRAY_EXT_CODE = 1
MAX_NDIM = 32
MAX_DEPTH = 32
DEFAULT_MAX_BYTES = 16 * 1024 * 1024

# The wire order of this table is part of the protocol: append only.
_WIRE_DTYPES = tuple(
    np.dtype(name)
    for name in (
        "bool",
        "int8",
        "int16",
        "int32",
        "int64",
        "uint8",
        "uint16",
        "uint32",
        "uint64",
        "float16",
        "float32",
        "float64",
    )
)
_CODE_OF_DTYPE = {dtype: code for code, dtype in enumerate(_WIRE_DTYPES)}
_NATIVE_IS_LITTLE = sys.byteorder == "little"
_LITTLE_DTYPES = tuple(dtype.newbyteorder("<") for dtype in _WIRE_DTYPES)
_SHAPE_FORMATS = tuple(f"<{ndim}I" for ndim in range(MAX_NDIM + 1))
_HEAD_FORMATS = tuple(f"<BB{ndim}I" for ndim in range(MAX_NDIM + 1))
WIRE_DTYPE_NAMES = tuple(dtype.name for dtype in _WIRE_DTYPES)


def _wire_array(array: np.ndarray) -> tuple[np.ndarray, bytes]:
    """``array`` in its wire dtype, and its wire head: one byte of dtype code, one of ndim, the dims."""
    # Arrays of the machine's own little-endian wire dtypes are looked up as they are (the common case);
    # others are matched by name and converted.
    code = _CODE_OF_DTYPE.get(array.dtype) if _NATIVE_IS_LITTLE else None
    if code is None:
        dtype = array.dtype.newbyteorder("=") if array.dtype.byteorder == ">" else array.dtype
        code = _CODE_OF_DTYPE.get(np.dtype(dtype.name)) if dtype.kind in "biuf" else None
        if code is None:
            raise EncodeError(
                f"cannot send an array of dtype {array.dtype}: flare2 sends only {', '.join(WIRE_DTYPE_NAMES)}"
            )
        array = np.ascontiguousarray(array, dtype=_WIRE_DTYPES[code].newbyteorder("<"))
    if array.ndim > MAX_NDIM:
        raise EncodeError(f"cannot send an array with {array.ndim} dimensions (at most {MAX_NDIM})")
    try:
        head = struct.pack(_HEAD_FORMATS[array.ndim], code, array.ndim, *array.shape)
    except struct.error:
        raise EncodeError(f"cannot send an array of shape {array.shape}: each dimension must be below 2**32") from None
    return array, head


def _array_to_ext(array: np.ndarray, shared: SharedArraysWriter | None = None) -> msgpack.ExtType:
    array, head = _wire_array(array)
    if shared is not None:
        reference = shared.place(array, head)
        if reference is not None:
            return reference
    # tobytes() writes C order whatever the layout.
    return msgpack.ExtType(ARRAY_EXT_CODE, head + array.tobytes())


def _default(value: Any, shared: SharedArraysWriter | None = None) -> Any:
    if isinstance(value, np.ndarray):
        return _array_to_ext(value, shared)
    if isinstance(value, np.generic):
        return _array_to_ext(np.asarray(value))
    if isinstance(value, Ragged):
        return value.to_wire()
    if isinstance(value, tuple):
        return list(value)
    if isinstance(value, int):
        raise EncodeError(f"cannot send the int {value}: it is outside the 64-bit range")
    raise EncodeError(
        f"cannot send a value of type {type(value).__name__}: flare2 messages carry dicts with str keys, "
        "lists, str, bytes, int, float, bool, None, numpy arrays and flare2.Ragged"
    )


def encode(value: Any, *, shared: SharedArraysWriter | None = None) -> bytes:
    """Encode plain data with numpy arrays into msgpack bytes; with ``shared``, large arrays go into its block and
    the bytes hold references to them (``flare2.wire.shared_arrays``)."""
    _check_structure(value, 0, EncodeError, leaves=False)
    if shared is None:
        return _pack(value, _default)
    shared.begin()
    try:
        return _pack(value, functools.partial(_default, shared=shared))
    except BaseException:
        shared.cancel()
        raise


def _pack(value: Any, default: Any) -> bytes:
    try:
        return msgpack.packb(value, default=default, use_bin_type=True, strict_types=False)
    except EncodeError:
        raise
    except (TypeError, ValueError, OverflowError) as exc:
        raise EncodeError(f"cannot encode message: {exc}") from exc


def _ext_to_array(code: int, data: bytes, shared: SharedArraysReader | None = None) -> np.ndarray:
    if code != ARRAY_EXT_CODE and (code not in (SHARED_ARRAY_EXT_CODE, SHARED_VIEW_EXT_CODE) or shared is None):
        raise DecodeError(f"unknown msgpack ext type {code}")
    if len(data) < 2:
        raise DecodeError("array header is truncated")
    dtype_code, ndim = data[0], data[1]
    if dtype_code >= len(_WIRE_DTYPES):
        raise DecodeError(f"unknown array dtype code {dtype_code}")
    if ndim > MAX_NDIM:
        raise DecodeError(f"array has {ndim} dimensions, at most {MAX_NDIM} are allowed")
    head_len = 2 + 4 * ndim
    if len(data) < head_len:
        raise DecodeError("array shape is truncated")
    shape = struct.unpack_from(_SHAPE_FORMATS[ndim], data, 2)
    dtype = _LITTLE_DTYPES[dtype_code]
    expected = dtype.itemsize
    for dim in shape:
        expected *= dim
    if code == SHARED_ARRAY_EXT_CODE:
        assert shared is not None  # checked above
        return shared.array(data[head_len:], dtype, shape, expected)
    if code == SHARED_VIEW_EXT_CODE:
        assert shared is not None  # checked above
        return shared.view(data[head_len:], dtype, shape, expected)
    if len(data) - head_len != expected:
        raise DecodeError(
            f"array of shape {shape} and dtype {dtype.name} needs {expected} bytes, got {len(data) - head_len}"
        )
    return np.frombuffer(data, dtype=dtype, offset=head_len).reshape(shape)


_PLAIN_TYPES = (str, bytes, int, float, bool, type(None), np.ndarray)


def _check_structure(value: Any, depth: int, error: type[Exception], leaves: bool) -> None:
    """Str map keys and bounded nesting (and, when ``leaves``, only plain leaf types), else ``error``.

    encode() runs it too (without leaf checks, which msgpack does), so a
    sender learns of a message its peer would refuse.
    """
    if depth > MAX_DEPTH:
        raise error(f"message nests deeper than {MAX_DEPTH} levels")
    if isinstance(value, dict):
        for key, item in value.items():
            if not isinstance(key, str):
                raise error(f"map key {key!r} is not a str")
            _check_structure(item, depth + 1, error, leaves)
    elif isinstance(value, (list, tuple)):
        for item in value:
            _check_structure(item, depth + 1, error, leaves)
    elif leaves and not isinstance(value, _PLAIN_TYPES):
        raise error(f"values of type {type(value).__name__} are not accepted")


def decode(data: bytes, *, max_bytes: int = DEFAULT_MAX_BYTES, shared: SharedArraysReader | None = None) -> Any:
    """Decode bytes made by :func:`encode`; raise DecodeError for anything else. References to shared arrays are
    taken only with the ``shared`` reader of the stream they came on, as views of its block (``protocol.unpack``
    says until when)."""
    if len(data) > max_bytes:
        raise DecodeError(f"message of {len(data)} bytes exceeds the limit of {max_bytes} bytes")
    if shared is not None:
        shared.begin()
    try:
        value = msgpack.unpackb(
            data,
            raw=False,
            strict_map_key=True,
            ext_hook=_ext_to_array if shared is None else functools.partial(_ext_to_array, shared=shared),
            use_list=True,
        )
    except DecodeError:
        raise
    except Exception as exc:  # msgpack raises several unrelated types for bad input
        raise DecodeError(f"not a valid msgpack message ({type(exc).__name__}: {exc})") from None
    _check_structure(value, 0, DecodeError, leaves=True)
    return value
