from loom_operator.control.probe import metric_value


def test_metric_value_reads_the_named_sample_only() -> None:
    text = (
        "# HELP loom:kv_leases x\n"
        'loom:kv_leases_total{model_name="tiny"} 9.0\n'
        'loom:kv_leases{model_name="tiny"} 3.0\n'
        "loom:kv_free_blocks 12\n"
    )
    assert metric_value(text, "loom:kv_leases") == 3.0
    assert metric_value(text, "loom:kv_free_blocks") == 12.0
    assert metric_value(text, "loom:missing") is None
