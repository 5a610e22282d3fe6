"""Specs: construction, the checks that guard a CT, and their wire form."""

from __future__ import annotations

import numpy as np
import pytest

from flare2.core.specs import CTSpecs, Spec, check_arrays, specs_from_wire
from flare2.errors import SpecError
from flare2.wire.codec import WIRE_DTYPE_NAMES, decode, encode

CT_SPECS = CTSpecs(
    inputs={"obs": Spec((4,), "float32"), "mask": Spec((2,), "bool")},
    actions={"action": Spec((), "int64")},
    states={"h": Spec((8,), "float32")},
    rewards={"reward": Spec((), "float32")},
)


def predict_payload(rows: int = 3) -> dict:
    return {
        "inputs": {"obs": np.zeros((rows, 4), np.float32), "mask": np.ones((rows, 2), bool)},
        "states": {"h": np.zeros((rows, 8), np.float32)},
    }


# --- Spec --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [np.float32, np.dtype("float32"), "f4", "float32", "<f4"], ids=repr)
def test_a_spec_dtype_is_normalised_to_its_wire_name(dtype):
    assert Spec((4,), dtype).dtype == "float32"


def test_a_spec_shape_becomes_a_tuple_of_python_ints():
    spec = Spec([np.int64(2), 3], "int8")
    assert spec.shape == (2, 3) and all(type(dim) is int for dim in spec.shape)


def test_a_spec_defaults_to_a_float32_scalar():
    assert Spec() == Spec((), "float32")


def test_spec_zeros_has_the_spec_shape_with_optional_rows():
    spec = Spec((2, 3), "uint8")
    assert spec.zeros().shape == (2, 3) and spec.zeros().dtype == np.uint8
    assert spec.zeros(rows=4).shape == (4, 2, 3)


@pytest.mark.parametrize("name", WIRE_DTYPE_NAMES)
def test_every_wire_dtype_is_a_valid_spec_dtype(name):
    assert Spec((), name).dtype == name


@pytest.mark.parametrize("dtype", ["nope", "complex64", "object", "U3", "i4,i4", 5, [1], {"a": 1}], ids=repr)
def test_a_spec_with_a_bad_dtype_raises_spec_error_listing_the_allowed_dtypes(dtype):
    with pytest.raises(SpecError, match="Spec dtype must be one of") as caught:
        Spec((4,), dtype)
    assert repr(dtype) in str(caught.value)
    assert "float32" in str(caught.value)


@pytest.mark.parametrize("shape", [(-1,), (2, -3), (2.0,), ("4",), (2, None), (None, None)], ids=repr)
def test_a_spec_with_a_bad_dim_raises_spec_error_naming_the_shape(shape):
    with pytest.raises(SpecError, match="non-negative ints") as caught:
        Spec(shape, "float32")
    assert repr(shape) in str(caught.value)


def test_spec_error_is_a_value_error():
    assert issubclass(SpecError, ValueError)


def test_a_spec_whose_shape_is_a_bare_int_raises_spec_error():
    with pytest.raises(SpecError, match="shape"):
        Spec(4, "float32")


def test_a_spec_with_dtype_none_raises_spec_error():
    with pytest.raises(SpecError, match="dtype"):
        Spec((4,), None)


# --- check_arrays ----------------------------------------------------------------------------------


def test_check_arrays_returns_the_leading_dims():
    specs = {"obs": Spec((4,), "float32")}
    assert check_arrays("inputs", specs, {"obs": np.zeros((3, 4), np.float32)}) == (3,)
    assert check_arrays("inputs", specs, {"obs": np.zeros((2, 5, 4), np.float32)}, leading_ndim=2) == (2, 5)


def test_check_arrays_of_empty_specs_returns_the_given_leading_dims():
    assert check_arrays("states", {}, {}) is None
    assert check_arrays("states", {}, {}, leading=(3,)) == (3,)


def test_a_wrong_shape_names_the_key_the_expected_and_the_received_shape():
    with pytest.raises(SpecError) as caught:
        check_arrays("inputs", {"obs": Spec((4,), "float32")}, {"obs": np.zeros((3, 5), np.float32)})
    text = str(caught.value)
    assert "inputs['obs']" in text
    assert "(4,)" in text and "(3, 5)" in text


def test_a_wrong_dtype_names_the_key_the_expected_and_the_received_dtype():
    with pytest.raises(SpecError) as caught:
        check_arrays("inputs", {"obs": Spec((4,), "float32")}, {"obs": np.zeros((3, 4), np.float64)})
    assert str(caught.value) == "inputs['obs']: expected dtype float32, got float64"


def test_an_array_without_the_leading_dim_is_rejected():
    with pytest.raises(SpecError, match=r"inputs\['x'\]: expected shape \(N,\) \+ \(\)"):
        check_arrays("inputs", {"x": Spec((), "float32")}, {"x": np.array(1.0, np.float32)})


def test_a_missing_key_is_named():
    specs = {"obs": Spec((4,), "float32"), "mask": Spec((2,), "bool")}
    with pytest.raises(SpecError) as caught:
        check_arrays("inputs", specs, {"obs": np.zeros((3, 4), np.float32)})
    text = str(caught.value)
    assert "inputs keys do not match the specs" in text
    assert "missing ['mask']" in text
    assert "unexpected" not in text


def test_an_unexpected_key_is_named():
    with pytest.raises(SpecError, match=r"unexpected \['extra'\]"):
        check_arrays(
            "inputs", {"obs": Spec((4,), "float32")}, {"obs": np.zeros((3, 4), np.float32), "extra": np.zeros(3)}
        )


@pytest.mark.parametrize("value", [[[0.0] * 4] * 3, None, 1.0], ids=["list", "none", "float"])
def test_a_value_that_is_not_an_array_is_named_with_the_expected_dtype(value):
    with pytest.raises(SpecError, match=r"inputs\['obs'\] must be an array of dtype float32"):
        check_arrays("inputs", {"obs": Spec((4,), "float32")}, {"obs": value})


@pytest.mark.parametrize("arrays", [None, [np.zeros(3)], np.zeros(3)], ids=["none", "list", "array"])
def test_a_group_that_is_not_a_map_is_rejected(arrays):
    with pytest.raises(SpecError, match="inputs must be a map of name to array"):
        check_arrays("inputs", {"obs": Spec((), "float32")}, arrays)


def test_arrays_with_different_leading_dims_are_rejected():
    specs = {"obs": Spec((4,), "float32"), "mask": Spec((2,), "bool")}
    arrays = {"obs": np.zeros((3, 4), np.float32), "mask": np.ones((2, 2), bool)}
    with pytest.raises(
        SpecError, match=r"inputs\['mask'\]: expected leading dims \(3,\) like the other arrays, got \(2,\)"
    ):
        check_arrays("inputs", specs, arrays)


def test_a_batch_and_time_array_needs_two_leading_dims():
    with pytest.raises(SpecError, match=r"expected shape \(N, T\) \+ \(4,\)"):
        check_arrays("inputs", {"obs": Spec((4,), "float32")}, {"obs": np.zeros((5, 4), np.float32)}, leading_ndim=2)


# --- CTSpecs ---------------------------------------------------------------------------------------


def test_check_predict_returns_the_row_count():
    assert CT_SPECS.check_predict(predict_payload(rows=3)) == 3


def test_check_predict_names_the_input_key_expected_and_received_shape():
    payload = predict_payload()
    payload["inputs"]["obs"] = np.zeros((3, 5), np.float32)
    with pytest.raises(SpecError) as caught:
        CT_SPECS.check_predict(payload)
    text = str(caught.value)
    assert "inputs['obs']" in text and "(4,)" in text and "(3, 5)" in text


def test_check_predict_requires_states_with_the_same_rows_as_inputs():
    payload = predict_payload(rows=3)
    payload["states"]["h"] = np.zeros((2, 8), np.float32)
    with pytest.raises(SpecError, match=r"states\['h'\]: expected leading dims \(3,\)"):
        CT_SPECS.check_predict(payload)

    del payload["states"]
    with pytest.raises(SpecError, match=r"states keys do not match the specs.*missing \['h'\]"):
        CT_SPECS.check_predict(payload)


def test_check_predict_accepts_a_missing_states_group_when_there_are_no_state_specs():
    specs = CTSpecs(inputs={"obs": Spec((4,))}, actions={"a": Spec()}, states={}, rewards={})
    assert specs.check_predict({"inputs": {"obs": np.zeros((2, 4), np.float32)}}) == 2


def test_check_predict_rejects_a_missing_inputs_group():
    with pytest.raises(SpecError, match="inputs must be a map"):
        CT_SPECS.check_predict({"states": {}})


def test_a_predict_request_to_a_ct_without_inputs_is_a_spec_error_not_a_crash():
    specs = CTSpecs(inputs={}, actions={"action": Spec((), "int64")}, states={}, rewards={})
    with pytest.raises(SpecError, match="counts its rows by its inputs"):
        specs.check_predict({"inputs": {}})


# --- wire form -------------------------------------------------------------------------------------


def test_a_spec_has_a_plain_wire_form():
    assert Spec((2, 3), "uint8").to_wire() == {"shape": [2, 3], "dtype": "uint8"}


def test_ct_specs_survive_the_wire():
    back = CTSpecs.from_wire(decode(encode(CT_SPECS.to_wire())))
    assert back == CT_SPECS


def test_ct_specs_with_empty_groups_survive_the_wire():
    specs = CTSpecs(inputs={"obs": Spec()}, actions={"a": Spec((), "int64")}, states={}, rewards={})
    assert CTSpecs.from_wire(decode(encode(specs.to_wire()))) == specs


@pytest.mark.parametrize(
    "value, expected",
    [
        (None, "CT specs are a map, got NoneType"),
        ([1, 2], "CT specs are a map, got list"),
        ({"inputs": {}, "actions": {}, "states": {}}, "specs are a map of name to spec, got NoneType"),
        ({**CT_SPECS.to_wire(), "inputs": [["obs", {"shape": [4]}]]}, "specs are a map of name to spec, got list"),
        ({**CT_SPECS.to_wire(), "inputs": {"obs": [4]}}, "a spec is a map with 'shape' and 'dtype'"),
        ({**CT_SPECS.to_wire(), "inputs": {"obs": {"shape": 4, "dtype": "float32"}}}, "a spec is a map with 'shape'"),
        ({**CT_SPECS.to_wire(), "inputs": {"obs": {"shape": [-4], "dtype": "float32"}}}, "non-negative ints"),
        ({**CT_SPECS.to_wire(), "inputs": {"obs": {"shape": ["4"], "dtype": "float32"}}}, "non-negative ints"),
        ({**CT_SPECS.to_wire(), "inputs": {"obs": {"shape": [4], "dtype": "complex64"}}}, "Spec dtype must be one of"),
        (
            {**CT_SPECS.to_wire(), "inputs": {"obs": {"shape": [4], "dtype": 7}}},
            "a spec is a map with .shape. and .dtype.",
        ),
    ],
    ids=[
        "none",
        "list",
        "missing-group",
        "group-list",
        "spec-list",
        "shape-int",
        "negative-dim",
        "str-dim",
        "bad-dtype",
        "int-dtype",
    ],
)
def test_malformed_wire_specs_raise_spec_error(value, expected):
    with pytest.raises(SpecError, match=expected):
        CTSpecs.from_wire(value)


def test_a_wire_spec_without_a_dtype_is_rejected():
    with pytest.raises(SpecError, match="dtype"):
        specs_from_wire({"obs": {"shape": [4]}})
