"""Roles: parallel layouts, the role set, HiSparse placement, block sizes, GPUs, quantities."""

from __future__ import annotations

import re
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from loom_operator.api import Parallelism, Role, Roles
from loom_runtime.card import CardError
from loom_runtime.card.load import parse_card


def _problems(model: type[Any], data: dict[str, Any]) -> list[tuple[str, str]]:
    with pytest.raises(CardError) as info:
        parse_card(model, data)
    return [(e.path, e.code) for e in info.value.errors]


def test_defaults_are_one_rank_and_the_documented_engine() -> None:
    role = parse_card(Role, {})
    assert role.replicas == 1
    assert role.parallelism.ranks == 1
    assert (role.engine.block_size, role.engine.max_num_seqs) == (16, 64)
    assert role.engine.max_num_batched_tokens == 2048
    assert role.engine.max_model_len is None and role.kv_offload is None


def test_reference_prefill_layout_is_valid() -> None:
    par = parse_card(Parallelism, {"dp": 1, "tp": 1, "pcp": 8, "dcp": 8, "ep": 8})
    assert par.ranks == 8


def test_reference_decode_layout_is_valid() -> None:
    assert parse_card(Parallelism, {"dp": 8, "ep": 8}).ranks == 8


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        ({"dp": 2, "pcp": 2}, [("pcp", "pcp_with_dp")]),
        ({"tp": 2, "pcp": 2, "dcp": 3}, [("dcp", "dcp_not_divisor")]),
        ({"dp": 2, "tp": 2, "ep": 3}, [("ep", "ep_not_divisor")]),
        ({"cpKvInterleave": 4}, [("cpKvInterleave", "interleave_without_cp")]),
        (
            {"dp": 2, "pcp": 3, "dcp": 2, "ep": 4},
            [("pcp", "pcp_with_dp"), ("dcp", "dcp_not_divisor"), ("ep", "ep_not_divisor")],
        ),
    ],
)
def test_parallelism_rules(data: dict[str, int], expected: list[tuple[str, str]]) -> None:
    assert _problems(Parallelism, data) == expected


@given(
    dp=st.integers(1, 8),
    tp=st.integers(1, 8),
    pcp=st.integers(1, 8),
    dcp=st.integers(1, 8),
    ep=st.integers(1, 16),
)
def test_parallelism_accepted_exactly_when_vllm_could_run_it(
    dp: int, tp: int, pcp: int, dcp: int, ep: int
) -> None:
    data = {"dp": dp, "tp": tp, "pcp": pcp, "dcp": dcp, "ep": ep}
    runnable = (pcp == 1 or dp == 1) and (tp * pcp) % dcp == 0 and (dp * tp * pcp) % ep == 0
    if runnable:
        assert parse_card(Parallelism, data).ranks == dp * tp * pcp
    else:
        assert _problems(Parallelism, data)


def test_interleave_must_divide_the_block_size() -> None:
    data = {"parallelism": {"pcp": 2, "dcp": 2, "cpKvInterleave": 3}, "engine": {"blockSize": 16}}
    assert _problems(Role, data) == [("parallelism.cpKvInterleave", "interleave_not_divisor")]


def test_step_budget_must_cover_every_sequence() -> None:
    data = {"engine": {"maxNumSeqs": 128, "maxNumBatchedTokens": 64}}
    assert _problems(Role, data) == [("engine.maxNumBatchedTokens", "budget_too_small")]


@pytest.mark.parametrize(("gpus", "ok"), [(0, True), (4, True), (2, False), (8, False)])
def test_gpus_are_zero_or_one_per_rank(gpus: int, ok: bool) -> None:
    data = {"parallelism": {"dp": 2, "tp": 2}, "resources": {"gpus": gpus}}
    if ok:
        assert parse_card(Role, data).resources is not None
    else:
        assert _problems(Role, data) == [("resources.gpus", "gpus_not_ranks")]


def test_quantities_accept_ints_and_kubernetes_strings() -> None:
    role = parse_card(Role, {"resources": {"cpu": 8, "memory": "64Gi"}})
    assert role.resources is not None
    assert (role.resources.cpu, role.resources.memory) == ("8", "64Gi")
    assert _problems(Role, {"resources": {"memory": "64 GB"}}) == [("resources.memory", "quantity")]


def test_host_memory_fields_use_gib_spelling() -> None:
    role = parse_card(
        Role, {"kvOffload": {"hostGiB": 512}, "hiSparse": {"hostPoolGiB": 48, "offloadGiB": 0}}
    )
    assert role.kv_offload is not None and role.kv_offload.host_gib == 512
    assert role.hi_sparse is not None and role.hi_sparse.host_pool_gib == 48
    beside = parse_card(Role, {"hiSparse": {"hostPoolGiB": 48, "offloadGiB": 16}})
    assert beside.hi_sparse is not None and beside.hi_sparse.offload_gib == 16
    assert "kvOffload.hostGib" in [p for p, _ in _problems(Role, {"kvOffload": {"hostGib": 1}})]


@pytest.mark.parametrize(
    ("roles", "expected"),
    [
        ({}, [("", "no_roles")]),
        ({"prefill": {}}, [("decode", "missing_decode")]),
        ({"aggregated": {}, "decode": {}}, [("aggregated", "aggregated_with_pd")]),
        (
            {"aggregated": {"hiSparse": {"hostPoolGiB": 1, "offloadGiB": 0}}},
            [("aggregated.hiSparse", "hisparse_not_decode")],
        ),
        (
            {"prefill": {"hiSparse": {"hostPoolGiB": 1, "offloadGiB": 0}}, "decode": {}},
            [("prefill.hiSparse", "hisparse_not_decode")],
        ),
        (
            {"prefill": {"engine": {"blockSize": 64}}, "decode": {}},
            [("decode.engine.blockSize", "block_size_mismatch")],
        ),
    ],
)
def test_role_set_rules(roles: dict[str, Any], expected: list[tuple[str, str]]) -> None:
    assert _problems(Roles, roles) == expected


def test_valid_role_sets_list_their_roles_in_order() -> None:
    pd = parse_card(
        Roles, {"decode": {"hiSparse": {"hostPoolGiB": 48, "offloadGiB": 16}}, "prefill": {}}
    )
    assert list(pd.present()) == ["prefill", "decode"]
    assert list(parse_card(Roles, {"aggregated": {}}).present()) == ["aggregated"]
    assert list(parse_card(Roles, {"decode": {}}).present()) == ["decode"]


def test_role_set_rules_run_despite_a_type_error_inside_a_role() -> None:
    roles = {"prefill": {"replicas": "one"}, "aggregated": {}}
    assert _problems(Roles, roles) == [
        ("prefill.replicas", "int_type"),
        ("decode", "missing_decode"),
        ("aggregated", "aggregated_with_pd"),
    ]


def test_hisparse_offload_and_kv_offload_are_one_tier_set_once() -> None:
    both = {"kvOffload": {"hostGiB": 512}, "hiSparse": {"hostPoolGiB": 48, "offloadGiB": 16}}
    assert _problems(Role, both) == [("hiSparse.offloadGiB", "two_offload_tiers")]
    with pytest.raises(CardError, match=r"offloadGiB \(16\) and kvOffload.hostGiB \(512\)"):
        parse_card(Role, both)


def test_prefix_caching_is_on_by_default_and_a_role_can_turn_it_off() -> None:
    assert parse_card(Role, {}).engine.prefix_caching is True
    role = parse_card(Role, {"engine": {"prefixCaching": False}})
    assert role.engine.prefix_caching is False
    dumped = role.model_dump(by_alias=True, mode="json", exclude_none=True)
    assert dumped["engine"]["prefixCaching"] is False
    assert parse_card(Role, dumped) == role
    assert _problems(Role, {"engine": {"prefixCaching": "no"}}) == [
        ("engine.prefixCaching", "bool_type")
    ]


@pytest.mark.parametrize(
    ("data", "names"),
    [
        ({"kvOffload": {"hostGiB": 2}}, "kvOffload.hostGiB (2)"),
        ({"hiSparse": {"hostPoolGiB": 48, "offloadGiB": 16}}, "hiSparse.offloadGiB (16)"),
    ],
)
def test_a_cpu_offload_tier_needs_prefix_caching(data: dict[str, Any], names: str) -> None:
    off = {**data, "engine": {"prefixCaching": False}}
    assert _problems(Role, off) == [("engine.prefixCaching", "offload_without_prefix_caching")]
    with pytest.raises(CardError, match=rf"prefixCaching is false, but {re.escape(names)}"):
        parse_card(Role, off)
    assert parse_card(Role, data).engine.prefix_caching  # with caching on: accepted


def test_hisparse_without_an_offload_tier_runs_without_prefix_caching() -> None:
    data = {"hiSparse": {"hostPoolGiB": 48, "offloadGiB": 0}, "engine": {"prefixCaching": False}}
    assert parse_card(Role, data).engine.prefix_caching is False
