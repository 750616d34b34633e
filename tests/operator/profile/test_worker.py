"""The profiled worker's card: one aggregated worker with the profiled role's engine, a card the
API still accepts."""

from __future__ import annotations

from pathlib import Path

from loom_operator.api.deployment_card import DeploymentCard
from loom_operator.local.cards import parse_fleet_cards
from loom_operator.profile.worker import aggregated_cards
from loom_operator.testing.cards import card_text

AUTOSCALING = "    decode: {min: 1, max: 3}\n    targets: {itlP90Ms: 50}\n"


def test_the_profiled_worker_is_one_aggregated_worker_with_the_roles_engine(
    tmp_path: Path,
) -> None:
    text = card_text("file:///nonexistent", roles={"prefill": 2, "decode": 3},
                     autoscaling=AUTOSCALING)  # fmt: skip
    head, _, tail = text.rpartition("maxNumSeqs: 8")
    path = tmp_path / "pd.yaml"
    path.write_text(head + "maxNumSeqs: 4" + tail)  # the decode role's, the last one
    cards = parse_fleet_cards(path)
    for role, seqs in (("prefill", 8), ("decode", 4)):
        one = aggregated_cards(cards, role)  # type: ignore[arg-type]
        roles = one.deployment.spec.roles.present()
        assert list(roles) == ["aggregated"]
        assert roles["aggregated"].replicas == 1
        assert roles["aggregated"].engine.max_num_seqs == seqs
        assert one.deployment.spec.autoscaling is None
        dumped = one.deployment.model_dump(mode="json", by_alias=True, exclude_none=True)
        assert DeploymentCard.model_validate(dumped) == one.deployment
    assert cards.deployment.spec.roles.decode is not None  # the cards read stay as they were
