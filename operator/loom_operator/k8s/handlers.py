"""The kopf handlers, one concern each: ModelCards are validated; a DeploymentCard is rendered
and applied when it is created or its spec changes (reconcile.py); every card this replica may
act on gets a loop (card_loop.py) that keeps its status true to what runs and corrects drift,
started and stopped by the card supervisor (card_supervisor.py) this module starts with kopf.

Owns what kopf calls: startup and cleanup, the card and ModelCard handlers, the indexes of both
kinds; decisions are the renderers', status.py's, round_inputs.py's, drift.py's and the
supervisor's. Handlers find their settings, client, wake-ups, supervisor and record of applies
in kopf's `memo` (no module-level state).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Iterator, Mapping
from typing import Any

import kopf
from aiohttp import web

from loom_operator.api.documents import parse_documents
from loom_operator.control.push_api import CARD_PREFIX, push_app, start_push_api
from loom_operator.k8s.card_loop import CARDS_INDEX, run_card
from loom_operator.k8s.card_supervisor import CardRef, CardSupervisor, shards_of
from loom_operator.k8s.kube import Kube, object_path
from loom_operator.k8s.labels import GROUP, VERSION
from loom_operator.k8s.pushes import PushDesks
from loom_operator.k8s.reconcile import document, problems, reconcile, validity, write_status
from loom_operator.k8s.wakers import CardWakers
from loom_operator.k8s.watched import card_cache, items
from loom_runtime.card.errors import CardError

Obj = Mapping[str, Any]


def _write(patch: kopf.Patch, fields: Mapping[str, Any]) -> None:
    for key, value in fields.items():
        patch.status[key] = value


@kopf.on.startup()
def configure(settings: kopf.OperatorSettings, **_: Any) -> None:
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=GROUP)
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(prefix=GROUP)
    settings.posting.level = logging.WARNING
    settings.watching.server_timeout = 60


def _all(index: Mapping[Any, Any] | None) -> Iterator[Obj]:
    """Every card an index of cards holds."""
    for store in list((index or {}).values()):
        yield from store


@kopf.on.startup()
async def supervise_cards(memo: kopf.Memo, **kwargs: Any) -> None:
    """Start the card supervisor over kopf's indexes (the live ones; kopf fills them as its
    watches start). A sharded replica's supervisor sweeps when the shards it holds change: the
    cards it took start their loops at once, the cards it gave back stop theirs."""
    indexes = {name: i for name, i in kwargs.items() if isinstance(i, kopf.Index)}

    async def run(ref: CardRef, stop: asyncio.Event) -> None:
        await run_card(ref, memo, indexes, stop)

    shards = shards_of(memo)
    supervisor = CardSupervisor(lambda: _all(indexes.get(CARDS_INDEX)), shards, run)
    memo.supervisor = supervisor
    supervisor.start()
    if shards.shards is not None:
        loop = asyncio.get_running_loop()
        wakers: CardWakers | None = getattr(memo, "wakers", None)

        def changed() -> None:
            supervisor.poke()
            if wakers is not None:
                wakers.wake_all()

        def wake() -> None:  # from the shard keeper's thread
            with contextlib.suppress(RuntimeError):  # kopf's loop closed: the operator stops
                loop.call_soon_threadsafe(changed)

        shards.on_change(wake)


@kopf.on.startup()
async def serve_pushes(memo: kopf.Memo, **kwargs: Any) -> None:
    """With `--push-port`: the weight-push API, a desk per card whose loop runs here (a sharded
    replica forwards the others' to the replica that holds their shard)."""
    desks: PushDesks | None = getattr(memo, "push_desks", None)
    if desks is not None:
        cards = kwargs.get(CARDS_INDEX)

        def uid_of(namespace: str, name: str) -> str | None:
            found = items(cards, (namespace, name))
            return str(found[0]["metadata"]["uid"]) if found else None

        desks.uid_of = uid_of
        app = push_app(desks.desk, CARD_PREFIX)
        memo.push_api = await start_push_api(app, memo.push_address, memo.push_port)


@kopf.on.cleanup()
async def stop_cards(memo: kopf.Memo, **_: Any) -> None:
    """Every card loop ends (its fleet's connections closed) before the operator exits."""
    supervisor: CardSupervisor | None = getattr(memo, "supervisor", None)
    if supervisor is not None:
        await supervisor.close()
    api: web.AppRunner | None = getattr(memo, "push_api", None)
    if api is not None:
        await api.cleanup()


@kopf.on.cleanup()
def release_stop_flag(memo: kopf.Memo, **_: Any) -> None:
    """kopf waits for its stop flag in a worker thread; when it stops for another reason (a
    SIGTERM), set the flag so that thread ends and the process exits."""
    flag = getattr(memo, "stop_flag", None)
    if flag is not None:
        flag.set()


@kopf.on.resume(GROUP, VERSION, "modelcards")
@kopf.on.create(GROUP, VERSION, "modelcards")
@kopf.on.update(GROUP, VERSION, "modelcards", field="spec")
def validate_model_card(body: kopf.Body, patch: kopf.Patch, memo: kopf.Memo, **kwargs: Any) -> None:
    """A ModelCard's own rules (every error with its field path) into `Valid`; the
    DeploymentCards that serve it are rendered again."""
    try:
        parse_documents([(0, document(body))], str(body.metadata.name))
        problem = None
    except CardError as exc:
        problem = problems(exc)
    shards = shards_of(memo)
    with shards.acting(str(body.metadata.uid)) as mine:
        if mine:
            _write(patch, validity(body, problem))
    kube: Kube = memo.kube
    namespace = str(body.metadata.namespace)
    for card in kube.get(object_path("DeploymentCard", namespace))["items"]:
        if card["spec"].get("modelCard") != body.metadata.name:
            continue
        with shards.acting(str(card["metadata"]["uid"])) as mine:
            if mine:
                write_status(kube, card, reconcile(card, memo, card_cache(kwargs, card)))


@kopf.on.resume(GROUP, VERSION, "deploymentcards")
@kopf.on.create(GROUP, VERSION, "deploymentcards")
@kopf.on.update(GROUP, VERSION, "deploymentcards", field="spec")
def apply_deployment_card(
    body: kopf.Body, patch: kopf.Patch, memo: kopf.Memo, **kwargs: Any
) -> None:
    with shards_of(memo).acting(str(body.metadata.uid)) as mine:
        if mine:  # else the replica holding its shard applies it (its card loop, on taking it)
            _write(patch, reconcile(body, memo, card_cache(kwargs, body)) or {})


@kopf.index(GROUP, VERSION, "modelcards")
def model_cards(body: kopf.Body, **_: Any) -> dict[tuple[str, str], Obj]:
    """Every ModelCard by (namespace, name), kept current by kopf's watch: a fleet round reads
    its ModelCard from here instead of asking the API server each time."""
    return {(str(body.metadata.namespace), str(body.metadata.name)): document(body)}


@kopf.index(GROUP, VERSION, "deploymentcards")
def deployment_cards(body: kopf.Body, **_: Any) -> dict[tuple[str, str], Obj]:
    """Every DeploymentCard by (namespace, name) as kopf's watch last saw it: what the card
    supervisor runs loops for, and what each loop reads."""
    return {(str(body.metadata.namespace), str(body.metadata.name)): dict(body)}


@kopf.on.event(GROUP, VERSION, "deploymentcards")
async def track_card(body: kopf.Body, memo: kopf.Memo, type: str | None, **_: Any) -> None:
    """A card appeared or went (or is being deleted): the supervisor sweeps. Any change of the
    card (its generation, its phase) is for its loop's next look to judge."""
    supervisor: CardSupervisor | None = getattr(memo, "supervisor", None)
    if supervisor is not None and (type != "MODIFIED" or body.metadata.get("deletionTimestamp")):
        supervisor.indexed()
    wakers: CardWakers | None = getattr(memo, "wakers", None)
    if wakers is not None:
        wakers.wake((str(body.metadata.namespace), str(body.metadata.name)))
