"""The DeploymentCard model and CRD generation.

Pure schema code; imports nothing that talks to a cluster.
"""

from loom_operator.api.crd import CARD_KINDS, crd_files, crd_manifest
from loom_operator.api.deployment_card import DeploymentCard, DeploymentCardSpec
from loom_operator.api.documents import CardSet, load_documents, parse_documents
from loom_operator.api.roles import (
    ROLE_NAMES,
    EngineSection,
    HiSparse,
    KvOffload,
    MtpSection,
    Parallelism,
    Resources,
    Role,
    RoleName,
    Roles,
)
from loom_operator.api.status import DeploymentCardStatus, RoleStatus, WeightSyncStatus
from loom_runtime.card.serving import (
    Disaggregation,
    Failover,
    Hotspot,
    PrefixCaching,
    Router,
    Scorers,
    SessionAffinity,
    WeightSync,
)

__all__ = [
    "CARD_KINDS",
    "ROLE_NAMES",
    "CardSet",
    "DeploymentCard",
    "DeploymentCardSpec",
    "DeploymentCardStatus",
    "Disaggregation",
    "EngineSection",
    "Failover",
    "HiSparse",
    "Hotspot",
    "KvOffload",
    "MtpSection",
    "Parallelism",
    "PrefixCaching",
    "Resources",
    "Role",
    "RoleName",
    "RoleStatus",
    "Roles",
    "Router",
    "Scorers",
    "SessionAffinity",
    "WeightSync",
    "WeightSyncStatus",
    "crd_files",
    "crd_manifest",
    "load_documents",
    "parse_documents",
]
