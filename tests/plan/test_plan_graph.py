import pytest

from gpuplan.plan.engine.graph import GraphError, Rule, build_graph, rule_order
from gpuplan.plan.rules import ALL_RULES


def noop(ctx):
    pass


def test_the_shipped_rules_form_a_dag_with_one_writer_per_key():
    g = build_graph(ALL_RULES)
    order = [r.id for r in rule_order(ALL_RULES)]
    assert len(order) == len(ALL_RULES)
    # memory.fit must run after precision and attention, and before what reads its solution.
    assert order.index("precision.mixed") < order.index("memory.fit")
    assert order.index("attention.implementation") < order.index("memory.fit")
    assert order.index("memory.fit") < order.index("batch.split")
    assert order.index("memory.fit") < order.index("optimizer.select")
    assert g.nodes["training.optim"]["kind"] == "setting"


def test_two_writers_of_one_key_is_an_error():
    rules = [Rule("a", (), ("training.fp16",), noop), Rule("b", (), ("training.fp16",), noop)]
    with pytest.raises(GraphError, match="both write training.fp16"):
        build_graph(rules)


def test_a_cycle_is_an_error():
    rules = [Rule("a", ("y",), ("x",), noop), Rule("b", ("x",), ("y",), noop)]
    with pytest.raises(GraphError, match="cycle"):
        build_graph(rules)


def test_reading_the_spec_value_of_what_a_rule_writes_is_not_a_cycle():
    rules = [Rule("a", ("spec:x",), ("x",), noop), Rule("b", ("x",), ("y",), noop)]
    assert [r.id for r in rule_order(rules)] == ["a", "b"]


def test_writing_a_spec_node_is_an_error():
    with pytest.raises(GraphError, match="spec values are inputs"):
        build_graph([Rule("a", (), ("spec:x",), noop)])


def test_every_rule_has_an_id_and_doc():
    ids = [r.id for r in ALL_RULES]
    assert len(ids) == len(set(ids))
    assert all(r.doc for r in ALL_RULES)


def test_every_rule_lives_in_the_module_its_id_names():
    for rule in ALL_RULES:
        topic = rule.id.split(".")[0]
        assert rule.apply.__module__ == f"gpuplan.plan.rules.{topic}", rule.id
        assert all(x.split(".")[0] == topic for x in rule.explains), rule.id


def test_every_change_of_every_shipped_spec_names_a_rule_a_reader_can_find(shipped_plans):
    from gpuplan.plan.rules import find_rule

    seen = set()
    for plan in shipped_plans.values():
        for change in plan.changes:
            rule = find_rule(change.rule)
            assert change.key in rule.writes, (change.rule, change.key)
            seen.add(change.rule)
    assert {"batch.split", "schedule.warmup", "precision.mixed"} <= seen
    with pytest.raises(KeyError, match="no rule 'fit.solution'"):
        find_rule("fit.solution")


def test_solver_nodes_cannot_be_mistaken_for_spec_keys():
    g = build_graph(ALL_RULES)
    internal = [n for n in g.nodes if g.nodes[n]["kind"] == "internal"]
    assert sorted(internal) == [
        "internal:fit.method",
        "internal:fit.no_fit",
        "internal:fit.problem",
        "internal:fit.solution",
        "internal:lora.count",
        "internal:quantization.compute",
        "internal:vision.image_plan",
    ]
    assert all(":" not in n for n in g.nodes if g.nodes[n]["kind"] == "setting")


def test_light_order_is_networkx_lexicographic_order():
    import networkx as nx

    g = build_graph(ALL_RULES)
    expected = [g.nodes[n]["rule"].id for n in nx.lexicographical_topological_sort(g) if g.nodes[n]["kind"] == "rule"]
    assert [r.id for r in rule_order(ALL_RULES)] == expected


@pytest.mark.parametrize(
    "rules, message",
    [
        ([Rule("a", ("y",), ("x",), noop), Rule("b", ("x",), ("y",), noop)], "rule cycle"),
        ([Rule("a", (), ("x",), noop), Rule("b", (), ("x",), noop)], "both write x"),
    ],
)
def test_rule_order_reports_what_build_graph_reports(rules, message):
    with pytest.raises(GraphError, match=message):
        rule_order(rules)


def test_planning_does_not_import_networkx():
    import subprocess
    import sys

    code = (
        "import sys; from gpuplan.cli import main; main(['plan', 'specs/tiny.toml', '--json']);"
        "assert 'networkx' not in sys.modules, 'networkx imported'"
    )
    from pathlib import Path

    subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, cwd=Path(__file__).resolve().parents[2])
